"""Speculative-decoding metrics, defined once: pure functions over counts (torch-free, no ``evaluate``).

Every figure is pooled, total over total: an argument is either one count or an iterable of counts
(per step, per row, per generation), which is summed first. So long generations weigh more than short
ones, and a figure over several generations is never a mean of their own ratios. Without anything to
measure (a zero denominator) a figure is ``0.0``.

:class:`~specdec.stats.SpecStats` / :class:`~specdec.stats.RowStats`, the local ``evaluate`` modules
(:mod:`specdec.eval.metrics`), ``summary.json`` (:mod:`specdec.eval.report`) and ``specdec demo``
(:class:`~specdec.eval.side_by_side.Comparison`) all compute their figures here.

>>> acceptance_rate(accepted=[3, 1], proposed=[4, 4])
0.5
>>> mean_accepted_length(committed=[4, 30], verifier_passes=[2, 18])   # 34 / 20, not a mean of 4/2 and 30/18
1.7
>>> acceptance_by_position([[2, 1, 0], [1, 0]], [[2, 2, 2], [1, 1]])
[1.0, 0.3333333333333333, 0.0]
"""

from __future__ import annotations

from numbers import Number
from typing import Iterable, Sequence, Union

#: one count, or counts (per step, row or generation) to add up
Counts = Union[float, Iterable[float]]

__all__ = [
    "Counts", "acceptance_by_position", "acceptance_rate", "exact_matches", "expected_tokens",
    "mean_accepted_length", "mean_draft_length", "pool_positions", "ratio", "speedup", "throughput", "total",
]


def total(counts: Counts) -> int | float:
    """``counts`` added up (a single count is its own total)."""
    return counts if isinstance(counts, Number) else sum(counts)


def ratio(numerator: Counts, denominator: Counts) -> float:
    """Pooled ``total(numerator) / total(denominator)``; ``0.0`` where the denominator is not positive."""
    den = total(denominator)
    return total(numerator) / den if den > 0 else 0.0


def acceptance_rate(accepted: Counts, proposed: Counts) -> float:
    """Accepted draft tokens over proposed draft tokens (with trees: over the nodes the verifier scored)."""
    return ratio(accepted, proposed)


def mean_accepted_length(committed: Counts, verifier_passes: Counts) -> float:
    """Tokens committed per verifier pass (accepted drafts + the verifier's own token): 1 to ``k + 1``.

    With batches a pass counts once per row it served (a row leaves the batch when it finishes).
    """
    return ratio(committed, verifier_passes)


def mean_draft_length(proposed: Counts, verifier_passes: Counts) -> float:
    """Draft tokens proposed per verifier pass: ``k`` when fixed, less where adaptive k drafts less
    (with trees: the nodes the verifier scored per pass)."""
    return ratio(proposed, verifier_passes)


def pool_positions(accepted: Iterable[Sequence[int]],
                   proposed: Iterable[Sequence[int]]) -> tuple[list[int], list[int]]:
    """Per-position counts of several generations added element-wise: ``(accepted, proposed)`` at each
    draft position, as wide as the widest ``proposed`` list (shorter lists count 0 past their end)."""
    acc_rows, prop_rows = [list(row) for row in accepted], [list(row) for row in proposed]
    width = max((len(row) for row in prop_rows), default=0)
    acc_at, prop_at = [0] * width, [0] * width
    for acc_row, prop_row in zip(acc_rows, prop_rows):
        for i, (a, p) in enumerate(zip(acc_row, prop_row)):
            acc_at[i] += a
            prop_at[i] += p
    return acc_at, prop_at


def _nested(counts: Sequence[int] | Sequence[Sequence[int]]) -> bool:
    return bool(counts) and isinstance(counts[0], (list, tuple))


def acceptance_by_position(accepted_per_position: Sequence[int] | Sequence[Sequence[int]],
                           proposed_per_position: Sequence[int] | Sequence[Sequence[int]]) -> list[float]:
    """Acceptance rate at each draft position (with trees: each depth).

    The arguments are one generation's counts by position, or a list of such lists (one per generation,
    of any lengths), pooled element-wise by :func:`pool_positions` first.
    """
    if _nested(accepted_per_position) or _nested(proposed_per_position):
        accepted_per_position, proposed_per_position = pool_positions(accepted_per_position, proposed_per_position)
    return [ratio(a, p) for a, p in zip(accepted_per_position, proposed_per_position)]


def throughput(tokens: Counts, seconds: Counts) -> float:
    """Pooled tokens per second: total tokens over total seconds (``0.0`` without time)."""
    return ratio(tokens, seconds)


def speedup(tokens: Counts, seconds: Counts, baseline_tokens: Counts, baseline_seconds: Counts) -> float:
    """Throughput over a baseline's on the same prompts (``0.0`` if the baseline has no throughput)."""
    return ratio(throughput(tokens, seconds), throughput(baseline_tokens, baseline_seconds))


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens committed by a verifier pass over ``k`` drafts when each draft is accepted with probability
    ``a`` (independently, until the first rejection), the verifier's own token included: ``1 + a + ... + a**k =
    (1 - a**(k+1)) / (1 - a)``, from 1 (``a = 0``) to ``k + 1`` (``a = 1``). The model behind adaptive ``k``, tree
    ``auto``'s chain length, the simulated drafter's profiles and ``quant-report``'s estimated speedup.

    >>> expected_tokens(0.5, 2)
    1.75
    """
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def exact_matches(predictions: Iterable[Sequence[int]], references: Iterable[Sequence[int]]) -> int:
    """How many generations equal their reference token for token (token exact match is this over the count)."""
    return sum(list(p) == list(r) for p, r in zip(predictions, references))
