"""A preallocated KV cache whose rollback is a pointer move.

Each layer owns one ``[batch, kv_heads, max_len, head_dim]`` buffer for keys and one for values,
allocated once (on the first write, when the real head count, head size, dtype and device are
known) and never grown. ``update`` writes new states in place and returns *views* of the filled
prefix, so attention sees exactly the keys a ``DynamicCache`` would hold and no masked padding:
numerics match plain ``model.generate`` and decode on CPU does no work for empty slots.

Rolling back the rejected draft tokens is ``cache.rollback(n)``: the length pointer moves back and
the stale slots are overwritten by the next write. No copy, no reallocation.

Compiled verify passes (``compile_verifier``, docs/design.md "Compiled verify passes") need fixed shapes:
there a layer writes at a *tensor* pointer (:attr:`ManagedLayer.write_at`, set by the session outside the
graph) and returns the whole buffer, which the session's full-width mask restricts to the valid slots, as
transformers' ``StaticLayer`` does. The integer pointer still moves (outside the graph), so rollback is unchanged.

Sliding-window layers keep the whole context too (the model's sliding mask hides what is out of
the window); this makes rollback trivially exact at the cost of memory. ``specdec.sizing`` counts
the managed cache the same way.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


def cache_argument(model: Any) -> str:
    """The keyword ``model``'s forward takes its cache by: ``cache`` (current transformers renamed it; the old
    ``past_key_values`` warns and goes in 5.40) or ``past_key_values`` (older transformers, remote code). A forward
    that names neither (a ``**kwargs`` wrapper) gets the installed transformers' own name for it: a name the
    model's ``**kwargs`` swallowed would silently run without the cache."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        parameters = {}
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    return _library_cache_argument()


@functools.lru_cache(maxsize=1)
def _library_cache_argument() -> str:
    """What the installed transformers' own causal LMs call the cache (their Llama as the witness)."""
    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


class CacheOverflowError(RuntimeError):
    """Raised when a write would go past the preallocated length."""


class ManagedLayer(CacheLayerMixin):
    """One attention layer's preallocated keys and values with an integer fill pointer."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, max_cache_len: int, **kwargs) -> None:
        super().__init__()
        self.max_cache_len = int(max_cache_len)
        self.length = 0
        # static passes: a 0-d long tensor, the first slot to write (shared by every layer of a cache)
        self.write_at: torch.Tensor | None = None
        self.zero_init = False  # allocate zeroed buffers (static caches)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        batch, heads = key_states.shape[:2]
        shape_k = (batch, heads, self.max_cache_len, key_states.shape[-1])
        shape_v = (batch, value_states.shape[1], self.max_cache_len, value_states.shape[-1])
        # torch.empty: slots past `length` are never read, so there is nothing to zero; static passes read the
        # whole buffer under a mask, and a masked NaN still poisons attention (NaN * 0), so theirs start at zero.
        alloc = torch.zeros if self.zero_init else torch.empty
        self.keys = alloc(shape_k, dtype=self.dtype, device=self.device)
        self.values = alloc(shape_v, dtype=value_states.dtype, device=self.device)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.write_at is not None:  # static pass (compiled): no Python state read or written in the graph
            at = self.write_at + torch.arange(key_states.shape[-2], device=key_states.device)
            self.keys.index_copy_(2, at, key_states)
            self.values.index_copy_(2, at, value_states)
            return self.keys, self.values
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        elif key_states.dtype != self.keys.dtype:  # adopted from a model computing in another dtype
            self.keys, self.values = self.keys.to(key_states.dtype), self.values.to(value_states.dtype)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.max_cache_len:
            raise CacheOverflowError(
                f"KV cache overflow: writing positions {start}..{end - 1} into a cache preallocated for "
                f"{self.max_cache_len} tokens. Raise max_new_tokens' headroom or the cache length."
            )
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_cache_len

    def crop(self, tokens_to_remove: int) -> None:
        """HF-style crop: a negative count removes that many tokens; a non-negative one keeps that many."""
        new_length = self.length + tokens_to_remove if tokens_to_remove < 0 else tokens_to_remove
        self.rollback(new_length)

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back a cache of {self.length} tokens to {length}")
        self.length = int(length)

    def reset(self) -> None:
        self.length = 0

    def adopt(self, other: "ManagedLayer", dtype: torch.dtype | None = None, rows: torch.Tensor | None = None) -> None:
        """Start from a copy of ``other``'s filled slots (same head count and size), in ``dtype`` if given;
        ``rows``: which of ``other``'s buffer rows (a static cache keeps retired rows; default all)."""
        n = other.length
        keys, values = (other.keys, other.values) if rows is None else (other.keys[rows], other.values[rows])
        dtype = dtype or keys.dtype
        if not (self.is_initialized and self.keys.dtype == dtype and self.keys.shape[:2] == keys.shape[:2]
                and self.keys.shape[-1] == keys.shape[-1]):  # a pooled static cache keeps its buffers (and graphs)
            self.lazy_initialization(keys[:, :, :0].to(dtype), values[:, :, :0].to(dtype))
        self.keys[:, :, :n].copy_(keys[:, :, :n])
        self.values[:, :, :n].copy_(values[:, :, :n])
        self.length = n

    def gather_slots(self, order: torch.Tensor, start: int = 0) -> None:
        """Move slot ``start + order[b, i]`` of each row ``b`` to slot ``start + i`` (compaction, or keeping a
        set of the newest slots); the pointer becomes ``start + order.shape[1]``."""
        if not self.is_initialized:
            return
        n = order.shape[1]
        for buf in (self.keys, self.values):
            index = order[:, None, :, None].expand(buf.shape[0], buf.shape[1], n, buf.shape[3])
            buf[:, :, start : start + n] = buf[:, :, start:].gather(2, index)
        self.length = start + n

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.keys = self.keys[indices].contiguous()
            self.values = self.values[indices].contiguous()

    @property
    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


class ManagedCache(Cache):
    """A transformers ``Cache`` of :class:`ManagedLayer`, one per decoder layer.

    Pass it as ``past_key_values`` to any supported causal LM. All layers hold the same number of
    tokens (``len(cache)`` is the layer count, :attr:`length` the token count).
    """

    def __init__(self, num_layers: int, max_cache_len: int) -> None:
        if max_cache_len <= 0:
            raise ValueError(f"max_cache_len must be positive, got {max_cache_len}")
        super().__init__(layers=[ManagedLayer(max_cache_len) for _ in range(num_layers)])
        self._max_cache_len = int(max_cache_len)

    @property
    def max_cache_len(self) -> int:  # transformers <= 5.15 defines a read-only (deprecated) one on Cache
        """Tokens every layer's buffers are preallocated for."""
        return self._max_cache_len

    @property
    def length(self) -> int:
        """Number of tokens currently held (the fill pointer)."""
        return self.layers[0].length if self.layers else 0

    def rollback(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens. O(1): no copy."""
        for layer in self.layers:
            layer.rollback(length)

    def make_static(self, pointer: torch.Tensor) -> None:
        """Route every later write through ``pointer`` (a 0-d long tensor; static passes, see the module doc).
        The buffers must exist (a prefill ran)."""
        for layer in self.layers:
            layer.write_at = pointer

    def static_write(self, start: int, width: int, used: int) -> None:
        """Before a static pass of ``width`` tokens at slot ``start``, of which the first ``used`` are real (the rest
        padding): point the graph there and move the integer pointer past the real ones (the padding's slots are
        overwritten by the next pass, as rolled-back ones are)."""
        if start + width > self.max_cache_len:
            raise CacheOverflowError(f"KV cache overflow: {width} more tokens after {start} in a cache preallocated "
                                     f"for {self.max_cache_len} tokens")
        self.layers[0].write_at.fill_(start)
        for layer in self.layers:
            layer.length = start + used

    @property
    def nbytes(self) -> int:
        """Bytes held by the preallocated key and value buffers of every layer."""
        return sum(layer.nbytes for layer in self.layers)
