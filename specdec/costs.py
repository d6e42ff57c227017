"""What a speculative pass costs and delivers: one model for every policy that sizes drafts (adaptive ``k``, tree
``auto``'s trees and chain arm, ``quant-report``'s estimated speedup). Torch-free.

- :class:`VerifyCost`: seconds of one verifier pass against the tokens in it, a measured curve (tree ``auto``
  measures 1..64 tokens; ``quant-report`` 1 and 8; adaptive ``k`` learns its points from the clock of its own passes);
- :func:`chain_rate`: a chain pass's expected committed tokens (:func:`specdec.metrics.expected_tokens`) per second.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from specdec.metrics import expected_tokens

#: acceptance rates are clamped below 1: at 1 every k looks equally free and the choice is arbitrary
MAX_ACCEPTANCE = 0.999


@dataclass
class VerifyCost:
    """Seconds of one verifier pass against the tokens in it (``sizes`` ascending, ``seconds`` per size)."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    context: int = 0
    device: str = ""

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.seconds) or not self.sizes or list(self.sizes) != sorted(set(self.sizes)):
            raise ValueError("a verify cost needs ascending, distinct sizes and one time per size")
        if min(self.seconds) <= 0:
            raise ValueError("verify costs must be positive seconds")

    def __call__(self, tokens: int) -> float:
        """Interpolated (linearly extrapolated past the last size) seconds of a pass over ``tokens``."""
        s, t = self.sizes, self.seconds
        if len(s) == 1:
            return t[0] * tokens / s[0]
        i = min(max(bisect.bisect_left(s, tokens), 1), len(s) - 1)
        slope = (t[i] - t[i - 1]) / (s[i] - s[i - 1])
        return max(t[0], t[i - 1] + slope * (tokens - s[i - 1]))

    def to_dict(self) -> dict:
        return {"sizes": list(self.sizes), "seconds": list(self.seconds), "context": self.context, "device": self.device}


def chain_rate(acceptance: float, k: int, seconds: float) -> float:
    """Expected tokens per second of a pass over ``k`` chained drafts accepted with probability ``acceptance`` each
    (clamped to ``[0, MAX_ACCEPTANCE]``) that costs ``seconds`` (verify pass plus drafting, in any one unit)."""
    a = min(max(acceptance, 0.0), MAX_ACCEPTANCE)
    return expected_tokens(a, k) / max(seconds, 1e-12)
