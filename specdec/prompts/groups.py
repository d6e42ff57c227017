"""Choosing prompts by task group: every helper keeps groups in order of first appearance."""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Sequence, TypeVar

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


def select_per_group(items: Sequence[T], per_group: int | None) -> list[T]:
    """The first ``per_group`` items of each group, groups in order of first appearance (``None``: all)."""
    if per_group is None:
        return list(items)
    if per_group < 1:
        raise ValueError(f"per_group must be >= 1 (or None for all), got {per_group}")
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
