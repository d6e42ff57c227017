"""The one budget computation: what a call needs (weights, caches, activations, reserve), and the
largest batch or length that fits. :func:`~specdec.sizing.check_fits` and
:func:`~specdec.sizing.plan` both count with :meth:`Workload.need`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

from specdec.sizing.activations import call_activations
from specdec.sizing.kv import kv_bytes_per_token, naive_kv_bytes_per_token
from specdec.sizing.memory import dtype_name


@dataclass(frozen=True)
class Need:
    """Bytes one ``generate`` call needs, by part."""

    verifier_weights: int
    drafter_weights: int
    verifier_cache: int
    drafter_cache: int
    activations: int
    reserve: int

    @property
    def weights(self) -> int:
        return self.verifier_weights + self.drafter_weights

    @property
    def total(self) -> int:
        return self.weights + self.verifier_cache + self.drafter_cache + self.activations + self.reserve


@dataclass(frozen=True)
class Workload:
    """What stays fixed while the batch and the cache length vary: the models (resolved configs),
    their compute and KV dtypes, the draft length, the weights counted and the runtime reserve."""

    verifier: Any
    drafter: Any | None
    dtype: str
    draft_dtype: str
    kv_dtype: str
    draft_kv_dtype: str
    draft_len: int
    verifier_weights: int = 0
    drafter_weights: int = 0
    reserve: int = 0
    naive_heads: bool = False  # count query heads (the common mistake), for comparison only

    @cached_property  # searches call need() many times; the layout is read once
    def verifier_kv_per_token(self) -> int:
        per_token = naive_kv_bytes_per_token if self.naive_heads else kv_bytes_per_token
        return per_token(self.verifier, self.kv_dtype)

    @cached_property
    def drafter_kv_per_token(self) -> int:
        if self.drafter is None:
            return 0
        per_token = naive_kv_bytes_per_token if self.naive_heads else kv_bytes_per_token
        return per_token(self.drafter, self.draft_kv_dtype)

    def need(self, batch: int, slots: int, prefill_tokens: int) -> Need:
        """Bytes for ``batch`` rows whose managed caches hold ``slots`` slots each, after a prefill of
        ``prefill_tokens`` prompt tokens per row (at most ``slots``)."""
        acts = call_activations(self.verifier, self.drafter, batch, min(prefill_tokens, slots), self.draft_len,
                                self.dtype, self.draft_dtype)
        return Need(
            verifier_weights=self.verifier_weights,
            drafter_weights=self.drafter_weights,
            # == managed_cache_bytes(model, batch, slots, kv dtype): what ManagedCache allocates
            verifier_cache=batch * slots * self.verifier_kv_per_token,
            drafter_cache=batch * slots * self.drafter_kv_per_token,
            activations=acts,
            reserve=self.reserve,
        )

    def with_dtypes(self, dtype: Any, draft_dtype: Any) -> "Workload":
        """The same setup computing and caching in other dtypes (weights unchanged)."""
        d, dd = dtype_name(dtype), dtype_name(draft_dtype)
        return dataclasses.replace(self, dtype=d, kv_dtype=d, draft_dtype=dd, draft_kv_dtype=dd)

    def naive(self) -> "Workload":
        """The same setup with both caches counted from the query heads."""
        return dataclasses.replace(self, naive_heads=True)


def largest(ok: Callable[[int], bool], lo: int, hi: int | None = None) -> int:
    """Largest n in [lo, hi] with ok(n) for a monotone predicate (0 when ok(lo) is false)."""
    if not ok(lo):
        return 0
    if hi is not None and ok(hi):
        return hi
    good, step = lo, 1
    bad = hi
    if bad is None:
        while ok(good + step):
            good += step
            step *= 2
            if good > 1 << 48:
                return good
        bad = good + step
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good
