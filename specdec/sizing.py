"""GQA-aware KV-cache sizing and a memory planner for speculative decoding.

The KV cache, not the weights, decides how many sequences and how much context fit. Per token and
per attention layer a cache stores one key and one value vector for every *key/value* head::

    bytes/token = sum over layers of (k_heads * k_dim + v_heads * v_dim) * bytes_per_element
                = 2 * layers * num_key_value_heads * head_dim * bytes       (plain GQA model)

Grouped-query (GQA) and multi-query (MQA) attention share one K/V head between several query
heads, so counting ``num_attention_heads`` overstates the cache by the group factor (4x for
Mistral-7B and Llama-3-8B). This module never does that; :func:`naive_kv_bytes_per_token` shows
the mistaken figure for comparison only.

Layer kinds: ``full`` attention layers hold every token; ``sliding`` (and ``chunked``) layers
need at most their window in a serving cache; ``mla`` layers (DeepSeek-V2/V3 multi-head latent
attention) store one compressed latent of ``kv_lora_rank`` plus one rope key of
``qk_rope_head_dim`` per token, not per head; ``none`` layers (linear attention, Mamba and other
recurrent layers of hybrid models) keep a fixed-size state and no per-token cache.

specdec's own :class:`~specdec.verifiers.cache.ManagedCache` keeps the *whole* context on every
layer, sliding ones included, so that rollback is a pointer move; :func:`managed_cache_bytes` is
exactly what it allocates, and the planner budgets with it.

Public API: :func:`load_config`, :func:`kv_layout`, :func:`kv_profile`, :func:`kv_bytes_per_token`,
:func:`kv_bytes_per_sequence`, :func:`kv_cache_bytes`, :func:`naive_kv_bytes_per_token`,
:func:`managed_cache_bytes`, :func:`param_breakdown`, :func:`param_count`, :func:`weight_bytes`,
:func:`copy_weight_bytes`,
:func:`parse_quant`, :func:`parse_memory`, :func:`available_memory`, :func:`activation_bytes`,
:func:`cache_len`, :func:`check_fits`, :func:`plan`, :class:`Plan`, :class:`PlanError`,
:func:`add_plan_arguments`, :func:`run_plan`.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

from specdec.presets import PRESETS, get_preset, preset_names

if TYPE_CHECKING:  # transformers is imported lazily: `specdec plan` should start fast
    from transformers import PretrainedConfig

__all__ = [
    "ConfigLike",
    "FitCheck",
    "KVProfile",
    "LayerKV",
    "Plan",
    "PlanError",
    "QuantScheme",
    "activation_bytes",
    "add_plan_arguments",
    "available_memory",
    "cache_len",
    "check_fits",
    "copy_weight_bytes",
    "dtype_bytes",
    "dtype_name",
    "format_bytes",
    "kv_bytes_per_sequence",
    "kv_bytes_per_token",
    "kv_bytes_per_token_by_type",
    "kv_cache_bytes",
    "kv_layout",
    "kv_profile",
    "load_config",
    "managed_cache_bytes",
    "naive_kv_bytes_per_token",
    "param_breakdown",
    "param_count",
    "parse_memory",
    "parse_quant",
    "plan",
    "run_plan",
    "weight_bytes",
]

ConfigLike = Union["PretrainedConfig", Mapping[str, Any], str, os.PathLike]

GiB = 1 << 30
DEFAULT_CONTEXT = 4096
DEFAULT_RUNTIME_RESERVE = GiB


class PlanError(MemoryError):
    """A request does not fit in memory. The message says what to change.

    ``plan`` holds the :class:`Plan` computed before giving up, when there is one.
    """

    def __init__(self, message: str, plan: "Plan | None" = None) -> None:
        super().__init__(message)
        self.plan = plan


# --------------------------------------------------------------------------------------------
# dtypes and sizes
# --------------------------------------------------------------------------------------------

_DTYPE_ALIASES: dict[str, tuple[str, int]] = {
    "float64": ("float64", 8), "fp64": ("float64", 8), "double": ("float64", 8),
    "float32": ("float32", 4), "fp32": ("float32", 4), "float": ("float32", 4), "f32": ("float32", 4),
    "float16": ("float16", 2), "fp16": ("float16", 2), "half": ("float16", 2), "f16": ("float16", 2),
    "bfloat16": ("bfloat16", 2), "bf16": ("bfloat16", 2),
    "float8": ("float8", 1), "fp8": ("float8", 1), "float8_e4m3fn": ("float8", 1),
    "float8_e5m2": ("float8", 1), "float8_e4m3fnuz": ("float8", 1), "float8_e5m2fnuz": ("float8", 1),
    "int8": ("int8", 1), "uint8": ("int8", 1), "qint8": ("int8", 1),
}


def _dtype_key(dtype: Any) -> str:
    text = str(dtype).strip().lower()
    return text[len("torch."):] if text.startswith("torch.") else text


def dtype_name(dtype: Any) -> str:
    """Canonical name (``float32``, ``bfloat16``, ...) of a dtype given as string or ``torch.dtype``."""
    key = _dtype_key(dtype)
    if key not in _DTYPE_ALIASES:
        raise ValueError(
            f"unknown dtype {dtype!r}; use one of float32, float16, bfloat16, float8, int8 (or torch dtypes)"
        )
    return _DTYPE_ALIASES[key][0]


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as a string (``"bf16"``, ``"float32"``) or ``torch.dtype``."""
    dtype_name(dtype)  # validates with a helpful message
    return _DTYPE_ALIASES[_dtype_key(dtype)][1]


_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_memory(value: int | float | str) -> int:
    """Bytes from a size: ``"80GiB"``, ``"24GB"`` (SI, 10^9), ``"512MiB"``, ``"1.5TiB"``, or a plain int.

    Binary units (KiB/MiB/GiB/TiB, or Ki/Mi/Gi/Ti) are powers of 1024, SI units (KB/MB/GB/TB)
    powers of 1000. Bare ``K/M/G/T`` are refused as ambiguous.

    Raises:
        ValueError: for an empty, negative, non-numeric or unit-less-but-fractional value, or an
            unknown unit.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a memory size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory size must not be negative: {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise ValueError(f"not a whole, non-negative number of bytes: {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"not a memory size: {value!r}")
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(f"cannot parse memory size {value!r}; write e.g. 80GiB, 24GB, 512MiB or 1073741824")
    number, unit = match.group(1), match.group(2).lower()
    if unit in ("k", "m", "g", "t"):
        raise ValueError(f"ambiguous unit in {value!r}: write {number}{unit.upper()}iB (binary) or {number}{unit.upper()}B (SI)")
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in {value!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")
    amount = float(number) * _UNITS[unit]
    if not math.isfinite(amount):
        raise ValueError(f"memory size out of range: {value!r}")
    return int(round(amount))


def format_bytes(n: int | float | None) -> str:
    """Human-readable binary size (``"14.96 GiB"``)."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"


def available_memory(device: Any = None) -> int:
    """Free memory in bytes on ``device``: ``torch.cuda.mem_get_info`` for CUDA, otherwise
    available system RAM (psutil when installed, else ``/proc/meminfo``), also bounded by a
    cgroup memory limit when the process runs under one."""
    dev = "cpu" if device is None else str(device)
    if dev.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(dev))
        return int(free)
    try:
        import psutil

        avail = int(psutil.virtual_memory().available)
    except ImportError:
        avail = _meminfo_available()
    limit = _cgroup_free()
    return min(avail, limit) if limit is not None else avail


def _meminfo_available() -> int:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    for key in ("MemAvailable", "MemFree"):
        if key in fields:
            return int(fields[key].split()[0]) * 1024  # kB
    raise OSError("cannot read available memory from /proc/meminfo")


def _cgroup_free() -> int | None:
    # Containers often see the host's MemAvailable; the cgroup limit is the real ceiling.
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit_text = Path(limit_path).read_text().strip()
            usage = int(Path(usage_path).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit_text == "max" or int(limit_text) >= 1 << 60:
            return None
        return max(0, int(limit_text) - usage)
    return None


# --------------------------------------------------------------------------------------------
# configs
# --------------------------------------------------------------------------------------------


def load_config(spec: ConfigLike) -> "PretrainedConfig":
    """A transformers config from a config object, a dict, a ``config.json`` path (or a directory
    holding one), or a preset name (see :mod:`specdec.presets`). Never downloads anything.

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
        path = Path(spec).expanduser()
        if path.is_dir():
            path = path / "config.json"
            if not path.is_file():
                raise ValueError(f"{spec!s} is a directory without a config.json")
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} is not valid JSON: {exc}") from exc
            if not isinstance(data, dict):
                raise ValueError(f"{path} does not hold a JSON object")
            return _config_from_dict(data, str(spec))
        if isinstance(spec, str):
            try:
                data = get_preset(spec)
            except KeyError:
                raise ValueError(
                    f"unknown model {spec!r}: not a preset and no such config.json or directory. "
                    f"Presets: {', '.join(preset_names())}"
                ) from None
            return _config_from_dict(data, spec.strip().lower())
        raise ValueError(f"no such config file or directory: {spec!s}")
    raise TypeError(f"cannot load a config from {type(spec).__name__}")


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


def _text_config(config: Any) -> Any:
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


def _resolve(config: ConfigLike) -> Any:
    """The decoder config object behind any accepted config form."""
    if isinstance(config, (str, os.PathLike, Mapping)):
        config = load_config(config)
    return _text_config(config)


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return default


def _model_name(config: Any, fallback: str = "model") -> str:
    name = _get(config, "name_or_path", "_name_or_path")
    if name:
        return str(name)
    return str(_get(_text_config(config), "model_type", default=fallback) or fallback)


def _max_positions(config: Any) -> int | None:
    cfg = _text_config(config)
    value = _get(cfg, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
    return int(value) if value else None


# --------------------------------------------------------------------------------------------
# KV layout
# --------------------------------------------------------------------------------------------

_FULL_TYPES = {"full_attention", "attention", "full", "global", "global_attention", "hybrid"}
_SLIDING_TYPES = {"sliding_attention", "sliding", "local", "local_attention", "window_attention", "hybrid_sliding"}
_CHUNKED_TYPES = {"chunked_attention"}
_NO_KV_TYPES = {"linear_attention", "mamba", "mamba2", "conv", "recurrent", "rwkv", "ssm", "deltanet"}


@dataclass(frozen=True)
class LayerKV:
    """What one decoder layer caches per token.

    ``kind`` is ``full``, ``sliding``, ``chunked``, ``mla`` or ``none``. Keys are ``k_heads`` vectors
    of ``k_dim`` elements, values ``v_heads`` of ``v_dim`` (an MLA layer: one latent of
    ``kv_lora_rank`` as the "key" and one rope key of ``qk_rope_head_dim`` as the "value", which is
    how transformers' DeepSeek-V2/V3 hand them to the cache). ``window`` bounds sliding/chunked
    layers.
    """

    kind: str
    k_heads: int = 0
    k_dim: int = 0
    v_heads: int = 0
    v_dim: int = 0
    window: int | None = None

    @property
    def elements_per_token(self) -> int:
        return self.k_heads * self.k_dim + self.v_heads * self.v_dim

    def tokens_held(self, context: int, cap: bool = True) -> int:
        """Tokens this layer must keep for a sequence of ``context`` tokens."""
        if self.kind == "none":
            return 0
        if cap and self.window and self.kind in ("sliding", "chunked"):
            return min(context, self.window)
        return context


@dataclass(frozen=True)
class _Arch:
    """The numbers of a decoder that sizing needs, read once from any config flavour."""

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


def _arch(config: ConfigLike) -> _Arch:
    cfg = _resolve(config)
    model_type = str(_get(cfg, "model_type", default="") or "")
    layers = _get(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = _get(cfg, "hidden_size", "n_embd", "d_model", "dim")
    heads = _get(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads")
    if not (layers and hidden and heads):
        raise ValueError(
            f"config of {model_type or 'unknown type'} lacks the layer count, hidden size or head count "
            "(num_hidden_layers/n_layer, hidden_size/n_embd, num_attention_heads/n_head)"
        )
    layers, hidden, heads = int(layers), int(hidden), int(heads)
    if _get(cfg, "num_kv_shared_layers"):
        raise ValueError(f"{model_type}: layers that share another layer's KV cache are not supported by the planner")
    kv_heads = _kv_heads(cfg, model_type, heads)
    head_dim = _get(cfg, "head_dim", "attention_head_dim")
    head_dim = int(head_dim) if head_dim else hidden // heads
    mla = None
    if _get(cfg, "kv_lora_rank") and _get(cfg, "qk_rope_head_dim"):
        mla = {
            "kv_lora_rank": int(_get(cfg, "kv_lora_rank")),
            "qk_rope_head_dim": int(_get(cfg, "qk_rope_head_dim")),
            "qk_nope_head_dim": int(_get(cfg, "qk_nope_head_dim", default=0)),
            "v_head_dim": int(_get(cfg, "v_head_dim", default=head_dim)),
            "q_lora_rank": int(_get(cfg, "q_lora_rank", default=0) or 0),
        }
    inter = _get(cfg, "intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")
    inter = int(inter) if inter else 4 * hidden
    tied = _get(cfg, "tie_word_embeddings")
    if tied is None:
        tied = model_type in ("gpt2",)
    return _Arch(
        name=_model_name(cfg),
        model_type=model_type,
        num_layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=int(_get(cfg, "vocab_size", "n_vocab", "padded_vocab_size", default=0)),
        intermediate=inter,
        tied=bool(tied),
        max_positions=_max_positions(cfg),
        mla=mla,
    )


def _kv_heads(cfg: Any, model_type: str, heads: int) -> int:
    if model_type == "falcon":
        # Falcon-7B: multi_query without the new decoder = 1 KV head; Falcon-40B/180B: num_kv_heads.
        if _get(cfg, "new_decoder_architecture") or not _get(cfg, "multi_query", default=True):
            return int(_get(cfg, "num_kv_heads", default=heads))
        return 1
    value = _get(cfg, "num_key_value_heads", "num_kv_heads", "n_kv_heads", "n_head_kv", "multi_query_group_num")
    if value:
        return int(value)
    if _get(cfg, "multi_query"):  # GPT-BigCode / StarCoder
        return 1
    return heads  # plain multi-head attention (GPT-2, GPT-NeoX, Llama-2-7B written without the field)


def _layer_kinds(cfg: Any, num_layers: int) -> list[tuple[str, int | None]]:
    window = _get(cfg, "sliding_window", "window_size", "attention_window_size")
    window = int(window) if window else None
    if _get(cfg, "use_sliding_window") is False:
        window = None
    types = _get(cfg, "layer_types")
    if types is None and _get(cfg, "layers_block_type") is not None:
        types = _get(cfg, "layers_block_type")
    if types is not None:
        types = list(types)
        if len(types) != num_layers:
            raise ValueError(f"layer_types has {len(types)} entries for {num_layers} layers")
        kinds: list[tuple[str, int | None]] = []
        for t in types:
            t = str(t).lower()
            if t in _FULL_TYPES:
                kinds.append(("full", None))
            elif t in _SLIDING_TYPES:
                if window is None:
                    # Qwen2 lists sliding layers even when use_sliding_window is off; with no window
                    # the layer attends to everything.
                    kinds.append(("full", None))
                else:
                    kinds.append(("sliding", window))
            elif t in _CHUNKED_TYPES:
                chunk = _get(cfg, "attention_chunk_size")
                kinds.append(("chunked", int(chunk)) if chunk else ("full", None))
            elif t in _NO_KV_TYPES:
                kinds.append(("none", None))
            else:
                raise ValueError(
                    f"layer type {t!r} is not understood by the planner (known: full/sliding/chunked "
                    f"attention and no-KV {sorted(_NO_KV_TYPES)})"
                )
        return kinds
    if window is None:
        return [("full", None)] * num_layers
    pattern = _get(cfg, "sliding_window_pattern", "_sliding_window_pattern")
    if pattern and int(pattern) > 1:
        return [("full", None) if (i + 1) % int(pattern) == 0 else ("sliding", window) for i in range(num_layers)]
    return [("sliding", window)] * num_layers  # Mistral v0.1, Phi-3 4k: every layer slides


def kv_layout(config: ConfigLike) -> list[LayerKV]:
    """Per-layer KV geometry of a config (see :class:`LayerKV`)."""
    cfg = _resolve(config)
    arch = _arch(cfg)
    out: list[LayerKV] = []
    for kind, window in _layer_kinds(cfg, arch.num_layers):
        if kind == "none":
            out.append(LayerKV("none"))
        elif arch.mla is not None:
            # One latent and one shared rope key per token, whatever the head count: no factor 2 x heads.
            out.append(LayerKV("mla", 1, arch.mla["kv_lora_rank"], 1, arch.mla["qk_rope_head_dim"], window))
        else:
            out.append(LayerKV(kind, arch.kv_heads, arch.head_dim, arch.kv_heads, arch.head_dim, window))
    return out


@dataclass(frozen=True)
class KVProfile:
    """KV bytes per token of one model for one KV dtype, split by layer kind."""

    model: str
    dtype: str
    bytes_per_element: int
    layers: dict[str, int]
    bytes_per_token_by_type: dict[str, int]
    windows: dict[str, int | None]
    bytes_per_token: int
    naive_bytes_per_token: int
    kv_heads: int
    query_heads: int
    head_dim: int
    layout: tuple[LayerKV, ...] = field(repr=False, default=())

    def per_sequence(self, context: int, cap_sliding: bool = True) -> int:
        """Bytes one sequence of ``context`` tokens needs (sliding layers capped at their window)."""
        return sum(l.elements_per_token * l.tokens_held(context, cap_sliding) for l in self.layout) * self.bytes_per_element

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("layout")
        return d


def kv_profile(config: ConfigLike, dtype: Any = "bfloat16") -> KVProfile:
    """Per-token KV bytes of ``config`` in ``dtype``, by layer kind, and the naive query-head figure."""
    cfg = _resolve(config)
    arch = _arch(cfg)
    layout = tuple(kv_layout(cfg))
    nbytes = dtype_bytes(dtype)
    layers: dict[str, int] = {}
    by_type: dict[str, int] = {}
    windows: dict[str, int | None] = {}
    for l in layout:
        layers[l.kind] = layers.get(l.kind, 0) + 1
        by_type[l.kind] = by_type.get(l.kind, 0) + l.elements_per_token * nbytes
        if l.window:
            windows[l.kind] = l.window
    return KVProfile(
        model=arch.name,
        dtype=dtype_name(dtype),
        bytes_per_element=nbytes,
        layers=layers,
        bytes_per_token_by_type=by_type,
        windows=windows,
        bytes_per_token=sum(by_type.values()),
        naive_bytes_per_token=naive_kv_bytes_per_token(cfg, dtype),
        kv_heads=1 if arch.mla else arch.kv_heads,
        query_heads=arch.heads,
        head_dim=arch.head_dim,
        layout=layout,
    )


def kv_bytes_per_token(config: ConfigLike, dtype: Any = "bfloat16") -> int:
    """KV bytes one token costs across all layers (before any window cap): for a plain GQA model
    ``2 * layers * num_key_value_heads * head_dim * bytes``."""
    nbytes = dtype_bytes(dtype)
    return sum(l.elements_per_token for l in kv_layout(config)) * nbytes


def kv_bytes_per_token_by_type(config: ConfigLike, dtype: Any = "bfloat16") -> dict[str, int]:
    """:func:`kv_bytes_per_token` split by layer kind (``full``, ``sliding``, ``mla``, ``none``...)."""
    return dict(kv_profile(config, dtype).bytes_per_token_by_type)


def kv_bytes_per_sequence(config: ConfigLike, context: int, dtype: Any = "bfloat16", *, cap_sliding: bool = True) -> int:
    """KV bytes for one sequence of ``context`` tokens; sliding/chunked layers hold at most their
    window when ``cap_sliding`` (what a windowed serving cache needs)."""
    _check_positive("context", context, allow_zero=True)
    nbytes = dtype_bytes(dtype)
    return sum(l.elements_per_token * l.tokens_held(context, cap_sliding) for l in kv_layout(config)) * nbytes


def kv_cache_bytes(config: ConfigLike, batch_size: int, context: int, dtype: Any = "bfloat16", *,
                   cap_sliding: bool = True) -> int:
    """KV bytes for ``batch_size`` sequences of ``context`` tokens (see :func:`kv_bytes_per_sequence`)."""
    _check_positive("batch_size", batch_size, allow_zero=True)
    return batch_size * kv_bytes_per_sequence(config, context, dtype, cap_sliding=cap_sliding)


def naive_kv_bytes_per_token(config: ConfigLike, dtype: Any = "bfloat16") -> int:
    """The common mistake: ``2 * layers * num_attention_heads * head_dim * bytes``, counting *query*
    heads on every layer, ignoring GQA/MQA, windows and MLA (for MLA: the expanded per-head keys
    and values). For comparison only."""
    arch = _arch(config)
    nbytes = dtype_bytes(dtype)
    if arch.mla is not None:
        per_head = arch.mla["qk_nope_head_dim"] + arch.mla["qk_rope_head_dim"] + arch.mla["v_head_dim"]
        return arch.num_layers * arch.heads * per_head * nbytes
    return 2 * arch.num_layers * arch.heads * arch.head_dim * nbytes


def managed_cache_bytes(config: ConfigLike, batch_size: int, max_len: int, dtype: Any = "bfloat16") -> int:
    """Exactly the bytes :class:`specdec.verifiers.cache.ManagedCache` allocates for this model.

    Each KV layer holds keys ``[batch, k_heads, max_len, k_dim]`` and values ``[batch, v_heads,
    max_len, v_dim]`` in the KV dtype. Sliding-window layers are *not* capped: the managed cache
    keeps the whole context so rollback is exact. Layers without a KV cache allocate nothing.
    """
    _check_positive("batch_size", batch_size, allow_zero=True)
    _check_positive("max_len", max_len, allow_zero=True)
    nbytes = dtype_bytes(dtype)
    return batch_size * max_len * nbytes * sum(l.elements_per_token for l in kv_layout(config))


def cache_len(prompt_len: int, max_new_tokens: int, draft_len: int) -> int:
    """Slots per row the engine preallocates: the prompt, every new token, and one verification
    block of ``draft_len`` drafted tokens plus the bonus token that may overshoot the end."""
    return int(prompt_len) + int(max_new_tokens) + int(draft_len) + 1


def _check_positive(name: str, value: int, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {value}")


# --------------------------------------------------------------------------------------------
# weights
# --------------------------------------------------------------------------------------------

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
    cfg = _resolve(config)
    a = _arch(cfg)
    mt, h, L = a.model_type, a.hidden, a.num_layers
    linears: list[_Linear] = []
    other: dict[str, int] = {"embedding": 0, "norms": 0, "lm_head": 0, "router": 0, "biases": 0}
    norm = 2 * h if mt in _LAYERNORM_FAMILIES else h

    other["embedding"] = a.vocab * h
    if mt in ("gpt2", "gpt_neo", "opt"):
        other["embedding"] += int(_get(cfg, "n_positions", "max_position_embeddings", default=0)) * h
    if not a.tied:
        other["lm_head"] = a.vocab * h
    other["norms"] += norm  # final norm

    # attention
    kinds = _layer_kinds(cfg, L)
    n_attn = sum(1 for k, _ in kinds if k != "none")
    norms_per_layer = 4 if mt in _FOUR_NORM_FAMILIES else 2
    if mt == "falcon" and not _get(cfg, "new_decoder_architecture"):
        norms_per_layer = 1  # Falcon-7B: one input norm shared by the parallel attention and MLP
    other["norms"] += L * norms_per_layer * norm
    attn_bias = bool(_get(cfg, "attention_bias", default=mt in ("gpt2", "gpt_neox", "gpt_bigcode")))
    if mt == "falcon":
        attn_bias = bool(_get(cfg, "bias", default=False))
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
    else:
        q_out, kv_out = a.heads * a.head_dim, a.kv_heads * a.head_dim
        linears.append(_Linear(h, q_out + 2 * kv_out, n_attn, "attention"))  # q, k, v (fused or not: same bytes)
        linears.append(_Linear(q_out, h, n_attn, "attention"))
        if mt in _QKV_BIAS_FAMILIES:
            other["biases"] += n_attn * (q_out + 2 * kv_out)
        elif attn_bias:
            other["biases"] += n_attn * (q_out + 2 * kv_out + h)
        if mt in _QK_NORM_FAMILIES:
            other["norms"] += n_attn * 2 * a.head_dim

    # MLP: dense, or mixture of experts
    gated = mt not in _NON_GATED_MLP
    mlp_bias = bool(_get(cfg, "mlp_bias", default=mt in _NON_GATED_MLP and mt != "falcon"))
    if mt == "falcon":
        mlp_bias = bool(_get(cfg, "bias", default=False))

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

    n_experts = _get(cfg, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
    if n_experts:
        n_experts = int(n_experts)
        moe_width = int(_get(cfg, "moe_intermediate_size", default=a.intermediate))
        moe_layers = _moe_layers(cfg, mt, L)
        dense(a.intermediate, L - moe_layers, "mlp")
        dense(moe_width, moe_layers * n_experts, "experts")
        other["router"] += moe_layers * n_experts * h
        shared = int(_get(cfg, "n_shared_experts", default=0) or 0)
        if shared:
            dense(moe_width * shared, moe_layers, "experts")  # DeepSeek: one MLP `shared` experts wide
        shared_width = int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
        if shared_width:
            dense(shared_width, moe_layers, "experts")  # Qwen2-MoE shared expert and its gate
            other["router"] += moe_layers * h
    else:
        dense(a.intermediate, L, "mlp")
    return linears, other


def _moe_layers(cfg: Any, mt: str, num_layers: int) -> int:
    if mt in ("deepseek_v2", "deepseek_v3"):
        first_dense = int(_get(cfg, "first_k_dense_replace", default=0) or 0)
        freq = int(_get(cfg, "moe_layer_freq", default=1) or 1)
        return sum(1 for i in range(first_dense, num_layers) if i % freq == 0)
    if mt in ("qwen2_moe", "qwen3_moe"):
        step = int(_get(cfg, "decoder_sparse_step", default=1) or 1)
        dense_only = set(_get(cfg, "mlp_only_layers", default=[]) or [])
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


@dataclass(frozen=True)
class QuantScheme:
    """How a quantization scheme stores a linear weight.

    ``bits`` per weight plus ``overhead_bytes`` (scales, zero points) per group of ``group_size``
    input weights (``group_size`` None: one group per output channel). ``dtype`` is set for the
    plain float "schemes" (``bf16``...), which convert the whole copy instead. ``quantize_head``:
    whether the LM head is quantized too (specdec's default; ``+head`` keeps it). ``compute_dtype``
    is the dtype the quantized copy computes (and caches KV) in, when the scheme fixes it.
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


# base name -> (bits, default group, overhead bytes per group, compute dtype). Overheads follow the
# backends specdec.quant uses on CPU: int8 (and int8-weight-only) is torch's int8pack kernel with a
# bf16 scale per output channel and bf16 compute; torch.ao dynamic int8 keeps an fp32 scale and an
# int32 zero point per output channel; torch's int4pack a bf16 scale and zero per group (default group 32, as
# specdec.quant); bitsandbytes nf4/fp4 an fp32 absmax per 64 weights (8-bit absmax and an fp32
# second level per 256 blocks with double quantization).
_QUANT_BASES: dict[str, tuple[float, int | None, float, str | None]] = {
    "int8": (8, None, 2.0, "bfloat16"),
    "int8-dynamic": (8, None, 8.0, None),
    "int8-weight-only": (8, None, 2.0, "bfloat16"),
    "fp8": (8, None, 4.0, None),
    "int4": (4, 32, 4.0, "bfloat16"),
    "nf4": (4, 64, 4.0, "bfloat16"),
    "fp4": (4, 64, 4.0, "bfloat16"),
    "nf4-dq": (4, 64, 1.0 + 4.0 / 256, "bfloat16"),
    "fp4-dq": (4, 64, 1.0 + 4.0 / 256, "bfloat16"),
}
_QUANT_ALIASES = {"qint8": "int8", "w8": "int8", "float8": "fp8", "float8_e4m3fn": "fp8"}
_QUANT_RE = re.compile(r"^(?P<base>[a-z0-9_.\-]+?)(?:[:\-]g(?P<group>\d+))?(?P<head>\+head(?:8|16)?)?$")


def parse_quant(spec: str | QuantScheme | None) -> QuantScheme | None:
    """A weight quantization scheme, in specdec.quant's grammar ``BASE[:gN][+head]``.

    ``None``/``none`` mean no quantization. Float bases (``fp32``, ``bf16``, ``fp16``) convert the
    weights to that dtype. ``int8``/``int8-dynamic``: per-channel int8 (torch.ao dynamic on CPU,
    LLM.int8 on CUDA); ``int8-weight-only``; ``fp8``; ``int4`` (groups of 32 unless ``:gN``, e.g.
    ``int4:g128``); ``int2``..``int7`` likewise; ``nf4``/``fp4`` (bitsandbytes, block 64) and
    ``nf4-dq`` (double quantization). ``-gN`` is accepted for ``:gN``. The LM head is quantized
    unless ``+head`` is appended, as in :func:`specdec.quant.quantize`.

    Raises:
        ValueError: unknown scheme (the message lists the accepted forms).
    """
    if spec is None or isinstance(spec, QuantScheme):
        return spec
    key = str(spec).strip().lower()
    if key in ("", "none", "no"):
        return None
    m = _QUANT_RE.match(key)
    base = m.group("base") if m else key
    base = _QUANT_ALIASES.get(base, base)
    head_suffix = (m.group("head") or "") if m else ""
    keep_head = head_suffix == "+head"
    head = {"+head8": "int8", "+head16": "bf16"}.get(head_suffix)
    group = int(m.group("group")) if m and m.group("group") else None
    if m and base in _DTYPE_ALIASES and _DTYPE_ALIASES[base][0] in ("float32", "float16", "bfloat16", "float64"):
        canon, size = _DTYPE_ALIASES[base]
        if group is not None:
            raise ValueError(f"{canon} takes no group size (got {spec!r})")
        return QuantScheme(canon + ("+head" if keep_head else ""), 8 * size, None, 0.0, not keep_head, canon, canon)
    generic = re.fullmatch(r"u?int([2-7])", base) if m else None
    if m and (base in _QUANT_BASES or generic):
        bits, default_group, overhead, compute = (
            _QUANT_BASES[base] if base in _QUANT_BASES else (int(generic.group(1)), 32, 4.0, "bfloat16")
        )
        if group is not None and default_group is None and base not in ("int8", "fp8"):
            raise ValueError(f"scheme {base!r} takes no group size (got {spec!r})")
        if group is not None and group <= 0:
            raise ValueError(f"group size must be positive in {spec!r}")
        if group is not None and default_group is None:
            overhead = 4.0  # grouped int8/fp8: one scale + zero per group
        size = group if group is not None else default_group
        name = base + (f":g{size}" if size is not None else "") + head_suffix
        return QuantScheme(name, bits, size, overhead, not keep_head, None, compute,
                           parse_quant(head) if head else None)
    raise ValueError(
        f"unknown weight quantization {spec!r}; use none, fp32, bf16, fp16, int8, int8-dynamic, "
        "int8-weight-only, fp8, int4 (group 32; int4:g128 for another group), int2..int7, nf4, nf4-dq, fp4, "
        "optionally with +head to keep the LM head unquantized (+head8 / +head16: an int8 / bf16 head)"
    )


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
    total += _head_bytes(config, other, base, scheme)
    return int(total)


def _head_bytes(config: ConfigLike, other: dict[str, int], base: int, scheme: QuantScheme) -> int:
    a = _arch(config)
    if scheme.quantize_head:
        return scheme.head_bytes(a.hidden, a.vocab)
    return other["lm_head"] * base


def copy_weight_bytes(config: ConfigLike, dtype: Any, quant: str | QuantScheme | None) -> int:
    """Bytes a quantized *copy* of a model loaded in ``dtype`` adds beside the original, the way
    :func:`specdec.quant.quantize` builds it: the copy shares the embedding table (and every tensor
    the scheme leaves unchanged) with the source; only converted or quantized tensors are new.

    Norms, biases and routers are new tensors only when the scheme computes in another dtype than
    the source (``bf16``, ``int4``, ``nf4`` copies of an fp32 model). Buffers are not counted.
    """
    scheme = parse_quant(quant)
    if scheme is None:
        return 0
    linears, other = _weight_model(config)
    a = _arch(config)
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
    return blocks + head + _converted_small(other, dtype, scheme.compute_dtype)


def _converted_small(other: dict[str, int], source: Any, compute: str | None) -> int:
    """Norms, biases and routers a copy converts to its compute dtype (0 when it is the source's)."""
    if compute is None or dtype_name(compute) == dtype_name(source):
        return 0
    return (other["norms"] + other["biases"] + other["router"]) * dtype_bytes(compute)


# --------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------


def activation_bytes(config: ConfigLike, tokens: int, dtype: Any = "bfloat16", logits_positions: int = 0) -> int:
    """Transient bytes of one forward over ``tokens`` tokens (all rows together), of which
    ``logits_positions`` produce logits.

    Estimate of the peak inside one decoder layer (transformers frees each layer's intermediates
    before the next): the residual stream and its normed copy plus the larger of the attention
    projections and the MLP intermediates (gate, up, product; for MoE the active experts). Logits
    are counted in ``dtype`` plus an fp32 copy and fp32 probabilities (the acceptance step). Score
    matrices are not counted: SDPA/flash kernels do not materialise them.
    """
    a = _arch(config)
    nbytes = dtype_bytes(dtype)
    if a.mla is not None:
        m = a.mla
        qk = m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
        attn = a.heads * (2 * qk + 2 * m["v_head_dim"]) + m["kv_lora_rank"] + m["qk_rope_head_dim"]
    else:
        attn = 2 * a.heads * a.head_dim + 2 * a.kv_heads * a.head_dim
    cfg = _resolve(config)
    width = a.intermediate
    if _get(cfg, "n_routed_experts", "num_local_experts", "num_experts"):
        top_k = int(_get(cfg, "num_experts_per_tok", "moe_topk", default=2))
        moe_width = int(_get(cfg, "moe_intermediate_size", default=a.intermediate))
        shared = int(_get(cfg, "n_shared_experts", default=0) or 0) * moe_width
        shared += int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
        width = max(width, top_k * moe_width + shared)
    per_token = (4 * a.hidden + max(attn, 3 * width)) * nbytes
    logits = logits_positions * a.vocab * (nbytes + 4 + 4)
    return int(tokens * per_token + logits)


# --------------------------------------------------------------------------------------------
# the engine's pre-check
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FitCheck:
    """What :func:`check_fits` counted, in bytes."""

    required_bytes: int
    available_bytes: int
    verifier_cache_bytes: int
    drafter_cache_bytes: int
    activation_bytes: int
    weight_bytes: int
    device: str


def check_fits(
    verifier_config: ConfigLike,
    drafter_config: ConfigLike | None,
    batch_size: int,
    max_len: int,
    dtype: Any,
    memory_budget_bytes: int | str | None = None,
    *,
    drafter_dtype: Any = None,
    device: Any = None,
    prefill_tokens: int | None = None,
    draft_len: int = 8,
    include_weights: bool = False,
    weight_dtype: Any = None,
    weight_quant: str | None = None,
    draft_quant: str | None = None,
) -> FitCheck:
    """Check, before any compute, that the managed caches for ``batch_size`` rows of ``max_len``
    slots (use :func:`cache_len`) plus the prefill/verify activations fit in memory.

    ``dtype`` is the KV dtype of the verifier cache (the model's dtype), ``drafter_dtype`` the
    drafter's (default ``dtype``). ``memory_budget_bytes`` defaults to what is free now on
    ``device`` (:func:`available_memory`); since the models are normally loaded already, weights
    are not counted unless ``include_weights``. ``prefill_tokens`` is the prompt length per row
    (default ``max_len``, an upper bound).

    Raises:
        PlanError: when it does not fit, saying how far to lower the batch or the length, or which
            smaller dtype would fit.
    """
    _check_positive("batch_size", batch_size)
    _check_positive("max_len", max_len)
    vcfg = load_config(verifier_config)
    if _is_self_draft(verifier_config, drafter_config):
        dcfg = vcfg
    else:
        dcfg = load_config(drafter_config) if drafter_config is not None else None
    d_dtype = drafter_dtype if drafter_dtype is not None else dtype
    dev = "cpu" if device is None else str(device)
    budget = parse_memory(memory_budget_bytes) if memory_budget_bytes is not None else available_memory(device)
    prefill = max_len if prefill_tokens is None else int(prefill_tokens)
    weights = 0
    if include_weights:
        w_dtype = weight_dtype if weight_dtype is not None else dtype
        weights = weight_bytes(vcfg, w_dtype, weight_quant)
        if dcfg is not None:
            weights += weight_bytes(dcfg, d_dtype if weight_dtype is None else weight_dtype, draft_quant)

    def need(batch: int, length: int, kv: Any, kv_d: Any) -> tuple[int, int, int]:
        v = managed_cache_bytes(vcfg, batch, length, kv)
        d = managed_cache_bytes(dcfg, batch, length, kv_d) if dcfg is not None else 0
        act = _activations(vcfg, dcfg, batch, min(prefill, length), draft_len, kv, kv_d)
        return v, d, act

    v, d, act = need(batch_size, max_len, dtype, d_dtype)
    required = weights + v + d + act
    result = FitCheck(required, budget, v, d, act, weights, dev)
    if required <= budget:
        return result

    def fits(batch: int, length: int) -> bool:
        return weights + sum(need(batch, length, dtype, d_dtype)) <= budget

    max_b = _max_int(lambda b: fits(b, max_len), 1)
    max_l = _max_int(lambda n: fits(batch_size, n), 1)
    tips = []
    if max_b:
        tips.append(f"lower the batch to {max_b}")
    if max_l:
        tips.append(f"shorten prompt + max_new_tokens + draft to {max_l} tokens per row")
    smaller = _smaller_dtype(dtype)
    if smaller is not None:
        kv_d_small = _smaller_dtype(d_dtype) or d_dtype
        if weights + sum(need(batch_size, max_len, smaller, kv_d_small)) <= budget:
            tips.append(f"load the models in {smaller} (halves the KV cache)")
        else:
            tips.append(f"use a smaller dtype ({smaller} halves the KV cache)")
    if not tips:
        tips.append("free memory or use a smaller model/draft")
    raise PlanError(
        f"not enough memory on {dev}: batch {batch_size} x {max_len} slots needs {format_bytes(required)} "
        f"(verifier KV cache {format_bytes(v)}, drafter KV cache {format_bytes(d)}, activations ~{format_bytes(act)}"
        + (f", weights {format_bytes(weights)}" if include_weights else "")
        + f") but {format_bytes(budget)} is available. To fit: " + "; or ".join(tips) + "."
    )


def _smaller_dtype(dtype: Any) -> str | None:
    name = dtype_name(dtype)
    return {"float64": "float32", "float32": "bfloat16"}.get(name)


def _activations(vcfg: Any, dcfg: Any, batch: int, prefill_tokens: int, draft_len: int, dtype: Any,
                 draft_dtype: Any) -> int:
    """Peak transient bytes: the larger of the two prefills (they run one after the other) and the
    verify step (k+1 positions of verifier logits next to the k drafter distributions)."""
    # A padded batch makes transformers build a [batch, 1, q, kv] boolean mask for the prompt.
    mask = batch * prefill_tokens * prefill_tokens if batch > 1 else 0
    prefill_v = activation_bytes(vcfg, batch * prefill_tokens, dtype, logits_positions=batch) + mask
    verify = activation_bytes(vcfg, batch * (draft_len + 1), dtype, logits_positions=batch * (draft_len + 1))
    if dcfg is None:
        return max(prefill_v, verify)
    prefill_d = activation_bytes(dcfg, batch * prefill_tokens, draft_dtype, logits_positions=batch) + mask
    draft_probs = batch * draft_len * _arch(dcfg).vocab * 4
    return max(prefill_v, prefill_d, verify + draft_probs)


def _max_int(ok: Callable[[int], bool], lo: int, hi: int | None = None) -> int:
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


# --------------------------------------------------------------------------------------------
# the planner
# --------------------------------------------------------------------------------------------


@dataclass
class Plan:
    """Memory plan for a verifier (and optional drafter) at a batch size and context length.

    All sizes are bytes. ``context`` is tokens per row (prompt + generated); the managed caches
    hold ``cache_len = context + draft_len + 1`` slots per row. ``kv_cache_bytes`` is the
    verifier's KV requirement for ``batch x context`` with sliding layers capped at their window
    (what any windowed cache needs); the breakdown's cache rows are what specdec's managed cache
    allocates (full context on every layer, plus the draft slots), and they are what the totals,
    ``max_batch`` and ``max_context`` use.
    """

    verifier: str
    drafter: str | None
    dtype: str
    kv_dtype: str
    weight_quant: str | None
    draft_quant: str | None
    draft_len: int
    batch: int
    context: int
    cache_len: int
    verifier_params: int
    drafter_params: int
    verifier_weight_bytes: int
    drafter_weight_bytes: int
    verifier_cache_bytes: int
    drafter_cache_bytes: int
    activation_bytes: int
    runtime_reserve_bytes: int
    total_bytes: int
    kv_bytes_per_token: int
    kv_bytes_per_token_by_type: dict[str, int]
    kv_layers: dict[str, int]
    kv_windows: dict[str, int | None]
    naive_kv_bytes_per_token: int
    kv_cache_bytes: int
    naive_kv_cache_bytes: int
    drafter_kv_bytes_per_token: int
    kv_heads: int
    query_heads: int
    head_dim: int
    model_max_context: int | None
    prefill_tokens: int
    kv_geometry: str
    drafter_shares_weights: bool = False
    memory_bytes: int | None = None
    free_bytes: int | None = None
    fits: bool | None = None
    max_batch: int | None = None
    max_context: int | None = None
    max_context_limited_by: str | None = None
    naive_max_batch: int | None = None
    advice: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def headroom_bytes(self) -> int:
        """Activation estimate plus runtime reserve."""
        return self.activation_bytes + self.runtime_reserve_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (sizes in bytes)."""
        d = asdict(self)
        d["headroom_bytes"] = self.headroom_bytes
        d["naive_factor"] = self.naive_kv_bytes_per_token / self.kv_bytes_per_token if self.kv_bytes_per_token else None
        return d

    def _rows(self) -> list[tuple[str, int | None, str]]:
        wq = self.weight_quant or self.dtype
        rows: list[tuple[str, int | None, str]] = [
            (f"verifier weights ({wq})", self.verifier_weight_bytes, f"{self.verifier_params / 1e9:.3g}B params"),
        ]
        if self.drafter:
            dq = self.draft_quant or self.dtype
            detail = f"{self.drafter_params / 1e9:.3g}B params"
            if self.drafter_shares_weights:
                detail += ", quantized copy sharing the embedding"
            rows.append((f"drafter weights ({dq})", self.drafter_weight_bytes, detail))
        rows.append((f"verifier KV cache (+{self.draft_len + 1} draft slots)", self.verifier_cache_bytes,
                     f"{self.batch} x {self.cache_len} slots x {self.kv_bytes_per_token:,} B"))
        if self.drafter:
            rows.append((f"drafter KV cache (+{self.draft_len + 1} draft slots)", self.drafter_cache_bytes,
                         f"{self.batch} x {self.cache_len} slots x {self.drafter_kv_bytes_per_token:,} B"))
        rows.append(("activations (est.)", self.activation_bytes, f"prefill {self.batch} x {self.prefill_tokens} tokens"))
        rows.append(("runtime reserve", self.runtime_reserve_bytes, "CUDA context / allocator / process"))
        rows.append(("total", self.total_bytes, ""))
        if self.memory_bytes is not None:
            rows.append(("memory budget", self.memory_bytes, ""))
            rows.append(("free" if (self.free_bytes or 0) >= 0 else "short by", abs(self.free_bytes or 0),
                         "fits" if self.fits else "DOES NOT FIT"))
        return rows

    def _summary(self) -> list[str]:
        pieces = []
        for kind, n in self.kv_layers.items():
            per = self.kv_bytes_per_token_by_type.get(kind, 0)
            win = self.kv_windows.get(kind)
            pieces.append(f"{n} {kind}" + (f" (window {win:,})" if win else "") + f": {per:,} B")
        factor = self.naive_kv_bytes_per_token / self.kv_bytes_per_token if self.kv_bytes_per_token else float("inf")
        lines = [
            f"KV per token: {self.kv_bytes_per_token:,} B ({self.kv_dtype}; {self.kv_geometry}; "
            f"layers: {'; '.join(pieces)})",
            f"naive ({self.query_heads} query heads, no windows): {self.naive_kv_bytes_per_token:,} B per token "
            f"= {factor:.1f}x too much",
            f"verifier KV for {self.batch} x {self.context:,} tokens: {self.kv_cache_bytes:,} B "
            f"({format_bytes(self.kv_cache_bytes)}); naive: {format_bytes(self.naive_kv_cache_bytes)}",
        ]
        if self.memory_bytes is not None:
            limit = f" (model limit {self.model_max_context:,})" if self.max_context_limited_by == "model" else ""
            lines.append(f"max batch at context {self.context:,}: {self.max_batch} (a query-head count would say "
                         f"{self.naive_max_batch}); max context at batch {self.batch}: {self.max_context:,}{limit}")
        if self.advice:
            lines.append(self.advice)
        lines.extend(self.notes)
        return lines

    def title(self) -> str:
        """One-line description of the setup."""
        draft = f" + draft {self.drafter}" if self.drafter else ""
        quant = f" (verifier linears {self.weight_quant})" if self.weight_quant else ""
        return (f"{self.verifier}{draft} | weights {self.dtype}{quant}, KV {self.kv_dtype} | batch {self.batch} x context "
                f"{self.context:,} (+{self.draft_len + 1} draft slots)")

    def table(self) -> str:
        """Readable text table of the breakdown and the headline numbers."""
        rows = self._rows()
        w0 = max(len(r[0]) for r in rows)
        lines = [self.title(), f"{'component':<{w0}}  {'bytes':>17}  {'GiB':>9}  detail"]
        for name, value, detail in rows:
            if name == "total" or name == "memory budget":
                lines.append("-" * (w0 + 32))
            gib = f"{value / GiB:9.2f}" if value is not None else f"{'-':>9}"
            lines.append(f"{name:<{w0}}  {value:>17,}  {gib}  {detail}".rstrip())
        lines.append("")
        lines.extend(self._summary())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        esc = html.escape
        body = "".join(
            f"<tr><td>{esc(n)}</td><td style='text-align:right'>{v:,}</td>"
            f"<td style='text-align:right'>{v / GiB:.2f}</td><td>{esc(d)}</td></tr>"
            for n, v, d in self._rows()
        )
        summary = "".join(f"<li>{esc(s)}</li>" for s in self._summary())
        return (
            f"<div><b>{esc(self.title())}</b><table><thead><tr><th>component</th><th>bytes</th><th>GiB</th>"
            f"<th>detail</th></tr></thead><tbody>{body}</tbody></table><ul>{summary}</ul></div>"
        )

    def __str__(self) -> str:
        return self.table()


def _reserve_bytes(headroom: Any, budget: int | None) -> int:
    if headroom is None or (isinstance(headroom, str) and headroom.strip().lower() == "auto"):
        return DEFAULT_RUNTIME_RESERVE
    fraction = None
    if isinstance(headroom, float) and 0 <= headroom < 1:
        fraction = headroom
    elif isinstance(headroom, str):
        text = headroom.strip()
        try:
            fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            fraction = None
        if fraction is not None and not 0 <= fraction < 1:
            fraction = None
    if fraction is not None:
        if budget is None:
            raise ValueError("a fractional headroom needs a memory budget")
        return int(fraction * budget)
    return parse_memory(headroom)


def plan(
    verifier: ConfigLike,
    drafter: ConfigLike | None = None,
    memory: int | str | None = None,
    context: int | None = None,
    batch: int | None = None,
    dtype: Any = "bfloat16",
    kv_dtype: Any = None,
    weight_quant: str | None = None,
    draft_quant: str | None = None,
    draft_len: int = 8,
    headroom: int | float | str | None = "auto",
    prompt_len: int | None = None,
) -> Plan:
    """Plan memory for speculative decoding with ``verifier`` (+ ``drafter``) and say what fits.

    Args:
        verifier, drafter: config objects, dicts, ``config.json`` paths or preset names; a drafter
            of ``"self"`` (or the verifier's own spec) is a copy of the verifier quantized by
            ``draft_quant`` that shares the embedding and unchanged tensors, as
            :func:`specdec.quant.quantize` builds it.
        memory: budget (``"80GiB"``, ``"24GB"``, bytes) or ``"auto"`` for what is free now on CPU;
            None plans without a budget (no ``max_batch``/``max_context``).
        context: tokens per row, prompt + generated (default: the verifier's maximum, else 4096).
        batch: rows (default 1).
        dtype: weight and compute dtype; ``kv_dtype`` the cache dtype (default ``dtype``), used by
            both caches.
        weight_quant, draft_quant: quantization of the verifier's / drafter's linear layers
            (:func:`parse_quant`), e.g. ``"int8"``, ``"int4-g32"``, ``"nf4"``.
        draft_len: drafted tokens per step; each cache gets ``draft_len + 1`` extra slots per row.
        headroom: runtime reserve on top of the activation estimate: bytes, a size string, a
            fraction of ``memory``, or ``"auto"`` (1 GiB: CUDA context and allocator slack, or the
            Python/torch process on CPU).
        prompt_len: prompt tokens per row (default: the whole context, the worst case). The engine
            prefills every row's whole prompt in one forward, so this sets the activation peak.

    Raises:
        PlanError: when ``memory`` is given and nothing fits: not even batch 1 at the context, nor
            one token at the batch. The message says what to change.
        ValueError: bad arguments (unknown model, dtype, quantization, memory string).
    """
    self_copy = _is_self_draft(verifier, drafter)
    vcfg = load_config(verifier)
    dcfg = vcfg if self_copy else (load_config(drafter) if drafter is not None else None)
    varch = _arch(vcfg)
    darch = _arch(dcfg) if dcfg is not None else None
    dtype_n = dtype_name(dtype)
    kv_n = dtype_name(kv_dtype if kv_dtype is not None else dtype)
    _check_positive("draft_len", draft_len, allow_zero=True)
    model_max = varch.max_positions
    if darch is not None and darch.max_positions:
        model_max = min(model_max, darch.max_positions) if model_max else darch.max_positions
    ctx = context if context is not None else (varch.max_positions or DEFAULT_CONTEXT)
    rows = batch if batch is not None else 1
    _check_positive("context", ctx)
    _check_positive("batch", rows)
    if prompt_len is not None:
        _check_positive("prompt_len", prompt_len)
    if isinstance(memory, str) and memory.strip().lower() == "auto":
        budget: int | None = available_memory()
    else:
        budget = parse_memory(memory) if memory is not None else None
    reserve = _reserve_bytes(headroom, budget)
    wq = parse_quant(weight_quant)
    dq = parse_quant(draft_quant)
    v_weights = weight_bytes(vcfg, dtype_n, wq)
    if dcfg is None:
        d_weights = 0
    elif self_copy:
        # specdec's quantized self-copy shares the embedding and unchanged tensors with the verifier.
        d_weights = copy_weight_bytes(vcfg, dtype_n, dq)
    else:
        d_weights = weight_bytes(dcfg, dtype_n, dq)
    # A quantized drafter computes, and so caches, in its scheme's compute dtype (bf16 for int4/nf4).
    d_kv_n = dtype_name(dq.compute_dtype) if (dq is not None and dq.compute_dtype and kv_dtype is None) else kv_n
    v_tok = kv_bytes_per_token(vcfg, kv_n)
    d_tok = kv_bytes_per_token(dcfg, d_kv_n) if dcfg is not None else 0
    # What a planner counting query heads would budget (reported for comparison, never used to decide).
    v_naive = naive_kv_bytes_per_token(vcfg, kv_n)
    d_naive = naive_kv_bytes_per_token(dcfg, d_kv_n) if dcfg is not None else 0
    extra = draft_len + 1

    def parts(b: int, c: int, naive: bool = False) -> tuple[int, int, int, int]:
        slots = c + extra
        v_cache = b * slots * (v_naive if naive else v_tok)  # == managed_cache_bytes(vcfg, b, slots, kv_n)
        d_cache = b * slots * (d_naive if naive else d_tok)
        prefill = min(c, prompt_len) if prompt_len else c
        act = _activations(vcfg, dcfg, b, prefill, draft_len, dtype_n, d_kv_n)
        return v_cache, d_cache, act, v_weights + d_weights + v_cache + d_cache + act + reserve

    v_cache, d_cache, act, total = parts(rows, ctx)
    profile = kv_profile(vcfg, kv_n)
    notes = []
    if profile.layers.get("sliding") or profile.layers.get("chunked"):
        notes.append("sliding layers: kv_cache_bytes caps them at the window; specdec's managed cache keeps the "
                     "full context on them (exact rollback), and the breakdown counts that")
    if profile.layers.get("none"):
        notes.append("layers without KV (linear attention / recurrent) keep a fixed-size state per row, not counted")
    if model_max and ctx > model_max:
        notes.append(f"context {ctx:,} exceeds the model's max_position_embeddings {model_max:,}")
    result = Plan(
        verifier=varch.name,
        drafter=(f"{darch.name} (self copy)" if self_copy else darch.name) if darch is not None else None,
        dtype=dtype_n,
        kv_dtype=kv_n,
        weight_quant=wq.name if wq else None,
        draft_quant=dq.name if dq else None,
        draft_len=draft_len,
        batch=rows,
        context=ctx,
        cache_len=ctx + extra,
        verifier_params=param_count(vcfg),
        drafter_params=param_count(dcfg) if dcfg is not None else 0,
        verifier_weight_bytes=v_weights,
        drafter_weight_bytes=d_weights,
        verifier_cache_bytes=v_cache,
        drafter_cache_bytes=d_cache,
        activation_bytes=act,
        runtime_reserve_bytes=reserve,
        total_bytes=total,
        kv_bytes_per_token=v_tok,
        kv_bytes_per_token_by_type=dict(profile.bytes_per_token_by_type),
        kv_layers=dict(profile.layers),
        kv_windows=dict(profile.windows),
        naive_kv_bytes_per_token=profile.naive_bytes_per_token,
        kv_cache_bytes=rows * profile.per_sequence(ctx, cap_sliding=True),
        naive_kv_cache_bytes=rows * ctx * profile.naive_bytes_per_token,
        drafter_kv_bytes_per_token=d_tok,
        kv_heads=profile.kv_heads,
        query_heads=profile.query_heads,
        head_dim=profile.head_dim,
        model_max_context=model_max,
        prefill_tokens=min(ctx, prompt_len) if prompt_len else ctx,
        kv_geometry=(f"MLA latent {varch.mla['kv_lora_rank']} + rope key {varch.mla['qk_rope_head_dim']}"
                     if varch.mla else f"{varch.kv_heads} KV heads x head_dim {varch.head_dim}"),
        drafter_shares_weights=self_copy,
        notes=notes,
    )
    if budget is None:
        return result

    def fits(b: int, c: int) -> bool:
        return parts(b, c)[3] <= budget

    result.memory_bytes = budget
    result.free_bytes = budget - total
    result.fits = total <= budget
    result.max_batch = _max_int(lambda b: fits(b, ctx), 1)
    result.max_context = _max_int(lambda c: fits(rows, c), 1, model_max)
    result.max_context_limited_by = (
        "model" if model_max and result.max_context == model_max else "memory"
    )
    result.naive_max_batch = _max_int(lambda b: parts(b, ctx, naive=True)[3] <= budget, 1)
    weights = v_weights + d_weights
    if result.max_batch == 0 and result.max_context == 0:
        if not fits(1, 1):
            msg = (f"nothing fits in {format_bytes(budget)}: weights take {format_bytes(weights)} "
                   f"(verifier {format_bytes(v_weights)}" + (f", drafter {format_bytes(d_weights)}" if dcfg else "")
                   + f") plus {format_bytes(reserve)} runtime reserve. "
                   + _weight_tips(vcfg, d_weights, dtype_n, wq, budget, reserve))
        else:
            best_c = _max_int(lambda c: fits(1, c), 1, model_max)
            small_c = min(ctx, 2048)
            best_b = _max_int(lambda b: fits(b, small_c), 1)
            msg = (f"batch {rows} x context {ctx:,} does not fit in {format_bytes(budget)}: not even batch 1 at "
                   f"context {ctx:,}, nor 1 token at batch {rows}. Lower both: batch 1 fits up to context "
                   f"{best_c:,}; context {small_c:,} fits up to batch {best_b}"
                   + (f"; or use a smaller dtype ({_smaller_dtype(dtype_n)})" if _smaller_dtype(dtype_n) else "")
                   + ".")
        raise PlanError(msg, result)
    if not result.fits:
        tips = []
        if result.max_batch:
            tips.append(f"lower the batch to {result.max_batch} at context {ctx:,}")
        if result.max_context:
            tips.append(f"shorten the context to {result.max_context:,} at batch {rows}")
        smaller = _smaller_dtype(dtype_n)
        if smaller:
            tips.append(f"use --dtype {smaller}")
        elif wq is None:
            tips.append("quantize the weights (--quant int8 / int4)")
        result.advice = (f"DOES NOT FIT: needs {format_bytes(total)} of {format_bytes(budget)}; "
                         + "; or ".join(tips) + ".")
    return result


def _is_self_draft(verifier: Any, drafter: Any) -> bool:
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


def _weight_tips(vcfg: Any, drafter_weights: int, dtype: str, wq: QuantScheme | None, budget: int,
                 reserve: int) -> str:
    """What would make the weights fit: a smaller dtype, or quantizing the verifier's linears."""
    tips = []
    for scheme in ("int8", "int4"):
        if wq is not None and wq.bits <= parse_quant(scheme).bits:
            continue
        w = weight_bytes(vcfg, dtype, scheme) + drafter_weights
        verdict = "would leave room" if w + reserve < budget else "still too much"
        tips.append(f"--quant {scheme} brings the weights to {format_bytes(w)} ({verdict})")
    smaller = _smaller_dtype(dtype)
    if smaller:
        tips.insert(0, f"--dtype {smaller} halves the weights")
    tips.append("use more memory or a smaller model/drafter")
    return "To fit: " + "; ".join(tips) + "."


# --------------------------------------------------------------------------------------------
# CLI hooks (wired into `specdec plan` by specdec/cli.py)
# --------------------------------------------------------------------------------------------


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``specdec plan`` options to ``parser``."""
    parser.add_argument("--model", required=True,
                        help=f"verifier: preset name or path to config.json / its directory (presets: {', '.join(preset_names())})")
    parser.add_argument("--draft", default=None,
                        help="drafter: preset or config path, or 'self' for a quantized copy of --model (see --draft-quant)")
    parser.add_argument("--context", type=int, default=None,
                        help="tokens per row, prompt + generated (default: the model's max, else 4096)")
    parser.add_argument("--batch", type=int, default=None, help="rows decoded together (default 1)")
    parser.add_argument("--dtype", default="bfloat16", help="weight/compute dtype (default bfloat16)")
    parser.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: --dtype)")
    parser.add_argument("--quant", default=None,
                        help="verifier weight quantization: int8, fp8, int4, int4-g32, nf4, nf4-dq, ...")
    parser.add_argument("--draft-quant", default=None, help="drafter weight quantization (same forms)")
    parser.add_argument("--draft-len", type=int, default=8, help="drafted tokens per step (default 8)")
    parser.add_argument("--memory", default=None,
                        help="memory budget, e.g. 80GiB, 24GB, 512MiB, bytes, or 'auto' (free RAM now)")
    parser.add_argument("--headroom", default="auto",
                        help="runtime reserve besides activations: size or 'auto' (1GiB)")
    parser.add_argument("--prompt-len", type=int, default=None,
                        help="prompt tokens per row, which sets the prefill activation peak (default: the whole context)")
    parser.add_argument("--json", action="store_true", help="also print the plan as one JSON object (last line)")


def run_plan(args: argparse.Namespace) -> int:
    """Run ``specdec plan``: print the table (and with ``--json`` a JSON object as the last line of
    stdout). Returns 0 when it fits (or no memory was given), 1 when the requested batch x context
    does not fit but something smaller does, 2 on errors and when nothing fits."""
    try:
        result = plan(
            args.model,
            drafter=args.draft,
            memory=args.memory,
            context=args.context,
            batch=args.batch,
            dtype=args.dtype,
            kv_dtype=args.kv_dtype,
            weight_quant=args.quant,
            draft_quant=args.draft_quant,
            draft_len=args.draft_len,
            headroom=getattr(args, "headroom", "auto"),
            prompt_len=getattr(args, "prompt_len", None),
        )
    except PlanError as exc:
        print(f"specdec plan: {exc}", file=sys.stderr)
        if exc.plan is not None:
            print(exc.plan.table())
        if args.json:
            payload = exc.plan.to_dict() if exc.plan is not None else {}
            payload["error"] = str(exc)
            print(json.dumps(payload))
        return 2
    except (ValueError, TypeError, OSError) as exc:
        print(f"specdec plan: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(exc)}))
        return 2
    print(result.table())
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0 if result.fits in (None, True) else 1


# Preset names are importable from here too, for the CLI's help and completion.
PRESET_NAMES: tuple[str, ...] = tuple(sorted(PRESETS))
