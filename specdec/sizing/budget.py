"""The one budget computation: what a call needs (weights, caches, activations, reserve), and the
largest batch or length that fits. :func:`~specdec.sizing.check_fits` and
:func:`~specdec.sizing.plan` both count with :meth:`Workload.need`. Activations are estimated here
too: one forward's peak (:func:`activation_bytes`) and one speculative call's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

from specdec.sizing.configs import ConfigLike, arch, get_field, resolve
from specdec.sizing.kv import kv_bytes_per_token, naive_kv_bytes_per_token
from specdec.sizing.memory import dtype_bytes, dtype_name
from specdec.sizing.state import state_bytes_per_row


def activation_bytes(config: ConfigLike, tokens: int, dtype: Any = "bfloat16", logits_positions: int = 0) -> int:
    """Transient bytes of one forward over ``tokens`` tokens (all rows together), of which
    ``logits_positions`` produce logits.

    Estimate of the peak inside one decoder layer (transformers frees each layer's intermediates
    before the next): the residual stream and its normed copy plus the larger of the attention
    projections and the MLP intermediates (gate, up, product; for MoE the active experts). Logits
    are counted in ``dtype`` plus an fp32 copy and fp32 probabilities (the acceptance step). Score
    matrices are not counted: SDPA/flash kernels do not materialise them.
    """
    a = arch(config)
    nbytes = dtype_bytes(dtype)
    if a.mla is not None:
        m = a.mla
        qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        attn = a.heads * (2 * qk + 2 * m["v_head_dim"]) + m["kv_lora_rank"] + m["qk_rope_head_dim"]
    else:
        attn = 2 * a.heads * a.head_dim + 2 * a.kv_heads * a.head_dim
    cfg = resolve(config)
    width = a.intermediate
    if get_field(cfg, "n_routed_experts", "num_local_experts", "num_experts"):
        top_k = int(get_field(cfg, "num_experts_per_tok", "moe_topk", default=2))
        moe_width = int(get_field(cfg, "moe_intermediate_size", default=a.intermediate))
        shared = int(get_field(cfg, "n_shared_experts", default=0) or 0) * moe_width
        shared += int(get_field(cfg, "shared_expert_intermediate_size", default=0) or 0)
        width = max(width, top_k * moe_width + shared)
    per_token = (4 * a.hidden + max(attn, 3 * width)) * nbytes
    logits = logits_positions * a.vocab * (nbytes + 4 + 4)
    return int(tokens * per_token + logits)


def call_activations(vcfg: Any, dcfg: Any, batch: int, prefill_tokens: int, draft_len: int, dtype: Any,
                     draft_dtype: Any) -> int:
    """Peak transient bytes of one speculative call: the larger of the two prefills (they run one
    after the other) and the verify step (k+1 positions of verifier logits next to the k drafter
    distributions)."""
    # A padded batch makes transformers build a [batch, 1, q, kv] boolean mask for the prompt.
    mask = batch * prefill_tokens * prefill_tokens if batch > 1 else 0
    prefill_v = activation_bytes(vcfg, batch * prefill_tokens, dtype, logits_positions=batch) + mask
    verify = activation_bytes(vcfg, batch * (draft_len + 1), dtype, logits_positions=batch * (draft_len + 1))
    if dcfg is None:
        return max(prefill_v, verify)
    prefill_d = activation_bytes(dcfg, batch * prefill_tokens, draft_dtype, logits_positions=batch) + mask
    draft_probs = batch * draft_len * arch(dcfg).vocab * 4
    return max(prefill_v, prefill_d, verify + draft_probs)


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

    @cached_property
    def verifier_state_per_row(self) -> int:
        """Hybrids: recurrent state per row, with one checkpoint and the recorded input of one verify pass."""
        return state_bytes_per_row(self.verifier, self.kv_dtype, checkpoints=1, tokens=self.draft_len + 1)

    @cached_property
    def drafter_state_per_row(self) -> int:
        """A hybrid model drafter's: a checkpoint and a recorded input per forward of one proposal."""
        if self.drafter is None:
            return 0
        return state_bytes_per_row(self.drafter, self.draft_kv_dtype, checkpoints=self.draft_len,
                                   tokens=self.draft_len + 1)

    def need(self, batch: int, slots: int, prefill_tokens: int) -> Need:
        """Bytes for ``batch`` rows whose managed caches hold ``slots`` slots each, after a prefill of
        ``prefill_tokens`` prompt tokens per row (at most ``slots``)."""
        acts = call_activations(self.verifier, self.drafter, batch, min(prefill_tokens, slots), self.draft_len,
                                self.dtype, self.draft_dtype)
        return Need(
            verifier_weights=self.verifier_weights,
            drafter_weights=self.drafter_weights,
            # == managed_cache_bytes(model, batch, slots, kv dtype): what ManagedCache allocates, plus, for
            # hybrids, the recurrent state and its rollback checkpoints (specdec.sizing.state)
            verifier_cache=batch * (slots * self.verifier_kv_per_token + self.verifier_state_per_row),
            drafter_cache=batch * (slots * self.drafter_kv_per_token + self.drafter_state_per_row),
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
