"""Model configs: load one from any accepted form, read fields whatever their spelling, and the
decoder's numbers (:class:`Arch`) and layer kinds that sizing counts with.

The planner reads a preset as its plain dict, so ``specdec plan PRESET`` imports neither
transformers nor torch. A ``config.json`` (or a dict) from elsewhere goes through transformers'
``AutoConfig``, whose per-family defaults (sliding windows, layer types, KV heads) it relies on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Union

from specdec.sizing.presets import get_preset, preset_names

if TYPE_CHECKING:  # transformers is imported lazily: `specdec plan` should start fast
    from transformers import PretrainedConfig

ConfigLike = Union["PretrainedConfig", Mapping[str, Any], str, os.PathLike]


def load_config(spec: ConfigLike) -> "PretrainedConfig":
    """A transformers config from a config object, a dict, a ``config.json`` path (or a directory
    holding one), or a preset name (see :mod:`specdec.sizing.presets`). Never downloads anything.

    Raises:
        ValueError: when ``spec`` is neither an existing path nor a known preset (the message lists
            the presets), or the file is not a JSON object.
    """
    from transformers import PretrainedConfig

    if isinstance(spec, PretrainedConfig):
        return spec
    if isinstance(spec, Mapping):
        return _config_from_dict(dict(spec), None)
    if isinstance(spec, (str, os.PathLike)):
        path = _config_path(spec)
        if path is not None:
            return _config_from_dict(_read_json(path), str(spec))
        if isinstance(spec, str):
            return _config_from_dict(_preset(spec), spec.strip().lower())
        raise ValueError(f"no such config file or directory: {spec!s}")
    raise TypeError(f"cannot load a config from {type(spec).__name__}")


class PresetConfig(dict):
    """A preset's fields as a plain dict, already resolved: read as they are, without transformers."""


def resolve(config: ConfigLike) -> Any:
    """The decoder config behind any accepted form: a preset stays a plain dict (no transformers),
    a path or dict becomes a transformers config, a config object is used as it is."""
    if isinstance(config, PresetConfig):
        return config
    if isinstance(config, str) and _config_path(config) is None:
        data = PresetConfig(_preset(config))
        data["_name_or_path"] = config.strip().lower()  # the name load_config gives it
        return data
    if isinstance(config, (str, os.PathLike, Mapping)):
        config = load_config(config)
    return text_config(config)


def _config_path(spec: str | os.PathLike) -> Path | None:
    """The ``config.json`` that ``spec`` names (a file, or a directory holding one), None if no such path."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ValueError(f"{spec!s} is a directory without a config.json")
    return path if path.is_file() else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _preset(name: str) -> dict[str, Any]:
    try:
        return get_preset(name)
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}: not a preset and no such config.json or directory. "
            f"Presets: {', '.join(preset_names())}"
        ) from None


def _config_from_dict(data: dict[str, Any], name: str | None) -> "PretrainedConfig":
    from transformers import AutoConfig, PretrainedConfig

    data = dict(data)
    model_type = data.pop("model_type", None)
    config = None
    if model_type:
        try:
            config = AutoConfig.for_model(model_type, **data)
        except Exception:  # unknown to this transformers version, or fails its validation
            config = None
    if config is None:
        # Keep the raw fields; set them after construction so that transformers' validators (e.g. of
        # layer_types) cannot stop the planner from reading them and refusing clearly itself.
        config = PretrainedConfig()
        for key, value in data.items():
            try:
                setattr(config, key, value)
            except Exception:
                object.__setattr__(config, key, value)
        if model_type:
            config.model_type = model_type  # instance attribute: PretrainedConfig's is ""
    if name:
        config.name_or_path = name
    return config


def text_config(config: Any) -> Any:
    """The decoder's config of a multimodal config (Gemma 3, Llava, ...), else the config itself."""
    if isinstance(config, Mapping):
        inner = config.get("text_config")
        return inner if isinstance(inner, Mapping) else config
    getter = getattr(config, "get_text_config", None)
    if callable(getter):
        try:
            return getter(decoder=True)
        except TypeError:
            return getter()
    return config


def get_field(config: Any, *names: str, default: Any = None) -> Any:
    """The first of ``names`` that ``config`` (object or dict) sets to something other than None."""
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return default


def model_name(config: Any, fallback: str = "model") -> str:
    """The name a plan shows for ``config``: its path or preset name, else its model type."""
    name = get_field(config, "name_or_path", "_name_or_path")
    if name:
        return str(name)
    return str(get_field(text_config(config), "model_type", default=fallback) or fallback)


def max_positions(config: Any) -> int | None:
    """The model's maximum context (``max_position_embeddings`` or its other spellings), if set."""
    cfg = text_config(config)
    value = get_field(cfg, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    return int(value) if value else None


def is_self_draft(verifier: Any, drafter: Any) -> bool:
    """Whether the drafter is a copy of the verifier (``"self"``, or the same spec/object)."""
    if drafter is None:
        return False
    if isinstance(drafter, str) and drafter.strip().lower() == "self":
        return True
    if drafter is verifier:
        return True
    if isinstance(drafter, (str, os.PathLike)) and isinstance(verifier, (str, os.PathLike)):
        return str(drafter).strip().lower() == str(verifier).strip().lower()
    return False


# Layer types as configs spell them (``layer_types``), by the kind of cache they keep.
_FULL_TYPES = {"full_attention", "attention", "full", "global", "global_attention", "hybrid"}
_SLIDING_TYPES = {"sliding_attention", "sliding", "local", "local_attention", "window_attention", "hybrid_sliding"}
_CHUNKED_TYPES = {"chunked_attention"}
_NO_KV_TYPES = {"linear_attention", "mamba", "mamba2", "conv", "recurrent", "rwkv", "ssm", "deltanet"}
_ATTENTION_FREE = {"mamba", "falcon_mamba"}  # Mamba-1 models: recurrent layers only
_STATELESS_TYPES = {"mlp", "moe", "dummy"}  # MLP/MoE-only blocks (nemotron_h): no attention, no state


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
    """Read :class:`Arch` from ``config`` (any form :func:`resolve` takes)."""
    cfg = resolve(config)
    model_type = str(get_field(cfg, "model_type", default="") or "")
    layers = get_field(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = get_field(cfg, "hidden_size", "n_embd", "d_model", "dim")
    heads = get_field(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    if not heads and model_type in _ATTENTION_FREE:  # no attention layer: no head is ever counted
        heads = 1
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
    if t in _NO_KV_TYPES or t in _STATELESS_TYPES:
        return ("none", None)
    raise ValueError(
        f"layer type {t!r} is not understood by the planner (known: full/sliding/chunked "
        f"attention and no-KV {sorted(_NO_KV_TYPES)})"
    )
