"""Choosing prompts by task group: every helper keeps groups in order of first appearance.

A set without groups (no row names one) has each prompt as its own group for :func:`select_per_group`.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Sequence, TypeVar

from specdec.prompts.schema import DEFAULT_GROUP

T = TypeVar("T")  # anything with a ``group`` attribute: Prompt, PromptRecord


def by_group(items: Iterable[T]) -> dict[Hashable, list[T]]:
    """``items`` bucketed by their ``group``, groups in order of first appearance (dicts keep insertion order)."""
    groups: dict[Any, list[T]] = {}
    for item in items:
        groups.setdefault(item.group, []).append(item)  # type: ignore[attr-defined]
    return groups


def group_order(items: Iterable[Any]) -> list[Any]:
    """Group names in order of first appearance."""
    return list(by_group(items))


def ungrouped(items: Iterable[Any]) -> bool:
    """Whether ``items`` come from a set without groups: no item names one (each group is ``None``, as a
    :class:`~specdec.prompts.schema.PromptRecord` without one, or :data:`~specdec.prompts.schema.DEFAULT_GROUP`,
    as a :class:`~specdec.prompts.schema.Prompt` without one)."""
    return all(item.group in (None, DEFAULT_GROUP) for item in items)


def select_per_group(items: Sequence[T], per_group: int | None) -> list[T]:
    """The first ``per_group`` items of each group, groups in order of first appearance (``None``: all).

    In a set without groups (:func:`ungrouped`) each item counts as its own group, so any ``per_group``
    keeps every item: a file of two prompts without a ``category`` runs both under ``--per-group 1``.
    """
    if per_group is None:
        return list(items)
    if per_group < 1:
        raise ValueError(f"per_group must be >= 1 (or None for all), got {per_group}")
    if ungrouped(items):
        return list(items)
    return [item for bucket in by_group(items).values() for item in bucket[:per_group]]


def round_robin(items: Sequence[T], limit: int | None = None) -> list[T]:
    """Items taken in turn from each group, at most ``limit``, so that a few prompts still cover
    several kinds of text."""
    queues = [list(bucket) for bucket in by_group(items).values()]
    out: list[T] = []
    while any(queues) and (limit is None or len(out) < limit):
        for q in queues:
            if q and (limit is None or len(out) < limit):
                out.append(q.pop(0))
    return out
