"""DFlash block drafters (Chen et al., arXiv 2602.06036; z-lab/dflash): a few decoder layers that draft a whole block
in one forward, reading the verifier's hidden states.

The layout is z-lab's published one: a Qwen3-style ``config.json`` whose ``dflash_config`` (or top level) names
``target_layer_ids`` (0-indexed verifier layers whose outputs are read), ``block_size`` and ``mask_token_id``, and
weights ``layers.N.self_attn.{q,k,v,o}_proj`` / ``{q,k}_norm``, ``layers.N.mlp.{gate,up,down}_proj``,
``layers.N.{input,post_attention}_layernorm``, ``norm``, ``fc`` and ``hidden_norm``; or transformers' (its
``muse_glimmer_assistant`` models: the same layers, the projection as ``encoder.fc`` and ``encoder.output_norm_enc``).
It has no embedding and no LM head of its own: the verifier's are used.

One forward: the verifier's features of the newly committed tokens (the named layers' outputs, concatenated) are
projected (``hidden_norm(fc(.))``) and become keys and values in every layer, beside the cached ones of earlier
tokens; the block ``[last committed token, mask x (B - 1)]`` (the verifier's embeddings of them) attends to all of
them and to itself, without a causal mask; the block's positions ``1 .. B - 1`` give the next ``B - 1`` tokens. Only
the context's keys and values are cached.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from specdec.errors import SpecdecError
from specdec.heads.modules import HeadCache


class DFlashLoadError(SpecdecError, ValueError):
    """A directory that does not hold a DFlash drafter in z-lab's layout, or one that does not fit the verifier."""


def _setting(config: Qwen3Config, name: str, default: Any = None) -> Any:
    return (getattr(config, "dflash_config", None) or {}).get(name, getattr(config, name, default))


@dataclass
class DFlashSettings:
    """What a DFlash config adds to its Qwen3 layers."""

    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    softcap: float | None = None

    @classmethod
    def of(cls, config: Qwen3Config, where: str = "") -> "DFlashSettings":
        ids, mask = _setting(config, "target_layer_ids"), _setting(config, "mask_token_id")
        if not ids or mask is None:
            raise DFlashLoadError(f"{where}: its config names no dflash_config.target_layer_ids and mask_token_id "
                                  "(z-lab's DFlash layout)")
        cap = _setting(config, "final_logit_softcapping")
        return cls([int(i) for i in ids], int(_setting(config, "block_size", 16)), int(mask),
                   float(_setting(config, "input_embedding_scale", 1.0)), float(_setting(config, "output_multiplier", 1.0)),
                   float(cap) if cap else None)


class DFlashAttention(nn.Module):
    """Qwen3 attention whose keys and values come from the context features and the block alike."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def key_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values ``[B, n, kv_heads, head_dim]`` of inputs ``x [B, n, H]``."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.kv_heads, self.head_dim))
        return _rotate(k, cos, sin), self.v_proj(x).view(b, n, self.kv_heads, self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        """The block ``x [B, n, H]`` attending to ``keys``/``values [B, S, kv_heads, head_dim]`` where ``allowed
        [B, n, S]``."""
        b, n, _ = x.shape
        q = _rotate(self.q_norm(self.q_proj(x).view(b, n, self.heads, self.head_dim)), cos, sin)
        group = self.heads // self.kv_heads
        k = keys.repeat_interleave(group, dim=2).transpose(1, 2)
        v = values.repeat_interleave(group, dim=2).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=allowed[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x [B, n, heads, D]`` at ``cos``/``sin [B, n, D]``."""
    cos, sin = cos.unsqueeze(2).to(x.dtype), sin.unsqueeze(2).to(x.dtype)
    return x * cos + rotate_half(x) * sin


class DFlashLayer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class DFlashModel(nn.Module):
    """The drafter's own weights (z-lab's names); :meth:`draft` is one block forward."""

    def __init__(self, config: Qwen3Config, settings: DFlashSettings) -> None:
        super().__init__()
        self.config, self.settings = config, settings
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.fc = nn.Linear(len(settings.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)

    def new_cache(self, batch: int, slots: int) -> HeadCache:
        p = next(self.parameters())
        attn = self.layers[0].self_attn
        return HeadCache(len(self.layers), batch, slots, attn.kv_heads, attn.head_dim, p.dtype, p.device)

    @torch.no_grad()
    def draft(self, cache: HeadCache, features: torch.Tensor, counts: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """One block forward for every row.

        Args:
            cache: the context's keys and values, row ``b`` holding ``cache.lengths[b]`` tokens at positions
                ``0 .. lengths[b] - 1``; the new context is written after them and the lengths move on.
            features: ``[B, W, F]`` the verifier's features of each row's newly committed tokens (the first
                ``counts[b]`` real), concatenated over ``target_layer_ids``.
            block: ``[B, n, H]`` embeddings of ``[last committed token, masks]``, at the positions after the context.

        Returns the block's final hidden states ``[B, n, H]`` (normed; the verifier's LM head gives the logits).
        """
        batch, width = features.shape[:2]
        device = block.device
        cache.grow(int(cache.lengths.max()) + width + 1)
        start = cache.lengths
        ctx_pos = start[:, None] + torch.arange(width, device=device)  # [B, W] where each new feature goes
        lengths = start + counts
        blk_pos = lengths[:, None] + torch.arange(block.shape[1], device=device)
        ctx = self.hidden_norm(self.fc(features.to(block.dtype)))
        cos_c, sin_c = self.rotary_emb(ctx, ctx_pos)
        cos_b, sin_b = self.rotary_emb(block, blk_pos)
        used = int(lengths.max())
        seen = torch.arange(used, device=device)[None, :] < lengths[:, None]
        rows = torch.arange(batch, device=device)[:, None]

        def context(i: int, layer: DFlashLayer) -> tuple[torch.Tensor, torch.Tensor]:
            k_ctx, v_ctx = layer.self_attn.key_values(ctx, cos_c, sin_c)
            cache.keys[i][rows, ctx_pos], cache.values[i][rows, ctx_pos] = k_ctx, v_ctx  # padding lands past lengths
            return cache.keys[i][:, :used], cache.values[i][:, :used]

        hidden = self.blocks(block, cos_b, sin_b, seen, context)
        cache.lengths = lengths
        return hidden

    def blocks(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seen: torch.Tensor,
               context: Callable[[int, DFlashLayer], tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The blocks ``x [B, n, H]`` (rotated at ``cos``/``sin``) through every layer, each attending to the context
        slots it has ``seen [B, S]`` of the keys and values ``context(i, layer)`` (``[B, S, kv_heads, D]``) and to all
        of itself, without a causal mask; the normed final hidden states. :meth:`draft` and training share it."""
        b, n = x.shape[:2]
        allowed = torch.cat([seen[:, None].expand(-1, n, -1),
                             torch.ones(b, n, n, dtype=torch.bool, device=x.device)], dim=-1)
        for i, layer in enumerate(self.layers):
            k_ctx, v_ctx = context(i, layer)
            h = layer.input_layernorm(x)
            k_blk, v_blk = layer.self_attn.key_values(h, cos, sin)
            keys, values = torch.cat([k_ctx, k_blk], dim=1), torch.cat([v_ctx, v_blk], dim=1)
            x = x + layer.self_attn(h, cos, sin, keys, values, allowed)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Draft logits of ``hidden`` through the verifier's ``lm_head`` (with the config's multiplier and softcap)."""
        logits = lm_head(hidden) * self.settings.output_multiplier
        cap = self.settings.softcap
        return torch.tanh(logits / cap) * cap if cap else logits


def load_dflash(directory: str | Path, verifier: Any) -> DFlashModel:
    """The DFlash drafter in ``directory`` (z-lab's layout) for ``verifier``, on its device and dtype."""
    from safetensors.torch import load_file

    path = Path(directory)
    if not (path / "config.json").is_file():
        raise DFlashLoadError(f"{directory}: no config.json (a DFlash drafter directory holds config.json and "
                              "model.safetensors)")
    raw = json.loads((path / "config.json").read_text())
    config = Qwen3Config(**{k: v for k, v in raw.items() if k not in ("architectures", "model_type", "auto_map")})
    config.dflash_config = raw.get("dflash_config") or {}
    settings = DFlashSettings.of(config, str(directory))
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        raise DFlashLoadError(f"{directory}: causal sliding-window draft layers are not supported yet (full-attention "
                              "DFlash layers only)")
    hidden = verifier.get_input_embeddings().weight.shape[1]
    layers = verifier.config.get_text_config().num_hidden_layers
    if config.hidden_size != hidden or max(settings.target_layer_ids) >= layers:
        raise DFlashLoadError(f"{directory}: drafts for a verifier of hidden size {config.hidden_size} reading layers "
                              f"{settings.target_layer_ids}; this verifier has hidden size {hidden} and {layers} layers")
    model = DFlashModel(config, settings)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DFlashLoadError(f"{directory}: no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    renamed = {"encoder.fc.": "fc.", "encoder.output_norm_enc.": "hidden_norm."}  # transformers' layout
    state = {_rename(k.removeprefix("model."), renamed): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.startswith("rotary_emb")]
    if missing or unexpected:
        raise DFlashLoadError(f"{directory}: weights do not match z-lab's DFlash layout (missing {missing[:4]}, "
                              f"unexpected {unexpected[:4]})")
    p = next(verifier.parameters())
    return model.to(device=p.device, dtype=p.dtype).eval()


def _rename(key: str, prefixes: dict[str, str]) -> str:
    for old, new in prefixes.items():
        if key.startswith(old):
            return new + key[len(old):]
    return key
