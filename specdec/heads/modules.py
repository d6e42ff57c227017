"""The draft head as torch modules, with parameter names exactly as public EAGLE / EAGLE-3 checkpoints.

One code path serves inference and training: :meth:`EagleHead.forward` takes token embeddings, features
and positions and attends over keys given by :class:`HeadCache` (inference, per-row lengths) or by the
training-time-test layout of :mod:`specdec.training.train`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from specdec.heads.config import HeadConfig


def llama_config(config: HeadConfig) -> LlamaConfig:
    """The transformers config behind the head's RMSNorm, MLP and rotary embedding."""
    kwargs = dict(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                  num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                  head_dim=config.head_dim, rms_norm_eps=config.rms_norm_eps, hidden_act=config.hidden_act,
                  max_position_embeddings=config.max_position_embeddings, vocab_size=config.vocab_size, mlp_bias=False)
    rope = {"rope_type": "default", **(config.rope_scaling or {}), "rope_theta": config.rope_theta}
    if "type" in rope and rope.get("rope_type", "default") == "default":
        rope["rope_type"] = rope.pop("type")
    return LlamaConfig(rope_parameters=rope, **kwargs)


class HeadCache:
    """Per-layer keys and values of the head for a batch, row ``b`` holding ``lengths[b]`` committed slots
    at logical positions ``0..lengths[b]-1`` (no padding), so a write lands at each row's own position."""

    def __init__(self, layers: int, batch: int, slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        shape = (batch, slots, kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)

    @property
    def slots(self) -> int:
        return self.keys[0].shape[1]

    def grow(self, needed: int) -> None:
        """Make room for ``needed`` slots (rare: a long run of ragged steps)."""
        if needed <= self.slots:
            return
        extra = max(needed - self.slots, self.slots // 2)
        pad = lambda t: torch.cat([t, t.new_zeros((t.shape[0], extra) + t.shape[2:])], dim=1)  # noqa: E731
        self.keys, self.values = [pad(k) for k in self.keys], [pad(v) for v in self.values]

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep the rows ``index`` lists: a device tensor (uploaded by the caller), else copied there (blocking)."""
        if index.device != self.lengths.device:
            index = index.to(self.lengths.device)
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.lengths = self.lengths.index_select(0, index)


class HeadAttention(nn.Module):
    """Llama attention whose projections read ``in_features`` (``2H`` in EAGLE-3's midlayer)."""

    def __init__(self, config: HeadConfig, in_features: int, bias: bool = False) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.q_proj = nn.Linear(in_features, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(in_features, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``q [B,h,n,d]``, ``k, v [B,n,kv,d]`` with rotary positions applied."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.kv_heads, self.head_dim)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k.transpose(1, 2), v

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``q [B,h,n,d]`` over ``keys, values [B,S,kv,d]`` where ``mask [B,n,S]`` (bool) allows."""
        groups = self.heads // self.kv_heads
        k = keys.transpose(1, 2).repeat_interleave(groups, dim=1)
        v = values.transpose(1, 2).repeat_interleave(groups, dim=1)
        return self.output(nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1)))

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """``o_proj`` of the heads' outputs ``[B,h,n,d]``."""
        b, _, n, _ = attended.shape
        return self.o_proj(attended.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))


class EagleLayer(nn.Module):
    """EAGLE's decoder layer (``layers.i``; ``input_layernorm`` only after the first) or EAGLE-3's ``midlayer``."""

    def __init__(self, config: HeadConfig, index: int, bias: bool = False) -> None:
        super().__init__()
        self.eagle3 = config.kind == "eagle3"
        self.norm_before_residual = config.norm_before_residual
        width = 2 * config.hidden_size if self.eagle3 else config.hidden_size
        self.self_attn = HeadAttention(config, width, bias)
        llama = llama_config(config)
        self.mlp = LlamaMLP(llama)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if self.eagle3:
            self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        elif index > 0:
            self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(attention input, residual)``."""
        if self.eagle3:
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual
        norm = getattr(self, "input_layernorm", None)
        return (hidden if norm is None else norm(hidden)), hidden

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        hidden = residual + attended
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class EagleHead(nn.Module):
    """A draft head. ``embed``: the verifier's input embedding (or the checkpoint's ``embed_tokens``);
    ``target_head``: the verifier's ``lm_head``, which EAGLE-1/2 heads draft with (not saved with the head)."""

    def __init__(self, config: HeadConfig, fc_bias: bool = False, attn_bias: bool = False) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(config.fc_in_features, h, bias=fc_bias)
        if config.kind == "eagle3":
            self.midlayer = EagleLayer(config, 0, attn_bias)
            self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
            self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long, device="cpu"))
            self.register_buffer("t2d", torch.ones(config.vocab_size, dtype=torch.bool, device="cpu"))
        else:
            self.layers = nn.ModuleList(EagleLayer(config, i, attn_bias) for i in range(config.num_hidden_layers))
        self.rotary_emb = LlamaRotaryEmbedding(llama_config(config))
        self.embed_tokens: nn.Embedding | None = None
        # lists, so the verifier's modules are not submodules (not saved, moved or cast with the head)
        self._embed: list[nn.Module] = []
        self._target_head: list[nn.Module] = []

    @property
    def decoder_layers(self) -> list[EagleLayer]:
        return [self.midlayer] if self.config.kind == "eagle3" else list(self.layers)

    def attach(self, embed: nn.Module, target_head: nn.Module) -> None:
        """Use the verifier's embedding (unless the checkpoint has its own) and ``lm_head``."""
        self._embed = [embed if self.embed_tokens is None else self.embed_tokens]
        self._target_head = [target_head]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (the verifier's table unless the checkpoint brought its own)."""
        return self._embed[0](ids)

    def input_hidden(self, embeds: torch.Tensor, features: torch.Tensor, own: bool = False) -> torch.Tensor:
        """The head's input state from verifier ``features`` or (``own``) the head's previous output:
        EAGLE-1/2 always mix them with the token through the fc; EAGLE-3 feeds its own output directly."""
        if self.config.kind == "eagle":
            return self.fc(torch.cat([embeds, features], dim=-1))
        return features if own else self.fc(features)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                kv: "KeyValues") -> torch.Tensor:
        """Run the decoder layers on ``hidden`` (already through :meth:`input_hidden`); returns the pre-norm
        output ``[B, n, H]``. ``kv`` stores this pass's keys and returns all keys, values and the mask."""
        cos, sin = self.rotary_emb(hidden, positions)
        for i, layer in enumerate(self.decoder_layers):
            x, residual = layer.attention_input(embeds, hidden)
            q, k, v = layer.self_attn.project(x, cos, sin)
            hidden = layer.finish(kv.attend(i, layer.self_attn, q, k, v), residual)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits: over the draft vocabulary (EAGLE-3) or the verifier's (EAGLE-1/2)."""
        if self.config.kind == "eagle3":
            return self.lm_head(self.norm(hidden))
        return self._target_head[0](hidden)

    def to_target(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids to verifier ids (``target = draft + d2t[draft]``)."""
        return ids + self.d2t[ids] if self.config.kind == "eagle3" else ids


class KeyValues:
    """Interface of the ``kv`` callable :meth:`EagleHead.forward` takes (see :class:`CachedKeyValues`)."""

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def attend(self, layer: int, attention: "HeadAttention", q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this pass's ``k, v`` of ``layer`` and attend ``q`` over every key the mask allows (training
        overrides it with a cheaper exact form)."""
        keys, values, mask = self(layer, k, v)
        return attention.attend(q, keys, values, mask)


class CachedKeyValues(KeyValues):
    """Inference: write a pass of ``n`` tokens per row at each row's own positions ``lengths[b] + j`` and
    attend causally over the committed slots plus the pass (``n_real[b]`` of them real; the rest land past
    the row's length, where the next write overwrites them)."""

    def __init__(self, cache: HeadCache, n: int, longest: int | None = None) -> None:
        self.cache = cache
        device = cache.lengths.device
        # slots any row of this pass can see; ``longest``: the longest row, when the caller knows it on the host
        self.span = (int(cache.lengths.max()) if longest is None else longest) + n
        cache.grow(self.span)
        self.positions = cache.lengths.unsqueeze(1) + torch.arange(n, device=device)  # [B, n]
        # contiguous: an expanded view's strides differ between n = 1 and n > 1, and compiled passes guard on them
        self.rows = torch.arange(cache.lengths.shape[0], device=device).unsqueeze(1).expand(-1, n).contiguous()
        self.mask = torch.arange(self.span, device=device).view(1, 1, -1) <= self.positions.unsqueeze(-1)

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys[self.rows, self.positions] = k.to(keys.dtype)
        values[self.rows, self.positions] = v.to(values.dtype)
        return keys[:, : self.span], values[:, : self.span], self.mask


class TreeKeyValues(KeyValues):
    """Inference over a draft tree: ``n`` frontier nodes per row are written after the row's ``base`` committed
    slots plus the ``fed`` tree nodes already written this proposal; node ``j`` attends to the committed
    slots and to the tree slots ``visible [B, n, fed + n]`` marks (its ancestors and itself)."""

    def __init__(self, cache: HeadCache, base: torch.Tensor, visible: torch.Tensor, depth: torch.Tensor,
                 longest: int | None = None) -> None:
        self.cache = cache
        device = base.device
        batch, n, total = visible.shape
        self.span = (int(base.max()) if longest is None else longest) + total  # longest: max(base), known on the host
        cache.grow(self.span)
        self.positions = base.unsqueeze(1) + depth - 1  # rotary positions: committed length + depth - 1
        self.slots = base.unsqueeze(1) + torch.arange(total - n, total, device=device)  # where this pass writes
        self.rows = torch.arange(batch, device=device).unsqueeze(1).expand(-1, n).contiguous()
        rel = torch.arange(self.span, device=device).unsqueeze(0) - base.unsqueeze(1)  # [B, S]: tree slot index
        in_tree = (rel >= 0) & (rel < total)
        tree = visible.gather(2, rel.clamp(0, total - 1).unsqueeze(1).expand(-1, n, -1))
        self.mask = (rel < 0).unsqueeze(1) | (tree & in_tree.unsqueeze(1))

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        keys[self.rows, self.slots] = k.to(keys.dtype)
        values[self.rows, self.slots] = v.to(values.dtype)
        return keys[:, : self.span], values[:, : self.span], self.mask
