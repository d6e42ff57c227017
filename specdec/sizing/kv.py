"""KV-cache geometry and bytes: per layer, per token, per sequence, and what ManagedCache allocates.

Per token and per attention layer a cache stores one key and one value vector for every
*key/value* head; :func:`naive_kv_bytes_per_token` shows the query-head mistake for comparison only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.sizing.configs import ConfigLike, arch, layer_kinds, resolve
from specdec.sizing.memory import check_count, dtype_bytes, dtype_name
from specdec.slots import cache_slots


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


def kv_layout(config: ConfigLike) -> list[LayerKV]:
    """Per-layer KV geometry of a config (see :class:`LayerKV`)."""
    cfg = resolve(config)
    a = arch(cfg)
    out: list[LayerKV] = []
    for kind, window in layer_kinds(cfg, a.num_layers):
        if kind == "none":
            out.append(LayerKV("none"))
        elif a.mla is not None:
            # One latent and one shared rope key per token, whatever the head count: no factor 2 x heads.
            out.append(LayerKV("mla", 1, a.mla["kv_lora_rank"], 1, a.mla["qk_rope_head_dim"], window))
        else:
            out.append(LayerKV(kind, a.kv_heads, a.head_dim, a.kv_heads, a.head_dim, window))
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
    cfg = resolve(config)
    a = arch(cfg)
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
        model=a.name,
        dtype=dtype_name(dtype),
        bytes_per_element=nbytes,
        layers=layers,
        bytes_per_token_by_type=by_type,
        windows=windows,
        bytes_per_token=sum(by_type.values()),
        naive_bytes_per_token=naive_kv_bytes_per_token(cfg, dtype),
        kv_heads=1 if a.mla else a.kv_heads,
        query_heads=a.heads,
        head_dim=a.head_dim,
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
    check_count("context", context, allow_zero=True)
    nbytes = dtype_bytes(dtype)
    return sum(l.elements_per_token * l.tokens_held(context, cap_sliding) for l in kv_layout(config)) * nbytes


def kv_cache_bytes(config: ConfigLike, batch_size: int, context: int, dtype: Any = "bfloat16", *,
                   cap_sliding: bool = True) -> int:
    """KV bytes for ``batch_size`` sequences of ``context`` tokens (see :func:`kv_bytes_per_sequence`)."""
    check_count("batch_size", batch_size, allow_zero=True)
    return batch_size * kv_bytes_per_sequence(config, context, dtype, cap_sliding=cap_sliding)


def naive_kv_bytes_per_token(config: ConfigLike, dtype: Any = "bfloat16") -> int:
    """The common mistake: ``2 * layers * num_attention_heads * head_dim * bytes``, counting *query*
    heads on every layer, ignoring GQA/MQA, windows and MLA (for MLA: the expanded per-head keys
    and values). For comparison only."""
    a = arch(config)
    nbytes = dtype_bytes(dtype)
    if a.mla is not None:
        per_head = a.mla["qk_nope_head_dim"] + a.mla["qk_rope_head_dim"] + a.mla["v_head_dim"]
        return a.num_layers * a.heads * per_head * nbytes
    return 2 * a.num_layers * a.heads * a.head_dim * nbytes


def managed_cache_bytes(config: ConfigLike, batch_size: int, max_len: int, dtype: Any = "bfloat16") -> int:
    """Exactly the bytes :class:`specdec.runners.cache.ManagedCache` allocates for this model.

    Each KV layer holds keys ``[batch, k_heads, max_len, k_dim]`` and values ``[batch, v_heads,
    max_len, v_dim]`` in the KV dtype. Sliding-window layers are *not* capped: the managed cache
    keeps the whole context so rollback is exact. Layers without a KV cache allocate nothing.
    """
    check_count("batch_size", batch_size, allow_zero=True)
    check_count("max_len", max_len, allow_zero=True)
    nbytes = dtype_bytes(dtype)
    return batch_size * max_len * nbytes * sum(l.elements_per_token for l in kv_layout(config))


def cache_len(prompt_len: int, max_new_tokens: int, draft_len: int, batch_size: int = 1) -> int:
    """Slots per row the engine preallocates for one call: :func:`specdec.slots.cache_slots` with
    ``max_length = prompt_len + max_new_tokens`` (the prompt and every new token; ragged batches
    get some slack on top)."""
    return cache_slots(batch_size, prompt_len, prompt_len + max_new_tokens, draft_len)
