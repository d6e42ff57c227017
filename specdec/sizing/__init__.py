"""GQA-aware KV-cache sizing and a memory planner for speculative decoding.

The KV cache, not the weights, decides how many sequences and how much context fit. Per token and
per attention layer a cache stores one key and one value vector for every *key/value* head::

    bytes/token = sum over layers of (k_heads * k_dim + v_heads * v_dim) * bytes_per_element
                = 2 * layers * num_key_value_heads * head_dim * bytes       (plain GQA model)

Grouped-query (GQA) and multi-query (MQA) attention share one K/V head between several query
heads, so counting ``num_attention_heads`` overstates the cache by the group factor (4x for
Mistral-7B and Llama-3-8B). This package never does that; :func:`naive_kv_bytes_per_token` shows
the mistaken figure for comparison only.

Layer kinds: ``full`` attention layers hold every token; ``sliding`` (and ``chunked``) layers
need at most their window in a serving cache; ``mla`` layers (DeepSeek-V2/V3 multi-head latent
attention) store one compressed latent of ``kv_lora_rank`` plus one rope key of
``qk_rope_head_dim`` per token, not per head; ``none`` layers (linear attention, Mamba and other
recurrent layers of hybrid models) keep a fixed-size state and no per-token cache.

specdec's own :class:`~specdec.runners.cache.ManagedCache` keeps the *whole* context on every
layer, sliding ones included, so that rollback is a pointer move; :func:`managed_cache_bytes` is
exactly what it allocates, and the planner budgets with it, for the slots the engine allocates
(:func:`specdec.slots.cache_slots`).

Two layers (docs/sizing.md has the map). The core, what the engine needs for :func:`check_fits`:
``memory`` (sizes, dtypes, free memory), ``presets`` (model configs as plain dicts), ``configs``
(loading and reading configs, decoder numbers, layer kinds), ``kv``, ``weights`` (parameter counts,
weight bytes, quantization schemes from specdec.quant's table), ``budget`` (activations and the one
computation of what a call needs), ``check`` (the engine's pre-check, PlanError). Above it the
planner, ``specdec.sizing.planner``: ``planning`` (plan and its advice), ``result`` (Plan and its
tables), ``command`` (``specdec plan``). The core never imports the planner.
Nothing here imports torch or transformers at import time, and presets are sized without them.
"""

from __future__ import annotations

from specdec.sizing.budget import Need, Workload, activation_bytes
from specdec.sizing.check import FitCheck, PlanError, check_fits
from specdec.sizing.configs import ConfigLike, load_config
from specdec.sizing.kv import (
    KVProfile,
    LayerKV,
    cache_len,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_bytes_per_token_by_type,
    kv_cache_bytes,
    kv_layout,
    kv_profile,
    managed_cache_bytes,
    naive_kv_bytes_per_token,
)
from specdec.sizing.memory import GiB, available_memory, dtype_bytes, dtype_name, format_bytes, parse_memory
from specdec.sizing.planner import (
    DEFAULT_CONTEXT,
    DEFAULT_RUNTIME_RESERVE,
    Plan,
    add_plan_arguments,
    plan,
    run_plan,
)
from specdec.sizing.presets import PRESETS
from specdec.sizing.weights import (
    QuantScheme,
    copy_weight_bytes,
    param_breakdown,
    param_count,
    parse_quant,
    weight_bytes,
)

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

# Preset names are importable from here too, for the CLI's help and completion.
PRESET_NAMES: tuple[str, ...] = tuple(sorted(PRESETS))
