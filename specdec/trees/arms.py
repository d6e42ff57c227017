"""``tree="auto"`` under sampling: a sampled chain or a tree, chosen per pass by what each has delivered.

Why: a tree's children are the drafter's top-ranked tokens, deterministic given the context, so the verifier
accepts child ``x`` with probability ``p(x)``; a sampled chain's draft is drawn from the drafter's ``q`` and
accepted with probability ``min(1, p(x) / q(x))``, about ``1 - TV(p, q)``. For a drafter close to the verifier
that is near 1 where ``p(x)`` of the top token is ~0.6 at T 0.7: on Spec-Bench (this CPU) the int8 self-copy's
sampled chain committed 5.4 tokens a pass and its tree 3.4 from three times the nodes. A weak drafter (a head
right a third of the time) gains from siblings instead. Which wins depends on the drafter, the temperature and
the device, so ``auto`` keeps both arms and measures them.

Each arm's rate is a moving average of committed tokens per second over its passes: wall-clock seconds when
the sizer learns from the clock, the sizer's cost model (verify cost curve + drafter passes) in seeded calls,
whose choices must not depend on timing. The clock also counts what the model leaves out (measured small:
sampling's warpers and rejection walk are 1-3 ms of a 90-190 ms tree pass on this CPU). The chain drafts first;
the better arm is taken; the other (the tree, the first time) is tried once after ``EXPLORE`` passes of it, so a
change of text (code after prose) can turn the choice.
"""

from __future__ import annotations

from typing import Callable

from specdec.chains import trials
from specdec.costs import chain_rate

EXPLORE = 16  # passes of the leading arm before the other is tried once again
DECAY = 0.8  # weight of the past in each arm's moving averages
PRIOR_ACCEPTANCE = 0.7  # a sampled draft's acceptance before any chain pass


class ChainOrTree:
    """Per pass under sampling: ``"chain"`` (a sampled chain of :meth:`chain_length` drafts) or ``"tree"``.

    ``cost(tokens)``: seconds of a verify pass; ``draft_step``: seconds of a drafter pass (both the sizer's).
    """

    def __init__(self) -> None:
        self.acceptance = PRIOR_ACCEPTANCE
        self.tokens: dict[str, float] = {}  # per arm: moving averages of tokens committed a pass per row ...
        self.seconds: dict[str, float] = {}  # ... and of the seconds of a pass
        self.passes = {"chain": 0, "tree": 0}
        self._since = 0  # passes of the leading arm since the other was last tried

    def rate(self, arm: str) -> float | None:
        """Tokens per second the arm has delivered (``None`` before its first pass)."""
        if arm not in self.tokens:
            return None
        return self.tokens[arm] / max(self.seconds[arm], 1e-9)

    def pick(self) -> str:
        """The arm of the next pass: the chain first (its passes learn the acceptance that sizes it), then the arm
        with the better rate, and the other once every ``EXPLORE`` passes (the tree's first pass too: trying it at
        once cost each seeded Spec-Bench call of the int8 copy a 15-node tree pass out of ~20)."""
        if "chain" not in self.tokens:
            return "chain"
        lead, other = ("chain", "tree")
        if "tree" in self.tokens and self.rate("tree") > self.rate("chain"):
            lead, other = other, lead
        if self._since >= EXPLORE:
            self._since = 0
            return other
        self._since += 1
        return lead

    def chain_length(self, limit: int, cost: Callable[[int], float], draft_step: float) -> int:
        """The chain's ``k`` (1..``limit``) with the most expected tokens per modelled second at the learnt
        acceptance."""
        return max(range(1, max(limit, 1) + 1), key=lambda k: chain_rate(self.acceptance, k, cost(k + 1) + k * draft_step))

    def observe(self, arm: str, drafted: int, accepted: list[int], seconds: float) -> None:
        """One pass of ``arm``: ``drafted`` drafts per row (a chain's ``k``), ``accepted`` per row, ``seconds``."""
        tokens = sum(a + 1 for a in accepted) / max(len(accepted), 1)
        if arm == "chain" and drafted > 0:  # Bernoulli trials until the first rejection, per row
            tried = sum(trials(drafted, a) for a in accepted)
            if tried:
                self.acceptance = DECAY * self.acceptance + (1 - DECAY) * sum(accepted) / tried
        if arm in self.tokens:
            self.tokens[arm] = DECAY * self.tokens[arm] + (1 - DECAY) * tokens
            self.seconds[arm] = DECAY * self.seconds[arm] + (1 - DECAY) * seconds
        else:
            self.tokens[arm], self.seconds[arm] = tokens, seconds
        self.passes[arm] += 1

    def to_dict(self) -> dict:
        """What the call's statistics report: passes per arm, their rates, the chain's learnt acceptance."""
        rates = {arm: None if arm not in self.tokens else round(self.rate(arm), 2) for arm in ("chain", "tree")}
        return {"passes": dict(self.passes), "tokens_per_s": rates, "chain_acceptance": round(self.acceptance, 3)}
