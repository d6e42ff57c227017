"""``tree="auto"``: size each pass's tree from what a pass costs on this device and what drafts are worth.

:func:`measure_verify_cost` times the verifier over passes of 1..64 tokens (through the same tree-mask path a
tree pass takes). :class:`TreeSizer` then chooses, per pass, how deep to grow and how many candidates to
verify: with candidates sorted by value ``v_1 >= v_2 >= ...`` (a node's cumulative draft probability, the
drafter's own estimate that it is accepted), ``n`` nodes are expected to commit ``1 + a * (v_1 + ... + v_n)``
tokens at a cost ``C(n + 1) + passes * t_draft``, and the sizer takes the ``n`` with the most tokens per second.
``a`` calibrates the drafter's confidence against what the verifier actually accepted (an EMA of the ratio).
On this CPU ``C`` grows steeply with ``n``, so trees stay small; on a GPU it is nearly flat, so they grow.
"""

from __future__ import annotations

import bisect
import statistics
import time
from dataclasses import dataclass

import torch

from specdec.verifiers.hf import lm_head_rows

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
PRIOR = 1.0  # pseudo-count of the calibration: accepted / predicted starts at 1 and moves with evidence


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


@torch.inference_mode()
def measure_verify_cost(runner, sizes: tuple[int, ...] = SIZES, context: int = 256, repeats: int = 3,
                        min_seconds: float = 0.05, max_repeats: int = 25) -> VerifyCost:
    """Time ``runner``'s model over a pass of each size after a ``context``-token prompt: the median of at least
    ``repeats`` passes, more (up to ``max_repeats``) until ``min_seconds`` per size were timed, then the monotone
    envelope (a pass never costs more than a longer one: ``seconds[i] = min(seconds[i:])``).

    Why both: a small model on a GPU is launch-bound, each pass ~15 ms of host work whose jitter is +-30%, and the
    first H100 check measured 16 tokens *cheaper* than 1 from three repeats; a longer pass can always stand in for
    a shorter one (padding), so a dip past a size is the true bound for it too.

    On a model with fewer positions than ``context`` + the largest size (``max_position_embeddings``), both are
    clamped to fit: sizes up to half its positions, the context filling the rest (the curve is extrapolated past
    the largest size measured)."""
    model = runner.model
    device = model.device
    sizes, context = _fit_positions(model.config, tuple(sizes), context)
    vocab = lm_head_rows(model)
    gen = torch.Generator(device="cpu").manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=gen, device="cpu").to(device)
    session, _ = runner.prefill(prompt, None, context + max(sizes) + 1)
    seconds = []
    try:
        for n in sizes:
            tokens = torch.randint(0, vocab, (1, n), generator=gen, device="cpu").to(device)
            chain = torch.tril(torch.ones(n, n, dtype=torch.bool, device=device)).unsqueeze(0)
            positions = (context + torch.arange(n, device=device)).unsqueeze(0)
            times: list[float] = []
            while len(times) < repeats + 1 or (sum(times[1:]) < min_seconds and len(times) < max_repeats + 1):
                _sync(device)  # the first pass is a warm-up
                t0 = time.perf_counter()
                session.forward(tokens, position_ids=positions, tree_mask=chain)
                _sync(device)
                times.append(time.perf_counter() - t0)
                session.rollback(context)
            seconds.append(statistics.median(times[1:]))
    finally:
        session.release()
    envelope = [min(seconds[i:]) for i in range(len(seconds))]
    return VerifyCost(tuple(sizes), tuple(envelope), context, str(device))


def _fit_positions(config, sizes: tuple[int, ...], context: int) -> tuple[tuple[int, ...], int]:
    """``sizes`` and ``context`` clamped so that a ``context``-token prompt and the largest pass fit the model's
    positions (learnt position tables index past their end otherwise)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0 or context + max(sizes) <= limit:
        return sizes, context
    if limit < 2:
        raise ValueError(f"the verifier has {limit} position(s): too few to measure a tree's verify cost")
    fitted = tuple(n for n in sizes if n <= limit // 2) or (1,)
    return fitted, max(1, min(context, limit - max(fitted)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TreeSizer:
    """Per-pass tree size and depth for ``tree="auto"`` (module docstring).

    ``draft_step``: seconds of one drafter pass; ``None`` learns it from the clock (an EMA of what the
    engine measures), a number fixes it (seeded calls: their tree sizes, and so their samples, must not
    depend on timing). ``max_tokens`` bounds the tree.
    """

    def __init__(self, cost: VerifyCost, draft_step: float | None = None, max_tokens: int = 64) -> None:
        self.cost = cost
        self.timed = draft_step is None
        self.draft_step = draft_step if draft_step is not None else 0.05 * cost(1)
        self.max_tokens = max_tokens
        self.calibration = 1.0
        self._predicted = self._accepted = 0.0  # EMAs of what the drafter predicted and what was accepted

    def select(self, values: list[float], passes: int) -> int:
        """The number of candidates (``values`` best first) with the most expected tokens per second, at least
        one: a pass without drafts would teach the calibration nothing, and a low estimate would then stick
        (measured: verifying none whenever that looked best locked a Spec-Bench run into plain decoding)."""
        best, best_rate, total = 0, 1 / (self.cost(1) + passes * self.draft_step), 0.0
        for n, v in enumerate(values[: self.max_tokens], start=1):
            total += v
            rate = (1 + self.calibration * total) / (self.cost(n + 1) + passes * self.draft_step)
            if rate > best_rate:
                best, best_rate = n, rate
        return max(best, 1)

    def worth_expanding(self, values: list[float], frontier: list[float], passes: int) -> bool:
        """Whether one more drafter pass can pay for itself: the frontier's children are worth at most the
        frontier's value, against the time of a pass at the best rate reachable now."""
        n = self.select(values, passes)
        tokens = 1 + self.calibration * sum(values[:n])
        seconds = self.cost(n + 1) + passes * self.draft_step
        gain = self.calibration * sum(frontier)
        return (tokens + gain) / (seconds + self.draft_step) > tokens / seconds

    def update(self, predicted: float, accepted: float, draft_seconds: float | None = None,
               draft_passes: int = 0, decay: float = 0.9) -> None:
        """Learn from one pass: the summed values of the verified nodes, the drafts accepted, and (timed)
        the drafter's time over its passes."""
        self._predicted = decay * self._predicted + predicted
        self._accepted = decay * self._accepted + accepted
        # a prior of one predicted-and-accepted token: one unlucky first pass cannot drive it to the floor
        self.calibration = min(2.0, max(0.05, (self._accepted + PRIOR) / (self._predicted + PRIOR)))
        if self.timed and draft_seconds is not None and draft_passes > 0:
            self.draft_step = 0.8 * self.draft_step + 0.2 * draft_seconds / draft_passes
