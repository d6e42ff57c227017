"""Recurrent and convolutional state of hybrid models, per row (docs/design.md, "Hybrid models").

A recurrent layer (Gated DeltaNet, Mamba-2, a short convolution) keeps a fixed-size state per row instead of a
per-token cache: a conv state ``[conv_channels, kernel]`` in the compute dtype and, except for pure convolutions,
a recurrent state in float32 (every transformers mixer keeps it so): ``[v_heads, k_dim, v_dim]`` for a Gated
DeltaNet, ``[heads, head_dim, state_size]`` for Mamba-2.

specdec's rollback (:mod:`specdec.runners.recurrent`) keeps, beside the live state, one checkpoint per forward since
the last commit: one for the verifier (its verify pass), ``k`` for a model drafter (its catch-up and ``k - 1``
one-token drafts), and each recurrent layer's input of those forwards (``tokens x hidden`` in the compute dtype).
:func:`state_bytes_per_row` counts all of it. Torch-free, like the rest of :mod:`specdec.sizing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec.sizing.configs import get_field, text_config
from specdec.sizing.memory import dtype_bytes

_RECURRENT_TYPES = {"linear_attention", "mamba", "mamba2", "recurrent", "ssm", "deltanet", "hybrid", "hybrid_sliding"}
_CONV_TYPES = {"conv"}
_MAMBA1 = {"mamba", "falcon_mamba", "jamba"}


@dataclass(frozen=True)
class RecurrentState:
    """One recurrent layer's state per row: a conv state of ``conv_channels x kernel`` in the compute dtype, and
    ``recurrent_elements`` in float32."""

    conv_channels: int
    kernel: int
    recurrent_elements: int

    @property
    def conv_elements(self) -> int:
        return self.conv_channels * self.kernel

    def bytes(self, dtype: Any) -> int:
        return self.conv_elements * dtype_bytes(dtype) + self.recurrent_elements * 4

    def per_position_bytes(self, dtype: Any, tokens: int) -> int:
        """What a forward of ``tokens`` tokens keeps per position: the conv window (the state and the new inputs)
        and the recurrent state after each token."""
        if tokens <= 1:
            return 0
        return self.conv_channels * (self.kernel + tokens) * dtype_bytes(dtype) + tokens * self.recurrent_elements * 4


def recurrent_layers(config: Any) -> list[RecurrentState]:
    """The state of each recurrent layer of ``config`` (empty for attention-only models).

    Raises:
        ValueError: a hybrid whose state sizes the planner cannot read from its config.
    """
    cfg = text_config(config)
    types = get_field(cfg, "layer_types")
    model_type = str(get_field(cfg, "model_type", default="") or "")
    if types is None or model_type == "jamba":  # jamba's layer_types name its Mamba layers "linear_attention"
        types = get_field(cfg, "layers_block_type", default=types)
    if types is None:
        if model_type in ("mamba2",):
            types = ["mamba"] * int(get_field(cfg, "num_hidden_layers"))
        else:
            return []
    types = [str(t).lower() for t in types]
    if model_type == "falcon_h1":  # every layer is attention + Mamba-2 side by side
        types = ["hybrid"] * len(types)
    layers = []
    for t in types:
        if t in _CONV_TYPES:
            layers.append(_short_conv(cfg))
        elif t in _RECURRENT_TYPES:
            layers.append(_recurrent(cfg, model_type))
    return layers


def _short_conv(cfg: Any) -> RecurrentState:
    """LFM2's gated short convolution: ``hidden`` channels, ``conv_L_cache`` taps."""
    return RecurrentState(int(get_field(cfg, "hidden_size")), int(get_field(cfg, "conv_L_cache", default=3)), 0)


def _recurrent(cfg: Any, model_type: str) -> RecurrentState:
    hidden = int(get_field(cfg, "hidden_size"))
    if get_field(cfg, "linear_num_value_heads") is not None:  # Gated DeltaNet (qwen3_next, qwen3_5)
        k_dim, v_dim = int(get_field(cfg, "linear_key_head_dim")), int(get_field(cfg, "linear_value_head_dim"))
        k_heads, v_heads = int(get_field(cfg, "linear_num_key_heads")), int(get_field(cfg, "linear_num_value_heads"))
        kernel = int(get_field(cfg, "linear_conv_kernel_dim", default=4))
        return RecurrentState(2 * k_heads * k_dim + v_heads * v_dim, kernel, v_heads * k_dim * v_dim)
    if model_type in _MAMBA1:  # Mamba-1 (mamba, falcon_mamba, jamba): one state per inner channel
        inner = get_field(cfg, "intermediate_size") if model_type != "jamba" else None
        inner = int(inner or int(get_field(cfg, "mamba_expand", "expand", default=2)) * hidden)
        state = int(get_field(cfg, "mamba_d_state", "state_size", default=16))
        return RecurrentState(inner, int(get_field(cfg, "mamba_d_conv", "conv_kernel", default=4)), inner * state)
    # Mamba-2 (nemotron_h, falcon_h1, granitemoehybrid, mamba2): field names differ by family
    heads = get_field(cfg, "mamba_num_heads", "mamba_n_heads", "num_heads")
    head_dim = get_field(cfg, "mamba_head_dim", "mamba_d_head", "head_dim")
    groups = get_field(cfg, "n_groups", "mamba_n_groups", default=1)
    state = get_field(cfg, "ssm_state_size", "mamba_d_state", "state_size")
    kernel = get_field(cfg, "conv_kernel", "mamba_d_conv", default=4)
    if heads is None or state is None:
        raise ValueError(f"cannot size the recurrent state of {model_type or 'this model'}: its config names no "
                         "Mamba-2 or Gated DeltaNet state sizes")
    heads, state, groups, kernel = int(heads), int(state), int(groups), int(kernel)
    if head_dim in (None, "auto"):
        expand = get_field(cfg, "mamba_expand", "expand", default=2)
        inner = int(get_field(cfg, "mamba_d_ssm", default=None) or int(expand) * hidden)
        head_dim = inner // heads
    inner = get_field(cfg, "mamba_d_ssm", default=None) or heads * int(head_dim)
    return RecurrentState(int(inner) + 2 * groups * state, kernel, heads * int(head_dim) * state)


def state_bytes_per_row(config: Any, dtype: Any = "bfloat16", checkpoints: int = 1, tokens: int = 1) -> int:
    """Bytes one row's recurrent layers hold during a call: the live state plus ``checkpoints`` copies of it, each
    recurrent layer's recorded input over ``tokens`` tokens, and the states a forward of ``tokens`` tokens keeps per
    position (0 for attention-only models)."""
    layers = recurrent_layers(config)
    if not layers:
        return 0
    hidden = int(get_field(text_config(config), "hidden_size"))
    live = sum(layer.bytes(dtype) for layer in layers)
    per_position = sum(layer.per_position_bytes(dtype, tokens) for layer in layers)
    return live * (1 + checkpoints) + len(layers) * tokens * hidden * dtype_bytes(dtype) + per_position
