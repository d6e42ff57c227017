"""Transient bytes: one forward's activation peak, and the peak of one speculative call."""

from __future__ import annotations

from typing import Any

from specdec.sizing.arch import arch
from specdec.sizing.configs import ConfigLike, get_field, resolve
from specdec.sizing.memory import dtype_bytes


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
