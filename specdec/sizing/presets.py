"""Built-in model presets for the sizing planner, written from public ``config.json`` numbers.

Each preset is a plain dict holding only the config fields that decide memory: layer count,
hidden size, query and key/value head counts, explicit ``head_dim`` where the real config sets
one, vocabulary, MLP width, embedding tying, sliding windows and layer patterns, mixture-of-experts
sizes and multi-head-latent-attention ranks, and the maximum position count. Nothing is
downloaded: the planner reads a preset as the plain dict it is (no transformers, no torch), and
:func:`specdec.sizing.load_config` turns one into a transformers config offline. Each preset sizes
the same either way (``tests/test_sizing.py`` checks it), so a field transformers would fill in
with a default that matters is written out here.

Where a model ships several configs (base and instruct), the preset follows the instruct
checkpoint; the architecture numbers are identical, only ``max_position_embeddings`` can differ
(Qwen2.5 base checkpoints of 1.5B/7B/14B/32B/72B declare 131072, the instruct ones 32768).
Gemma 3 4B/12B/27B are multimodal; their presets are the text decoder (``gemma3_text``, what
``Gemma3ForCausalLM`` loads); the ~0.4B-parameter SigLIP vision tower is not counted.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["PRESETS", "get_preset", "preset_names"]


def _alternating(num_layers: int, every: int) -> list[str]:
    """Gemma's local/global pattern: every ``every``-th layer is global, the others slide.

    Gemma 2 (every=2) starts with a sliding layer; Gemma 3 (every=6) has five sliding layers then
    one full one. This is the rule transformers' Gemma2/Gemma3 configs apply.
    """
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(num_layers)]


def _decoder(layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int, max_pos: int,
             tie: bool = False, head_dim: int | None = None, model_type: str = "llama", **extra: Any) -> dict[str, Any]:
    """The fields every preset sets, then ``head_dim`` when the real config sets one, then ``extra``."""
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": tie,
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    cfg.update(extra)
    return cfg


def _qwen25(layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int,
            tie: bool) -> dict[str, Any]:
    # Qwen2.5 ships sliding-window fields but disables them (use_sliding_window: false).
    return _decoder(layers, hidden, heads, kv_heads, inter, vocab, 32768, tie, model_type="qwen2",
                    use_sliding_window=False)


def _gemma2(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int) -> dict[str, Any]:
    return _decoder(layers, hidden, heads, kv_heads, inter, 256000, 8192, True, head_dim, model_type="gemma2",
                    sliding_window=4096, layer_types=_alternating(layers, 2))


def _gemma3(layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, vocab: int,
            window: int, max_pos: int) -> dict[str, Any]:
    return _decoder(layers, hidden, heads, kv_heads, inter, vocab, max_pos, True, head_dim, model_type="gemma3_text",
                    sliding_window=window, sliding_window_pattern=6, layer_types=_alternating(layers, 6))


def _phi3(layers: int, hidden: int, heads: int, kv_heads: int, inter: int) -> dict[str, Any]:
    # The 4k-context Phi-3 configs declare a 2047-token sliding window, which transformers'
    # Phi3 applies (create_sliding_window_causal_mask).
    return _decoder(layers, hidden, heads, kv_heads, inter, 32064, 4096, model_type="phi3", sliding_window=2047)


PRESETS: dict[str, dict[str, Any]] = {
    # Meta Llama 2 (meta-llama/Llama-2-*-hf): 7B and 13B are plain multi-head, 70B uses GQA.
    "llama-2-7b": _decoder(32, 4096, 32, 32, 11008, 32000, 4096),
    "llama-2-13b": _decoder(40, 5120, 40, 40, 13824, 32000, 4096),
    "llama-2-70b": _decoder(80, 8192, 64, 8, 28672, 32000, 4096),
    # Llama 3 / 3.1 (Meta-Llama-3-8B, Llama-3.1-70B, ...): GQA with 8 KV heads, 128k vocabulary.
    "llama-3-8b": _decoder(32, 4096, 32, 8, 14336, 128256, 8192),
    "llama-3-70b": _decoder(80, 8192, 64, 8, 28672, 128256, 8192),
    "llama-3.1-8b": _decoder(32, 4096, 32, 8, 14336, 128256, 131072),
    "llama-3.1-70b": _decoder(80, 8192, 64, 8, 28672, 128256, 131072),
    # Llama 3.2 text models: explicit head_dim, tied embeddings.
    "llama-3.2-1b": _decoder(16, 2048, 32, 8, 8192, 128256, 131072, tie=True, head_dim=64),
    "llama-3.2-3b": _decoder(28, 3072, 24, 8, 8192, 128256, 131072, tie=True, head_dim=128),
    # Mistral-7B-v0.1: every layer slides over a 4096-token window.
    "mistral-7b": _decoder(32, 4096, 32, 8, 14336, 32000, 32768, model_type="mistral", sliding_window=4096),
    # Mixtral-8x7B-v0.1: 8 experts, 2 active per token, no sliding window (sliding_window: null).
    "mixtral-8x7b": _decoder(32, 4096, 32, 8, 14336, 32000, 32768, model_type="mixtral", sliding_window=None,
                             num_local_experts=8, num_experts_per_tok=2),
    # Qwen2.5 (Qwen/Qwen2.5-*-Instruct): q/k/v projections carry biases; small models tie embeddings.
    "qwen2.5-0.5b": _qwen25(24, 896, 14, 2, 4864, 151936, tie=True),
    "qwen2.5-1.5b": _qwen25(28, 1536, 12, 2, 8960, 151936, tie=True),
    "qwen2.5-3b": _qwen25(36, 2048, 16, 2, 11008, 151936, tie=True),
    "qwen2.5-7b": _qwen25(28, 3584, 28, 4, 18944, 152064, tie=False),
    "qwen2.5-14b": _qwen25(48, 5120, 40, 8, 13824, 152064, tie=False),
    "qwen2.5-32b": _qwen25(64, 5120, 40, 8, 27648, 152064, tie=False),
    "qwen2.5-72b": _qwen25(80, 8192, 64, 8, 29568, 152064, tie=False),
    # Gemma 2: head_dim is explicit and not hidden/heads; sliding (4096) and global layers alternate.
    "gemma-2-2b": _gemma2(26, 2304, 8, 4, 256, 9216),
    "gemma-2-9b": _gemma2(42, 3584, 16, 8, 256, 14336),
    "gemma-2-27b": _gemma2(46, 4608, 32, 16, 128, 36864),
    # Gemma 3: five sliding layers per global one.
    "gemma-3-270m": _gemma3(18, 640, 4, 1, 256, 2048, 262144, 512, 32768),  # load_model("gemma3-270m")
    "gemma-3-1b": _gemma3(26, 1152, 4, 1, 256, 6912, 262144, 512, 32768),
    "gemma-3-4b": _gemma3(34, 2560, 8, 4, 256, 10240, 262208, 1024, 131072),
    "gemma-3-12b": _gemma3(48, 3840, 16, 8, 256, 15360, 262208, 1024, 131072),
    "gemma-3-27b": _gemma3(62, 5376, 32, 16, 128, 21504, 262208, 1024, 131072),
    # Phi-3 (microsoft/Phi-3-mini-4k-instruct, Phi-3-medium-4k-instruct).
    "phi-3-mini": _phi3(32, 3072, 32, 32, 8192),
    "phi-3-medium": _phi3(40, 5120, 40, 10, 17920),
    # DeepSeek-V3: multi-head latent attention caches a 512-wide latent plus a 64-wide rope key per
    # token and layer; 3 dense layers, then 58 MoE layers of 256 routed + 1 shared expert. The
    # multi-token-prediction layer (num_nextn_predict_layers: 1) is not loaded by transformers.
    "deepseek-v3": {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "n_group": 8,
        "topk_group": 4,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "head_dim": 64,  # what transformers' DeepseekV3Config sets (qk_rope_head_dim)
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "vocab_size": 129280,
        "max_position_embeddings": 163840,
        "tie_word_embeddings": False,
    },
    # HuggingFaceTB/SmolLM2-135M: the model this project measures on CPU.
    "smollm2-135m": _decoder(30, 576, 9, 3, 1536, 49152, 8192, tie=True, head_dim=64),
}


def preset_names() -> list[str]:
    """Names of the built-in presets, sorted."""
    return sorted(PRESETS)


def get_preset(name: str) -> dict[str, Any]:
    """A copy of preset ``name`` (case-insensitive; ``_`` and spaces read as ``-``).

    Raises:
        KeyError: with the list of known presets when the name is unknown.
    """
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}")
    return copy.deepcopy(PRESETS[key])
