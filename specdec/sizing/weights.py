"""Parameter counts and weight bytes, per dtype and quantization scheme, counted from the config.

Quantization schemes (:class:`QuantScheme`, :func:`parse_quant`) are read from specdec.quant's
scheme table: the planner accepts exactly the schemes :func:`specdec.quant.parse_scheme` accepts,
with the same grammar ``BASE[:gN][+head|+head8|+head16]``, and takes bits, group sizes, overheads
and compute dtypes from :data:`specdec.quant.schemes.SCHEMES`. One difference: ``none`` (and
``None``) means "no quantization" here (the weights as loaded), where specdec.quant reads ``none``
as an fp32 copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specdec.quant.schemes import SCHEMES, UnknownSchemeError, device_type, parse_scheme
from specdec.sizing.configs import Arch, ConfigLike, arch, get_field, layer_kinds, resolve
from specdec.sizing.memory import dtype_bytes, dtype_name


@dataclass(frozen=True)
class QuantScheme:
    """How a quantization scheme stores a linear weight.

    ``bits`` per weight plus ``overhead_bytes`` (scales, zero points) per group of ``group_size``
    input weights (``group_size`` None: one group per output channel). ``dtype`` is set for the
    plain float "schemes" (``bf16``...), which convert the whole copy instead. ``quantize_head``:
    whether the LM head is quantized too (specdec's default; ``+head`` keeps it). ``compute_dtype``
    is the dtype the quantized copy computes (and caches KV) in on the device it was parsed for.
    """

    name: str
    bits: float
    group_size: int | None = None
    overhead_bytes: float = 0.0
    quantize_head: bool = True
    dtype: str | None = None
    compute_dtype: str | None = None
    head: "QuantScheme | None" = None  # the LM head's own scheme (``+head8`` / ``+head16``), else as the blocks

    def head_bytes(self, hidden: int, vocab: int) -> int:
        """Bytes of the (quantized) LM head matrix."""
        if self.head is None:
            return self.linear_bytes(hidden, vocab)
        if self.head.dtype is not None:
            return hidden * vocab * dtype_bytes(self.head.dtype)
        return self.head.linear_bytes(hidden, vocab)

    def linear_bytes(self, in_features: int, out_features: int) -> int:
        """Bytes of one ``in_features x out_features`` weight matrix under this scheme."""
        groups = out_features * (1 if self.group_size is None else math.ceil(in_features / self.group_size))
        return math.ceil(in_features * out_features * self.bits / 8 + groups * self.overhead_bytes)


#: ``+head8`` / ``+head16``: the scheme specdec.quant applies to the LM head
_HEAD_SCHEMES = {"int8": "int8-weight-only", "bf16": "bf16"}


def parse_quant(spec: str | QuantScheme | None, device: Any = "cpu") -> QuantScheme | None:
    """A weight quantization scheme, in specdec.quant's grammar ``BASE[:gN][+head|+head8|+head16]``.

    ``None``/``"none"`` mean no quantization. ``fp32``, ``bf16``, ``fp16`` convert the weights to that
    dtype; ``int8``, ``int8-dynamic``, ``int8-weight-only``, ``int4`` (groups of 32 unless ``:gN``,
    e.g. ``int4:g128``), ``nf4``, ``fp4`` quantize the linear layers; see
    :data:`specdec.quant.schemes.SCHEMES`. The LM head is quantized unless ``+head`` is appended,
    as in :func:`specdec.quant.quantize`. ``device`` (``"cpu"``, ``"cuda"``) picks the compute dtype,
    which can differ per device (int8: bf16 on CPU, fp16 on CUDA).

    Raises:
        ValueError: unknown scheme (the message lists the accepted forms), or one with no backend
            on ``device``.
    """
    if spec is None or isinstance(spec, QuantScheme):
        return spec
    if str(spec).strip().lower() == "none":
        return None
    try:
        parsed = parse_scheme(str(spec))
    except UnknownSchemeError as exc:
        raise ValueError(f"unknown weight quantization {spec!r}: {exc}") from None
    head = _scheme(_HEAD_SCHEMES[parsed.head], None, False, None, device) if parsed.head in _HEAD_SCHEMES else None
    return _scheme(parsed.base, parsed.group_size, parsed.keep_head, head, device, name=parsed.canonical())


def _scheme(base: str, group: int | None, keep_head: bool, head: QuantScheme | None, device: Any,
            name: str | None = None) -> QuantScheme:
    info = SCHEMES[base]
    compute = info.compute_dtype(device)
    if compute is None:
        raise ValueError(f"quantization scheme {base!r} has no backend on {device_type(device)!r}; "
                         f"it runs on {', '.join(sorted(info.compute_dtypes))}")
    return QuantScheme(
        name=name or base,
        bits=info.bits,
        group_size=group if group is not None else info.block_size,
        overhead_bytes=info.overhead_bytes,
        quantize_head=not keep_head,
        dtype=info.cast_dtype,
        compute_dtype=compute,
        head=head,
    )


# Families whose blocks use LayerNorm with a bias (2 x width parameters) and a non-gated MLP.
_LAYERNORM_FAMILIES = {"gpt2", "gpt_neox", "gptj", "gpt_neo", "falcon", "gpt_bigcode", "phi", "opt", "bloom",
                       "starcoder2", "stablelm"}
_NON_GATED_MLP = {"gpt2", "gpt_neox", "gptj", "gpt_neo", "falcon", "gpt_bigcode", "phi", "opt", "bloom",
                  "starcoder2"}
_QKV_BIAS_FAMILIES = {"qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl"}
_QK_NORM_FAMILIES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}
_FOUR_NORM_FAMILIES = {"gemma2", "gemma3", "gemma3_text"}


@dataclass(frozen=True)
class _Linear:
    in_features: int
    out_features: int
    count: int
    part: str  # breakdown category


def _weight_model(config: ConfigLike) -> tuple[list[_Linear], dict[str, int]]:
    """The decoder's quantizable linear weights and its other parameters (embedding, LM head,
    norms, biases, routers), counted from the config the way the transformers module builds them."""
    cfg = resolve(config)
    a = arch(cfg)
    linears: list[_Linear] = []
    other: dict[str, int] = {"embedding": a.vocab * a.hidden, "norms": 0, "lm_head": 0, "router": 0, "biases": 0}
    norm = 2 * a.hidden if a.model_type in _LAYERNORM_FAMILIES else a.hidden
    if a.model_type in ("gpt2", "gpt_neo", "opt"):
        other["embedding"] += int(get_field(cfg, "n_positions", "max_position_embeddings", default=0)) * a.hidden
    if not a.tied:
        other["lm_head"] = a.vocab * a.hidden
    other["norms"] += norm  # final norm
    _attention(cfg, a, norm, linears, other)
    _mlp(cfg, a, linears, other)
    return linears, other


def _attention(cfg: Any, a: Arch, norm: int, linears: list[_Linear], other: dict[str, int]) -> None:
    mt, h, L = a.model_type, a.hidden, a.num_layers
    n_attn = sum(1 for k, _ in layer_kinds(cfg, L) if k != "none")
    norms_per_layer = 4 if mt in _FOUR_NORM_FAMILIES else 2
    if mt == "falcon" and not get_field(cfg, "new_decoder_architecture"):
        norms_per_layer = 1  # Falcon-7B: one input norm shared by the parallel attention and MLP
    other["norms"] += L * norms_per_layer * norm
    attn_bias = bool(get_field(cfg, "attention_bias", default=mt in ("gpt2", "gpt_neox", "gpt_bigcode")))
    if mt == "falcon":
        attn_bias = bool(get_field(cfg, "bias", default=False))
    if a.mla is not None:
        m = a.mla
        qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        if m["q_lora_rank"]:
            linears.append(_Linear(h, m["q_lora_rank"], n_attn, "attention"))
            linears.append(_Linear(m["q_lora_rank"], a.heads * qk, n_attn, "attention"))
            other["norms"] += n_attn * m["q_lora_rank"]
            other["biases"] += n_attn * m["q_lora_rank"] * attn_bias
        else:
            linears.append(_Linear(h, a.heads * qk, n_attn, "attention"))
        linears.append(_Linear(h, m["kv_lora_rank"] + m["qk_rope_head_dim"], n_attn, "attention"))
        linears.append(_Linear(m["kv_lora_rank"], a.heads * (m["qk_nope_head_dim"] + m["v_head_dim"]), n_attn, "attention"))
        linears.append(_Linear(a.heads * m["v_head_dim"], h, n_attn, "attention"))
        other["norms"] += n_attn * m["kv_lora_rank"]
        other["biases"] += n_attn * (m["kv_lora_rank"] + m["qk_rope_head_dim"] + h) * attn_bias
        return
    q_out, kv_out = a.heads * a.head_dim, a.kv_heads * a.head_dim
    linears.append(_Linear(h, q_out + 2 * kv_out, n_attn, "attention"))  # q, k, v (fused or not: same bytes)
    linears.append(_Linear(q_out, h, n_attn, "attention"))
    if mt in _QKV_BIAS_FAMILIES:
        other["biases"] += n_attn * (q_out + 2 * kv_out)
    elif attn_bias:
        other["biases"] += n_attn * (q_out + 2 * kv_out + h)
    if mt in _QK_NORM_FAMILIES:
        other["norms"] += n_attn * 2 * a.head_dim


def _mlp(cfg: Any, a: Arch, linears: list[_Linear], other: dict[str, int]) -> None:
    """Dense MLPs, or a mixture of experts (routed, shared experts and routers)."""
    mt, h, L = a.model_type, a.hidden, a.num_layers
    gated = mt not in _NON_GATED_MLP
    mlp_bias = bool(get_field(cfg, "mlp_bias", default=mt in _NON_GATED_MLP and mt != "falcon"))
    if mt == "falcon":
        mlp_bias = bool(get_field(cfg, "bias", default=False))

    def dense(width: int, count: int, part: str) -> None:
        if count <= 0 or width <= 0:
            return
        if gated:
            linears.append(_Linear(h, 2 * width, count, part))  # gate and up
            other["biases"] += count * (2 * width + h) * mlp_bias
        else:
            linears.append(_Linear(h, width, count, part))
            other["biases"] += count * (width + h) * mlp_bias
        linears.append(_Linear(width, h, count, part))

    n_experts = get_field(cfg, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
    if not n_experts:
        dense(a.intermediate, L, "mlp")
        return
    n_experts = int(n_experts)
    moe_width = int(get_field(cfg, "moe_intermediate_size", default=a.intermediate))
    moe_layers = _moe_layers(cfg, mt, L)
    dense(a.intermediate, L - moe_layers, "mlp")
    dense(moe_width, moe_layers * n_experts, "experts")
    other["router"] += moe_layers * n_experts * h
    shared = int(get_field(cfg, "n_shared_experts", default=0) or 0)
    if shared:
        dense(moe_width * shared, moe_layers, "experts")  # DeepSeek: one MLP `shared` experts wide
    shared_width = int(get_field(cfg, "shared_expert_intermediate_size", default=0) or 0)
    if shared_width:
        dense(shared_width, moe_layers, "experts")  # Qwen2-MoE shared expert and its gate
        other["router"] += moe_layers * h


def _moe_layers(cfg: Any, mt: str, num_layers: int) -> int:
    if mt in ("deepseek_v2", "deepseek_v3"):
        first_dense = int(get_field(cfg, "first_k_dense_replace", default=0) or 0)
        freq = int(get_field(cfg, "moe_layer_freq", default=1) or 1)
        return sum(1 for i in range(first_dense, num_layers) if i % freq == 0)
    if mt in ("qwen2_moe", "qwen3_moe"):
        step = int(get_field(cfg, "decoder_sparse_step", default=1) or 1)
        dense_only = set(get_field(cfg, "mlp_only_layers", default=[]) or [])
        return sum(1 for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
    return num_layers


def param_breakdown(config: ConfigLike) -> dict[str, int]:
    """Parameter count by part: embedding, attention, mlp, experts, router, norms, biases, lm_head."""
    linears, other = _weight_model(config)
    out = {"embedding": other["embedding"], "attention": 0, "mlp": 0, "experts": 0}
    for lin in linears:
        out[lin.part] += lin.in_features * lin.out_features * lin.count
    for key in ("router", "norms", "biases", "lm_head"):
        out[key] = other[key]
    return out


def param_count(config: ConfigLike) -> int:
    """Total parameters of the decoder (tied embeddings counted once; vision towers not included)."""
    return sum(param_breakdown(config).values())


def weight_bytes(config: ConfigLike, dtype: Any = "bfloat16", quant: str | QuantScheme | None = None) -> int:
    """Bytes of the decoder's weights loaded in ``dtype``, with the blocks' linear layers (and the
    LM head, unless the scheme says ``+head``) quantized by ``quant`` when given.

    Approximation: under quantization the embedding, norms, biases and MoE routers stay in
    ``dtype``; a quantized head of a model with tied embeddings is an extra matrix beside the
    embedding table. Quantization overhead is modelled per :class:`QuantScheme`. Buffers (rotary
    tables), vision towers and allocator padding are not counted. Without quantization the count
    is exact to the parameter for the families tested (Llama, Mistral, Mixtral, Qwen2/3,
    Gemma 2/3, Phi-3, DeepSeek-V3, GPT-2, GPT-NeoX).
    """
    scheme = parse_quant(quant)
    if scheme is not None and scheme.dtype is not None:
        return weight_bytes(config, scheme.dtype, None)
    base = dtype_bytes(dtype)
    linears, other = _weight_model(config)
    if scheme is None:
        return (sum(other.values()) + sum(l.in_features * l.out_features * l.count for l in linears)) * base
    total = sum(v for k, v in other.items() if k != "lm_head") * base
    total += sum(scheme.linear_bytes(l.in_features, l.out_features) * l.count for l in linears)
    if scheme.quantize_head:
        a = arch(config)
        total += scheme.head_bytes(a.hidden, a.vocab)
    else:
        total += other["lm_head"] * base
    return int(total)


def copy_weight_bytes(config: ConfigLike, dtype: Any, quant: str | QuantScheme | None, device: Any = "cpu",
                      int8_packing: str | None = None) -> int:
    """Bytes a quantized *copy* of a model loaded in ``dtype`` adds beside the original, the way
    :func:`specdec.quant.quantize` builds it on ``device``: the copy shares the embedding table (and
    every tensor the scheme leaves unchanged) with the source; only converted or quantized tensors
    are new.

    Norms, biases and routers are new tensors only when the scheme computes in another dtype than
    the source (``bf16``, ``int4``, ``nf4`` copies of an fp32 model). Buffers are not counted.

    ``int8_packing``: the engine ``int8-dynamic`` packs for (:func:`specdec.quant.int8_dynamic_packing`; this
    module imports no torch, so the caller asks). ``"qnnpack"`` (CPUs without VNNI) keeps a float32 bias of every
    output row in each packed matrix, the head's included; the default counts fbgemm / oneDNN's layout, which
    shares the model's biases.
    """
    scheme = parse_quant(quant, device)
    if scheme is None:
        return 0
    linears, other = _weight_model(config)
    a = arch(config)
    if scheme.dtype is not None:
        if scheme.dtype == dtype_name(dtype):
            return 0
        size = dtype_bytes(scheme.dtype)
        blocks = sum(l.in_features * l.out_features * l.count for l in linears) * size
        # The head is converted too (a tied head becomes its own converted matrix) unless kept.
        head = a.hidden * a.vocab * size if scheme.quantize_head else 0
        return blocks + head + _converted_small(other, dtype, scheme.dtype)
    blocks = sum(scheme.linear_bytes(l.in_features, l.out_features) * l.count for l in linears)
    head = scheme.head_bytes(a.hidden, a.vocab) if scheme.quantize_head else 0
    if int8_packing == "qnnpack" and scheme.name.split("+")[0] == "int8-dynamic":  # a float32 bias per output row
        blocks += 4 * sum(l.out_features * l.count for l in linears)
        head += 4 * a.vocab if scheme.quantize_head and scheme.head is None else 0
    return blocks + head + _converted_small(other, dtype, scheme.compute_dtype)


def _converted_small(other: dict[str, int], source: Any, compute: str | None) -> int:
    """Norms, biases and routers a copy converts to its compute dtype (0 when it is the source's)."""
    if compute is None or dtype_name(compute) == dtype_name(source):
        return 0
    return (other["norms"] + other["biases"] + other["router"]) * dtype_bytes(compute)
