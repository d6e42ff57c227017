"""How many cache slots one ``generate`` call preallocates: one formula for the engine and the planner.

Torch-free, so ``specdec plan`` can size caches without importing torch.
"""

from __future__ import annotations


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
