"""How many cache slots one ``generate`` call preallocates: one formula for the engine and the planner.

Torch-free, so ``specdec plan`` can size caches without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass


def cache_slots(batch_size: int, prompt_len: int, max_length: int, num_draft_tokens: int) -> int:
    """Slots per row of each managed cache (verifier and model drafter) for one call.

    ``max_length`` is prompt + new tokens. One row never needs more than that: the engine never
    drafts past ``max_length - 1``, so a verify block cannot overshoot. A batch of ragged rows leaves
    holes (slots a row did not keep); some slack makes the compaction that squeezes them out rare.
    """
    for name, value in (("batch_size", batch_size), ("prompt_len", prompt_len), ("max_length", max_length),
                        ("num_draft_tokens", num_draft_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if max_length < prompt_len:
        raise ValueError(f"max_length ({max_length}) is shorter than the prompt ({prompt_len})")
    slack = 0 if batch_size <= 1 else (max_length - prompt_len) // 4 + 2 * (num_draft_tokens + 1)
    return max_length + slack


#: compiled verify passes: cache lengths are rounded up to a multiple of this, so calls of similar lengths share graphs
STATIC_LENGTH_STEP = 256


def pass_widths(num_draft_tokens: int, max_nodes: int | None = None) -> tuple[int, ...]:
    """The token counts a compiled verify pass is padded to where graphs need fixed shapes (``compile_verifier``
    with CUDA graphs): a chain's one width, ``k + 1``: a shorter pass (prompt lookup without a match, an early
    stop, adaptive k below its maximum) is padded with masked filler, nearly free on a launch-bound GPU, so a call
    compiles and records one graph per batch size; a tree's ``1 + nodes`` go up to the next power of two, capped
    at ``max_nodes + 1``, so a call meets a handful of shapes, never one per size."""
    if max_nodes is None:
        return (num_draft_tokens + 1,)
    top = max_nodes + 1
    widths = {1, top}
    width = 2
    while width < top:
        widths.add(width)
        width *= 2
    return tuple(sorted(widths))


def primed_widths(widths: tuple[int, ...], pads: bool) -> tuple[int, ...]:
    """The pass widths priming runs: with padding, ``widths`` themselves; without it (inductor on a CPU runs each pass
    at its own width, shapes going dynamic after the first change) also 1 and 2, which compile the one-token graph
    and the dynamic one that every other width reuses."""
    return widths if pads else tuple(sorted({1, min(2, max(widths)), *widths}))


def static_slots(slots: int, widths: tuple[int, ...]) -> int:
    """Slots of a compiled verifier's cache for a call that needs ``slots``: room for a pass padded to the
    widest width, rounded up to :data:`STATIC_LENGTH_STEP` (calls of similar lengths then share one shape)."""
    need = slots + max(widths)
    return -(-need // STATIC_LENGTH_STEP) * STATIC_LENGTH_STEP


@dataclass(frozen=True)
class CallSlots:
    """The cache sizes of one call, derived once (by the strategy that plans it) and read by the memory check,
    the engine and the caches alike.

    ``rows``: slots per row of a drafter's managed cache (:func:`cache_slots` plus a tree's extra slots);
    ``verifier``: the verifier's, the same unless its passes are compiled (:func:`static_slots`);
    ``widths``: the token counts compiled verify passes are padded to (:func:`pass_widths`)."""

    rows: int
    verifier: int
    widths: tuple[int, ...]

    @classmethod
    def of(cls, rows: int, widths: tuple[int, ...], static: bool) -> "CallSlots":
        """``rows`` slots, and a verifier cache rounded for compiled passes when ``static``."""
        return cls(rows, static_slots(rows, widths) if static else rows, widths)
