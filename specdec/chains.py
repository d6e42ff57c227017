"""How many tokens to draft each step: a fixed ``k``, or an online controller.

With per-token acceptance probability ``a``, a pass that drafts ``k`` tokens commits on average
``(1 - a**(k+1)) / (1 - a)`` tokens (:func:`specdec.metrics.expected_tokens`) and costs ``draft(k) + verify(k)``.
The adaptive policy estimates
``a`` (accepted drafts over Bernoulli trials, both summed with exponential decay), the draft and verify
costs of each ``k`` (least-squares lines through measured passes: on a memory-bound CPU the verify cost
grows slowly with ``k``) and picks the ``k`` with the most expected tokens per second. ``k = 0`` is a plain
decode step (no drafts, a one-token verify pass): it is chosen when no ``k >= 1`` beats it, and drafting
is probed again after a back-off that doubles while probes keep failing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specdec.costs import chain_rate
from specdec.protocol import DraftContext, DraftPlan, Drafts, Proposer, Rows, checked

if TYPE_CHECKING:
    import torch


# Prior cost of one more token in a verify pass, in passes (memory-bound decode: a few percent).
VERIFY_SLOPE = 0.05
HISTORY_LEN = 1024  # choices kept in AdaptiveDraftLength.history
PRIOR_POINTS = 2.0  # weight of a cost line's prior slope, in points one token from the mean
OUTLIER = 5.0  # a timing above this many times the current estimate is taken at this many (a load spike, a first use)


class FixedDraftLength:
    """Always draft ``k`` tokens (fewer only where max_length leaves less room)."""

    def __init__(self, k: int) -> None:
        self.k = k

    @property
    def max_k(self) -> int:
        return self.k

    def choose(self, limit: int) -> int:
        return max(0, min(self.k, limit))

    def update(self, proposed: int, accepted: int, draft_seconds: float, verify_seconds: float,
               timings: bool = True) -> None:
        pass


def trials(proposed: int, accepted: int) -> int:
    """Bernoulli trials in a pass of ``proposed`` drafts of which the first ``accepted`` were accepted: each accepted
    draft, plus the rejected one (none when all were accepted)."""
    return accepted + (1 if accepted < proposed else 0)


def _fit(points: dict[int, float], k: int, relative_slope: float | None) -> float:
    """The cost at ``k`` of a line through measured ``{k: cost}`` points (least squares, slope >= 0).

    The slope is pulled toward a prior worth ``PRIOR_POINTS`` points one token from the mean: ``relative_slope``
    times the mean cost (verify passes), or ``None`` for a cost proportional to ``k`` (drafting). With one point the
    prior alone sets it; with two close ones (plain passes and probes of one draft: k = 0 and 1) a noisy difference
    cannot make long drafts look ruinous, nor a point measured long ago under other load."""
    n = len(points)
    mean_k = sum(points) / n
    mean_v = sum(points.values()) / n
    prior = relative_slope * mean_v if relative_slope is not None else (mean_v / mean_k if mean_k else 0.0)
    sxx = sum((p - mean_k) ** 2 for p in points)
    sxy = sum((p - mean_k) * (v - mean_v) for p, v in points.items())
    slope = max(0.0, (sxy + PRIOR_POINTS * prior) / (sxx + PRIOR_POINTS))
    return max(0.0, mean_v + slope * (k - mean_k))


@dataclass
class AdaptiveDraftLength:
    """Pick ``k`` per step to maximise expected committed tokens per second, ``k = 0`` (plain decoding) included.

    Args:
        max_k / min_k: the range searched. ``min_k = 0`` (the default) lets the policy stop drafting when no
            ``k >= 1`` pays for itself; it then drafts again, as a probe, after ``min_backoff`` plain passes.
            A probe that accepts nothing doubles the wait (up to ``max_backoff``), one that accepts something
            sets it back to ``min_backoff``, so a useless drafter costs one probe every ``max_backoff`` passes
            and a good one is found again soon.
        stale: before a probe, the evidence gathered before the pause is scaled by this, so that the probe's own
            outcome counts.
        decay: weight of the past in the estimates, per drafting pass (0.85 ~ the last seven).
        prior_acceptance / prior_weight: the acceptance assumed before any step, worth ``prior_weight`` trials.
        timed: learn the costs from wall-clock time. ``False`` (what specdec uses when a seeded
            ``generator`` is given) makes every choice a function of the accepted counts alone, so a
            seeded run draws the same ``k`` sequence, and therefore the same tokens, every time: the
            draft cost per token is then ``draft_cost_ratio`` verifier passes and a pass over ``k``
            drafts costs ``1 + VERIFY_SLOPE * k``. A timed policy uses this model until it has measured.
        draft_cost_ratio: the untimed model's cost of one draft token, in verifier passes.
    """

    max_k: int = 8
    min_k: int = 0
    decay: float = 0.85
    prior_acceptance: float = 0.7
    prior_weight: float = 1.0
    timed: bool = True
    draft_cost_ratio: float = 0.1
    min_backoff: int = 4
    max_backoff: int = 32
    stale: float = 0.5
    acceptance: float = field(init=False)
    #: measured seconds of a pass's drafting (per k >= 1) and of its verify pass (per k, 0 included): moving averages
    draft_costs: dict[int, float] = field(init=False, default_factory=dict)
    verify_costs: dict[int, float] = field(init=False, default_factory=dict)
    #: the latest choices (bounded: a long-lived server's policy must not grow without end)
    history: deque[int] = field(init=False, default_factory=lambda: deque(maxlen=HISTORY_LEN))

    def __post_init__(self) -> None:
        if not 0 <= self.min_k <= self.max_k or self.max_k < 1:
            raise ValueError(f"need 0 <= min_k <= max_k and max_k >= 1, got {self.min_k}, {self.max_k}")
        if not 0 <= self.decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")
        if not 1 <= self.min_backoff <= self.max_backoff:
            raise ValueError(f"need 1 <= min_backoff <= max_backoff, got {self.min_backoff}, {self.max_backoff}")
        # Accepted drafts and trials, decayed sums: their ratio is the pooled acceptance. (A moving average of each
        # pass's own rate underweights good passes: at a = 0.7, k = 4 it reads about 0.52, so k came out too short.)
        self._accepted = self.prior_acceptance * self.prior_weight
        self._trials = float(self.prior_weight)
        self.acceptance = self.prior_acceptance
        self._idle = 0  # plain passes chosen since the policy last drafted
        self._backoff = self.min_backoff  # plain passes before the next probe
        self._resumed = False  # the latest choice drafts after plain passes: its drafting also caught up
        self._probing = False  # the latest choice is a probe

    @property
    def draft_cost(self) -> float | None:
        """Measured seconds per draft token (``None`` before any), from the draft-cost line at ``max_k``."""
        return _fit(self.draft_costs, self.max_k, None) / self.max_k if self.draft_costs else None

    def _pass_cost(self, k: int) -> float:
        """Expected cost of a pass over ``k`` drafts: seconds when measured, else verifier passes."""
        measured = self.timed and self.verify_costs
        verify = _fit(self.verify_costs, k, VERIFY_SLOPE) if measured else 1.0 + VERIFY_SLOPE * k
        if k == 0:
            return verify  # no drafting, a one-token pass
        if self.timed and self.draft_costs:
            draft = _fit(self.draft_costs, k, None)
        else:  # the prior: draft_cost_ratio verifier passes per token, in seconds once a pass has been timed
            draft = self.draft_cost_ratio * k * (_fit(self.verify_costs, 0, VERIFY_SLOPE) if measured else 1.0)
        return draft + verify

    def rate(self, k: int) -> float:
        """Expected committed tokens per unit of cost of a pass over ``k`` drafts, at the current estimates."""
        return chain_rate(self.acceptance, k, self._pass_cost(k))

    def choose(self, limit: int) -> int:
        upper = min(self.max_k, limit)
        low = max(1, self.min_k)
        if upper < low:
            return max(0, upper)
        best = max(range(low, upper + 1), key=self.rate)
        self._probing = False
        if self.min_k > 0 or self.rate(best) > self.rate(0):  # drafting pays
            k, self._backoff = best, self.min_backoff
        elif self._idle >= self._backoff:  # probe: has the drafter become useful?
            k, self._probing = best, True
            # what was learnt before the pause is stale: the probe's own outcome weighs as much as it
            self._accepted, self._trials = self.stale * self._accepted, self.stale * self._trials
        else:
            k = 0
        self._resumed = k > 0 and self._idle > 0
        self._idle = 0 if k > 0 else self._idle + 1
        self.history.append(k)
        return k

    def update(self, proposed: int, accepted: int, draft_seconds: float, verify_seconds: float,
               timings: bool = True) -> None:
        """Learn from one pass: ``proposed`` drafts of which ``accepted`` were accepted, and what drafting and
        verifying took (``timings=False``: not representative, e.g. a call's first pass with its one-time work)."""
        timings = timings and self.timed
        if proposed <= 0:  # a plain pass (chosen, or the drafter found nothing): a one-token verify
            if timings:
                self._average(self.verify_costs, 0, verify_seconds, VERIFY_SLOPE)
            return
        self._accepted = self.decay * self._accepted + accepted
        self._trials = self.decay * self._trials + trials(proposed, accepted)
        self.acceptance = self._accepted / self._trials
        if self._probing:  # a probe that accepted something brings the next one forward; one that did not, back
            self._backoff = self.min_backoff if accepted else min(2 * self._backoff, self.max_backoff)
        if not timings:
            return
        if not self._resumed:  # after plain passes a drafter first catches up on them: not what drafting k costs
            self._average(self.draft_costs, proposed, draft_seconds, None)
        self._average(self.verify_costs, proposed, verify_seconds, VERIFY_SLOPE)

    def _average(self, costs: dict[int, float], k: int, seconds: float, relative_slope: float | None) -> None:
        if costs:  # one slow pass (another process on the CPU, a first use) must not dominate the average
            seconds = min(seconds, OUTLIER * _fit(costs, k, relative_slope))
        old = costs.get(k)
        costs[k] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds


class ChainPlan(DraftPlan):
    """A call that drafts chains: ``k`` per pass from ``policy`` (:class:`FixedDraftLength` or
    :class:`AdaptiveDraftLength`), which learns from each pass."""

    def __init__(self, policy: FixedDraftLength | AdaptiveDraftLength, rule: str = "token") -> None:
        self.policy, self.rule = policy, rule
        self.num_draft_tokens = policy.max_k
        self._passes = 0

    @classmethod
    def fixed(cls, k: int) -> "ChainPlan":
        """Always ``k`` drafts (fewer only where ``max_length`` leaves less room)."""
        return cls(FixedDraftLength(k))

    def propose(self, drafter: Proposer, rows: Rows, room: int, ctx: DraftContext) -> Drafts:
        k = self.policy.choose(room)
        return checked(drafter.propose(rows, k, ctx), drafter, rows, ctx, k, k)

    def update(self, drafts: Drafts, accepted: list[int], draft_seconds: float, verify_seconds: float,
               drafter_forwards: int, path: "torch.Tensor | None" = None) -> None:
        # the batch's shortest accepted run: how far the whole batch got (accepted: host ints, read once per pass).
        # A call's first pass does one-time work (a drafter's prompt feed, first use of buffers): not a cost of k.
        self._passes += 1
        self.policy.update(drafts.num_tokens, int(min(accepted)), draft_seconds, verify_seconds,
                           timings=self._passes > 1)
