"""Tiny randomly initialised hybrid causal LMs (recurrent / convolutional layers beside attention), from configs.

Each has at least one recurrent layer before an attention layer and a third layer, so a verify pass crosses both
kinds. ``initializer_range=0.3`` spreads the logits as in tests/tiny_models.py. ``DENSE`` pairs a hybrid with an
attention-only model of the same hidden size and depth (benchmarks/hybrid_pass_cost.py).
"""

from __future__ import annotations

import torch
import transformers as tf
from tiny_models import COMMON

_ATTN = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
_GDN = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4)
_MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
               mamba_chunk_size=8)

CONFIGS = {
    "qwen3_next": lambda: tf.Qwen3NextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, **_ATTN, **_GDN, num_experts=0,
        layer_types=["linear_attention", "full_attention", "linear_attention"], **COMMON),
    "qwen3_5": lambda: tf.Qwen3_5TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, **_ATTN, **_GDN,
        layer_types=["linear_attention", "full_attention", "linear_attention"], **COMMON),
    # initializer_range 0.1: transformers' NemotronH one-token scan drifts from its chunked scan as weights grow
    # (0.7% of the mixer's output at 0.3, 0.005% at 0.1), so generate itself would disagree with a full forward
    "nemotron_h": lambda: tf.NemotronHConfig(
        hidden_size=64, intermediate_size=128, layers_block_type=["mamba", "attention", "mlp"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=1,
        ssm_state_size=16, conv_kernel=4, expand=2, chunk_size=8, **{**COMMON, "initializer_range": 0.1}),
    "falcon_h1": lambda: tf.FalconH1Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, **_ATTN, **_MAMBA2, mamba_d_ssm=128, **COMMON),
    "jamba": lambda: tf.JambaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, num_experts=2,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, **COMMON),
    "lfm2": lambda: tf.Lfm2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv"], block_auto_adjust_ff_dim=False, **COMMON),
    "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["mamba", "attention", "mamba"], num_local_experts=0, shared_intermediate_size=128,
        **_MAMBA2, **COMMON),
}

HYBRIDS = tuple(CONFIGS)

# attention-only twins of a hybrid (same hidden size, depth and attention)
DENSE = {
    "qwen3_next": lambda: tf.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=3, **_ATTN, **COMMON),
}


def make_hybrid(arch: str, seed: int = 0, config: tf.PretrainedConfig | None = None) -> torch.nn.Module:
    """A tiny fp32 hybrid model of ``arch`` (or of ``config``) with a fixed seed."""
    torch.manual_seed(seed)
    config = config or CONFIGS[arch]()
    return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
