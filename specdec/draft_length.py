"""How many tokens to draft each step: a fixed ``k``, or an online controller.

With per-token acceptance probability ``a``, a pass that drafts ``k`` tokens commits on average
``(1 - a**(k+1)) / (1 - a)`` tokens and costs ``k * draft_cost + verify_cost(k)``. The adaptive
policy estimates ``a`` (exponential moving average over steps), the draft cost per token and the
verify cost per ``k`` (a least-squares line through measured passes: on a memory-bound CPU it
grows slowly with ``k``) and picks the ``k`` with the most expected tokens per second.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specdec.protocol import DraftContext, DraftPlan, Drafts, Proposer, Rows

if TYPE_CHECKING:
    import torch


# Prior cost of one more token in a verify pass, in passes (memory-bound decode: a few percent).
VERIFY_SLOPE = 0.05
HISTORY_LEN = 1024  # choices kept in AdaptiveDraftLength.history


class FixedDraftLength:
    """Always draft ``k`` tokens (fewer only where max_length leaves less room)."""

    def __init__(self, k: int) -> None:
        self.k = k

    @property
    def max_k(self) -> int:
        return self.k

    def choose(self, limit: int) -> int:
        return max(0, min(self.k, limit))

    def update(self, proposed: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        pass


def trials(proposed: int, accepted: int) -> int:
    """Bernoulli trials in a pass of ``proposed`` drafts of which the first ``accepted`` were accepted: each accepted
    draft, plus the rejected one (none when all were accepted)."""
    return accepted + (1 if accepted < proposed else 0)


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens committed by a pass with ``k`` drafts and per-token acceptance ``a``."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass
class AdaptiveDraftLength:
    """Pick ``k`` per step to maximise expected committed tokens per second.

    Args:
        max_k / min_k: the range searched.
        decay: weight of the past in the moving averages (0.8 ~ the last five steps).
        prior_acceptance: the acceptance assumed before any step.
        timed: learn the costs from wall-clock time. ``False`` (what specdec uses when a seeded
            ``generator`` is given) makes every choice a function of the accepted counts alone, so a
            seeded run draws the same ``k`` sequence, and therefore the same tokens, every time: the
            draft cost per token is then ``draft_cost_ratio`` verifier passes and a pass over ``k``
            drafts costs ``1 + VERIFY_SLOPE * k``.
        draft_cost_ratio: the untimed model's cost of one draft token, in verifier passes.
    """

    max_k: int = 8
    min_k: int = 1
    decay: float = 0.8
    prior_acceptance: float = 0.7
    timed: bool = True
    draft_cost_ratio: float = 0.1
    acceptance: float = field(init=False)
    draft_cost: float | None = field(init=False, default=None)
    verify_costs: dict[int, float] = field(init=False, default_factory=dict)
    #: the latest choices (bounded: a long-lived server's policy must not grow without end)
    history: deque[int] = field(init=False, default_factory=lambda: deque(maxlen=HISTORY_LEN))

    def __post_init__(self) -> None:
        if not 1 <= self.min_k <= self.max_k:
            raise ValueError(f"need 1 <= min_k <= max_k, got {self.min_k}, {self.max_k}")
        if not 0 <= self.decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")
        self.acceptance = self.prior_acceptance

    def _verify_cost(self, k: int) -> float:
        """Measured cost of a pass over ``k`` drafts, from a line through the measured passes."""
        if not self.timed:
            return 1.0 + VERIFY_SLOPE * k
        points = sorted(self.verify_costs.items())
        if len(points) == 1:
            (k0, v0), = points
            return v0 * (1 + VERIFY_SLOPE * (k - k0))  # prior until a second k is measured
        n = len(points)
        mean_k = sum(p[0] for p in points) / n
        mean_v = sum(p[1] for p in points) / n
        var = sum((p[0] - mean_k) ** 2 for p in points)
        slope = max(0.0, sum((p[0] - mean_k) * (p[1] - mean_v) for p in points) / var)
        return mean_v + slope * (k - mean_k)

    def _draft_cost(self) -> float:
        return self.draft_cost if self.timed and self.draft_cost is not None else self.draft_cost_ratio

    def choose(self, limit: int) -> int:
        upper = min(self.max_k, limit)
        if upper < self.min_k:
            return max(0, upper)
        if self.timed and (self.draft_cost is None or not self.verify_costs):
            k = min(upper, max(self.min_k, (self.min_k + self.max_k) // 2))
        else:
            a = min(max(self.acceptance, 0.0), 0.999)
            k = max(
                range(self.min_k, upper + 1),
                key=lambda k: expected_tokens(a, k) / (k * self._draft_cost() + self._verify_cost(k)),
            )
        self.history.append(k)
        return k

    def update(self, proposed: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        if proposed <= 0:
            return
        tried = trials(proposed, accepted)
        rate = accepted / tried if tried else self.acceptance
        self.acceptance = self.decay * self.acceptance + (1 - self.decay) * rate
        if not self.timed:
            return
        per_token = draft_seconds / proposed
        self.draft_cost = per_token if self.draft_cost is None else self.decay * self.draft_cost + (1 - self.decay) * per_token
        old = self.verify_costs.get(proposed)
        self.verify_costs[proposed] = verify_seconds if old is None else self.decay * old + (1 - self.decay) * verify_seconds


class ChainPlan(DraftPlan):
    """A call that drafts chains: ``k`` per pass from ``policy`` (:class:`FixedDraftLength` or
    :class:`AdaptiveDraftLength`), which learns from each pass."""

    def __init__(self, policy: FixedDraftLength | AdaptiveDraftLength) -> None:
        self.policy = policy
        self.num_draft_tokens = policy.max_k

    @classmethod
    def fixed(cls, k: int) -> "ChainPlan":
        """Always ``k`` drafts (fewer only where ``max_length`` leaves less room)."""
        return cls(FixedDraftLength(k))

    def propose(self, drafter: Proposer, rows: Rows, room: int, ctx: DraftContext) -> Drafts:
        return drafter.propose(rows, self.policy.choose(room), ctx)

    def update(self, drafts: Drafts, accepted: "torch.Tensor", draft_seconds: float, verify_seconds: float,
               drafter_forwards: int, path: "torch.Tensor | None" = None) -> None:
        self.policy.update(drafts.num_tokens, int(accepted.min()), draft_seconds, verify_seconds)
