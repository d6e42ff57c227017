"""Run a Hugging Face causal LM over a managed cache: prefill, multi-token forwards, rollback.

Used for the verifier and, through :class:`specdec.drafters.ModelDrafter`, for model drafters.
Rows are left padded; every row shares one cache pointer, and each row's position ids continue
from its own true length (cache index minus that row's padding).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from specdec.verifiers.cache import ManagedCache


class UnsupportedModelError(TypeError):
    """The model cannot be driven by specdec's managed cache."""


# Layer kinds whose state is a plain key/value history (rollback = forget the tail).
_KV_LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention", None}


def check_supported(model: torch.nn.Module, role: str = "verifier") -> None:
    """Raise :class:`UnsupportedModelError` naming the problem if ``model`` is not a decoder-only KV-cache LM."""
    config = getattr(model, "config", None)
    if not isinstance(model, PreTrainedModel) or config is None:
        raise UnsupportedModelError(f"the {role} must be a transformers PreTrainedModel, got {type(model).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"the {role} ({config.model_type}) is an encoder-decoder model; specdec supports decoder-only causal LMs"
        )
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise UnsupportedModelError(f"the {role} ({config.model_type}) has no language-modeling head")
    layer_types = getattr(config, "layer_types", None) or []
    odd = sorted({t for t in layer_types if t not in _KV_LAYER_TYPES})
    if odd:
        raise UnsupportedModelError(
            f"the {role} ({config.model_type}) has layers of type {odd} whose state is not a key/value history; "
            "only attention caches can be rolled back by specdec"
        )
    if not getattr(model, "_supports_cache_class", True) or getattr(config, "model_type", "") in {"mamba", "mamba2", "rwkv"}:
        raise UnsupportedModelError(f"the {role} ({config.model_type}) does not use a transformers KV cache")


class CausalLMRunner:
    """Holds a model, its managed cache and the per-row padding of the current batch."""

    def __init__(self, model: PreTrainedModel, role: str = "verifier") -> None:
        check_supported(model, role)
        self.model = model
        self.role = role
        self.cache: ManagedCache | None = None
        self._pads: torch.Tensor | None = None  # [batch] left-padding per row, None when unpadded
        self._prompt_mask: torch.Tensor | None = None
        self._keep_logits = model._supports_logits_to_keep() if hasattr(model, "_supports_logits_to_keep") else False

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def num_layers(self) -> int:
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(text.num_hidden_layers)

    @property
    def length(self) -> int:
        """Tokens currently in the cache (all rows share it)."""
        return 0 if self.cache is None else self.cache.length

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_len: int) -> torch.Tensor:
        """Allocate a cache for ``max_len`` tokens, run the prompt, return last-position logits ``[batch, vocab]``."""
        self.cache = ManagedCache(self.num_layers, max_len)
        self._prompt_mask = attention_mask
        self._pads = None if attention_mask is None else (attention_mask == 0).sum(dim=1)
        extra = {"logits_to_keep": 1} if self._keep_logits else {}
        return self.forward(input_ids, **extra)[:, -1]

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, **extra) -> torch.Tensor:
        """Append ``tokens [batch, n]`` to the cache and return their logits ``[batch, n, vocab]``."""
        start, n = self.length, tokens.shape[1]
        positions = torch.arange(start, start + n, device=tokens.device).unsqueeze(0)
        mask = None
        if self._pads is not None:
            positions = (positions - self._pads.unsqueeze(1)).clamp_min(0)
            ones = torch.ones(tokens.shape[0], start + n - self._prompt_mask.shape[1], dtype=self._prompt_mask.dtype)
            mask = torch.cat([self._prompt_mask, ones.to(self._prompt_mask.device)], dim=1)
        out = self.model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            **extra,
        )
        return out.logits

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens."""
        self.cache.rollback(length)

    def release(self) -> None:
        """Drop the cache (frees its buffers)."""
        self.cache = None
