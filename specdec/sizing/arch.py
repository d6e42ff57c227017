"""The numbers of a decoder that sizing needs, read once from any config flavour, and its layer kinds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec.sizing.configs import ConfigLike, get_field, max_positions, model_name, resolve

_FULL_TYPES = {"full_attention", "attention", "full", "global", "global_attention", "hybrid"}
_SLIDING_TYPES = {"sliding_attention", "sliding", "local", "local_attention", "window_attention", "hybrid_sliding"}
_CHUNKED_TYPES = {"chunked_attention"}
_NO_KV_TYPES = {"linear_attention", "mamba", "mamba2", "conv", "recurrent", "rwkv", "ssm", "deltanet"}


@dataclass(frozen=True)
class Arch:
    """Layer count, widths, head counts and the MLA ranks (``mla``, DeepSeek-V2/V3) of a decoder."""

    name: str
    model_type: str
    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    tied: bool
    max_positions: int | None
    mla: dict[str, int] | None


def arch(config: ConfigLike) -> Arch:
    """Read :class:`Arch` from ``config`` (any form :func:`~specdec.sizing.configs.resolve` takes)."""
    cfg = resolve(config)
    model_type = str(get_field(cfg, "model_type", default="") or "")
    layers = get_field(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = get_field(cfg, "hidden_size", "n_embd", "d_model", "dim")
    heads = get_field(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    if not (layers and hidden and heads):
        raise ValueError(
            f"config of {model_type or 'unknown type'} lacks the layer count, hidden size or head count "
            "(num_hidden_layers/n_layer, hidden_size/n_embd, num_attention_heads/n_head)"
        )
    layers, hidden, heads = int(layers), int(hidden), int(heads)
    if get_field(cfg, "num_kv_shared_layers"):
        raise ValueError(f"{model_type}: layers that share another layer's KV cache are not supported by the planner")
    head_dim = get_field(cfg, "head_dim", "attention_head_dim")
    head_dim = int(head_dim) if head_dim else hidden // heads
    inter = get_field(cfg, "intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")
    tied = get_field(cfg, "tie_word_embeddings")
    return Arch(
        name=model_name(cfg),
        model_type=model_type,
        num_layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=_kv_heads(cfg, model_type, heads),
        head_dim=head_dim,
        vocab=int(get_field(cfg, "vocab_size", "n_vocab", "padded_vocab_size", default=0)),
        intermediate=int(inter) if inter else 4 * hidden,
        tied=bool(model_type in ("gpt2",) if tied is None else tied),
        max_positions=max_positions(cfg),
        mla=_mla(cfg, head_dim),
    )


def _mla(cfg: Any, head_dim: int) -> dict[str, int] | None:
    if not (get_field(cfg, "kv_lora_rank") and get_field(cfg, "qk_rope_head_dim")):
        return None
    return {
        "kv_lora_rank": int(get_field(cfg, "kv_lora_rank")),
        "qk_rope_head_dim": int(get_field(cfg, "qk_rope_head_dim")),
        "qk_nope_head_dim": int(get_field(cfg, "qk_nope_head_dim", default=0)),
        "v_head_dim": int(get_field(cfg, "v_head_dim", default=head_dim)),
        "q_lora_rank": int(get_field(cfg, "q_lora_rank", default=0) or 0),
    }


def _kv_heads(cfg: Any, model_type: str, heads: int) -> int:
    if model_type == "falcon":
        # Falcon-7B: multi_query without the new decoder = 1 KV head; Falcon-40B/180B: num_kv_heads.
        if get_field(cfg, "new_decoder_architecture") or not get_field(cfg, "multi_query", default=True):
            return int(get_field(cfg, "num_kv_heads", default=heads))
        return 1
    value = get_field(cfg, "num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_head_kv", "multi_query_group_num")
    if value:
        return int(value)
    if get_field(cfg, "multi_query"):  # GPT-BigCode / StarCoder
        return 1
    return heads  # plain multi-head attention (GPT-2, GPT-NeoX, Llama-2-7B written without the field)


def layer_kinds(cfg: Any, num_layers: int) -> list[tuple[str, int | None]]:
    """``(kind, window)`` per layer: ``full``, ``sliding``, ``chunked`` or ``none`` (no KV cache).

    From ``layer_types`` when the config has them, else from ``sliding_window`` and its pattern.

    Raises:
        ValueError: a layer type the planner does not know (it refuses rather than guesses).
    """
    window = get_field(cfg, "sliding_window", "window_size", "attention_window_size")
    window = int(window) if window else None
    if get_field(cfg, "use_sliding_window") is False:
        window = None
    types = get_field(cfg, "layer_types")
    if types is None and get_field(cfg, "layers_block_type") is not None:
        types = get_field(cfg, "layers_block_type")
    if types is not None:
        types = list(types)
        if len(types) != num_layers:
            raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
        return [_layer_kind(cfg, str(t).lower(), window) for t in types]
    if window is None:
        return [("full", None)] * num_layers
    pattern = get_field(cfg, "sliding_window_pattern", "_sliding_window_pattern")
    if pattern and int(pattern) > 1:
        return [("full", None) if (i + 1) % int(pattern) == 0 else ("sliding", window) for i in range(num_layers)]
    return [("sliding", window)] * num_layers  # Mistral v0.1, Phi-3 4k: every layer slides


def _layer_kind(cfg: Any, t: str, window: int | None) -> tuple[str, int | None]:
    if t in _FULL_TYPES:
        return ("full", None)
    if t in _SLIDING_TYPES:
        # Qwen2 lists sliding layers even when use_sliding_window is off; with no window the layer
        # attends to everything.
        return ("full", None) if window is None else ("sliding", window)
    if t in _CHUNKED_TYPES:
        chunk = get_field(cfg, "attention_chunk_size")
        return ("chunked", int(chunk)) if chunk else ("full", None)
    if t in _NO_KV_TYPES:
        return ("none", None)
    raise ValueError(
        f"layer type {t!r} is not understood by the planner (known: full/sliding/chunked "
        f"attention and no-KV {sorted(_NO_KV_TYPES)})"
    )
