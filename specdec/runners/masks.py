"""Attention masks per layer type, built on the device from which slots a token may see and the slots' positions.

A session decides which cached slots each new token may see at all (:class:`~specdec.runners.session.CacheSession`:
valid slots, causal order or a tree of drafts). Layers with a restricted view see fewer: a sliding-window layer
(mistral, qwen2, gemma2/3, gpt-oss, ...) only keys whose position is within ``sliding_window - 1`` of the query's
(transformers' ``sliding_window_overlay``: ``kv > q - window``), a chunked layer (llama4) only keys in the query's
chunk of ``attention_chunk_size`` positions (``chunked_overlay``). transformers counts both in cache indices,
which in ``generate``'s contiguous layout differ exactly as positions do; the managed cache has holes (rejected
drafts of ragged rows, tree siblings), so here they are counted in *positions*, which the session keeps per slot.

Models that take one mask per layer type (``config.layer_types``) get a dict (``{"full_attention": ...,
"sliding_attention": ...}``, as ``generate`` builds it); models whose every layer slides (mistral: no layer types)
get the one sliding mask. Masks are additive (``0`` or the dtype's minimum), which transformers uses as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


@dataclass(frozen=True)
class MaskLayout:
    """What masks a model takes: its attention layer types, whether as a dict per type, and their reach."""

    types: tuple[str, ...]  # the layer types that take a mask (first-seen order)
    keyed: bool  # a dict per layer type (the model reads ``config.layer_types``), else one tensor for every layer
    window: int | None = None  # sliding layers see keys with ``query position - key position < window``
    chunk: int | None = None  # chunked layers see keys with ``key position // chunk == query position // chunk``

    @classmethod
    def of(cls, config: Any) -> "MaskLayout":
        """The layout of a model with ``config`` (its text config for multimodal ones)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        window = getattr(text, "sliding_window", None) or None
        if getattr(text, "use_sliding_window", True) is False:  # qwen-style configs keep the size but switch it off
            window = None
        chunk = getattr(text, "attention_chunk_size", None) or None
        layer_types = [t for t in (getattr(text, "layer_types", None) or []) if t in (FULL, SLIDING, CHUNKED)]
        if SLIDING in layer_types or CHUNKED in layer_types:
            types = tuple(dict.fromkeys(layer_types))
            return cls(types, True, window if SLIDING in types else None, chunk if CHUNKED in types else None)
        if window is not None and not getattr(text, "layer_types", None):  # mistral, mixtral, phi3: every layer slides
            return cls((SLIDING,), False, window)
        return cls((FULL,), False)

    @property
    def restricted(self) -> bool:
        """Whether some layer sees less than its whole causal past (then the session keeps slot positions)."""
        return self.window is not None or self.chunk is not None

    def masks(self, allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor | None,
              finish: Any) -> torch.Tensor | dict[str, torch.Tensor]:
        """The model's ``attention_mask`` argument: ``finish(allowed_of_type)`` for each layer type, where
        ``allowed [batch, n, t]`` (bool) is what the session lets each new token see, ``query_positions [batch, n]``
        the new tokens' positions and ``key_positions [batch, t]`` those of the ``t`` slots (needed when
        :attr:`restricted`). ``finish`` turns a bool view into the mask passed on (e.g. :func:`additive`)."""
        out = {kind: finish(self.allowed(kind, allowed, query_positions, key_positions)) for kind in self.types}
        return out if self.keyed else out[self.types[0]]

    def allowed(self, kind: str, allowed: torch.Tensor, query_positions: torch.Tensor,
                key_positions: torch.Tensor | None) -> torch.Tensor:
        """``allowed`` restricted to what a layer of ``kind`` sees (see :meth:`masks`)."""
        if kind == SLIDING:
            return allowed & (key_positions[:, None, :] > query_positions[:, :, None] - self.window)
        if kind == CHUNKED:
            return allowed & (key_positions[:, None, :] // self.chunk == query_positions[:, :, None] // self.chunk)
        return allowed


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``allowed [batch, n, t]`` as the additive mask ``[batch, 1, n, t]`` transformers takes as is."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, blocked).unsqueeze(1)


def positions_of(valid: torch.Tensor) -> torch.Tensor:
    """Each slot's position when a row's positions count its valid slots (``[batch, slots]``; an invalid slot gets
    its last valid neighbour's, harmless: no mask lets it be seen)."""
    return (valid.long().cumsum(dim=1) - 1).clamp_min(0)
