"""The speculators EAGLE-3 layout (vllm-project/speculators; what vLLM serves as ``speculators_model_type:
"eagle3"``), read and written beside the public EAGLE-3 layout of :mod:`specdec.heads.checkpoint`.

The two hold the same head; they differ in names only:

- config.json: speculators nests the decoder layer's settings under ``transformer_layer_config`` (a transformers
  config) and keeps ``draft_vocab_size``, ``target_hidden_size``, ``norm_before_residual`` and
  ``eagle_aux_hidden_state_layer_ids`` at the top, with a ``speculators_config`` (proposal method, verifier);
- weights: ``layers.0.*`` where the public layout has ``midlayer.*``; ``embed_tokens`` is saved with the head
  (speculators fills it from the verifier otherwise, which needs the hub); ``verifier_norm`` and
  ``verifier_lm_head`` are training-only copies of the verifier's and carry nothing a drafter needs.

speculators' variants specdec's head does not implement (``norm_before_fc``, ``fc_norm``, ``norm_output``, more
than one decoder layer, a Qwen3 layer with q/k norms) are refused by name at load, never silently dropped.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.heads.config import HeadConfig
from specdec.heads.modules import llama_config

#: ``speculators_model_type`` of the layout this module reads and writes
SPECULATORS_TYPE = "eagle3"
#: speculators version whose layout this follows (its ``speculators_version`` field)
SPECULATORS_VERSION = "0.9.0"
#: flags of speculators' EAGLE-3 variants specdec's head does not implement, and what each would change
_UNSUPPORTED_FLAGS = {
    "norm_before_fc": "an RMSNorm over the concatenated verifier states before the fc",
    "fc_norm": "an RMSNorm per verifier state before the fc",
    "norm_output": "normed outputs fed back across draft steps (EAGLE 3.1)",
}
#: decoder-layer settings read from ``transformer_layer_config`` into the public layout's top level (at load)
_LAYER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               "rms_norm_eps", "max_position_embeddings", "hidden_act", "vocab_size")
#: training-only tensors speculators may save (frozen copies of the verifier's final norm and LM head rows)
_TRAINING_ONLY = ("verifier_norm.", "verifier_lm_head.")


def is_speculators(config: dict[str, Any]) -> bool:
    """Whether a config.json is in the speculators layout (it names a ``speculators_model_type``)."""
    return "speculators_model_type" in config


def public_config(data: dict[str, Any]) -> dict[str, Any]:
    """A speculators config.json as the public EAGLE-3 config :class:`~specdec.heads.config.HeadConfig` reads.

    Raises ``ValueError`` (one line, naming the field) for another algorithm or a variant specdec's head does not
    implement.
    """
    kind = data.get("speculators_model_type")
    if kind != SPECULATORS_TYPE:
        raise ValueError(f"speculators_model_type is {kind!r}; specdec loads {SPECULATORS_TYPE!r} heads")
    on = [name for name in _UNSUPPORTED_FLAGS if data.get(name)]
    if on:
        raise ValueError(f"{', '.join(on)} {'is' if len(on) == 1 else 'are'} set ("
                         + "; ".join(_UNSUPPORTED_FLAGS[n] for n in on) + "): specdec's EAGLE-3 head does not implement "
                         "this variant")
    layer = data.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ValueError(f"transformer_layer_config must be an object, got {layer!r}")
    model_type = layer.get("model_type", "llama")
    if model_type != "llama":
        raise ValueError(f"transformer_layer_config is a {model_type!r} layer; specdec's head is a Llama layer "
                         "(a Qwen3 layer adds q/k norms it does not have)")
    layers = layer.get("num_hidden_layers", 1)
    if layers != 1:
        raise ValueError(f"transformer_layer_config has num_hidden_layers {layers!r}; specdec's EAGLE-3 head has one "
                         "decoder layer")
    if layer.get("mlp_bias"):
        raise ValueError("transformer_layer_config sets mlp_bias; specdec's head has an MLP without biases")
    out = {k: layer[k] for k in _LAYER_KEYS if layer.get(k) is not None}
    rope = dict(layer.get("rope_parameters") or layer.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", layer.get("rope_theta"))
    if theta is not None:
        out["rope_theta"] = theta
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        out["rope_scaling"] = rope
    for key in ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "eagle_aux_hidden_state_layer_ids"):
        if data.get(key) is not None:
            out[key] = data[key]
    # speculators always writes norm_before_residual; a file without it gets speculators' own default (false;
    # vLLM would read it as true, which is why export_speculators always writes it)
    out.setdefault("norm_before_residual", False)
    return out


def public_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """speculators weight names as the public layout's: ``layers.0.*`` -> ``midlayer.*``; training-only copies of
    the verifier dropped. Other names pass unchanged, so a wrong file fails the shape check, which names them."""
    out = {}
    for key, value in state.items():
        if key.startswith(_TRAINING_ONLY):
            continue
        out["midlayer." + key.removeprefix("layers.0.") if key.startswith("layers.0.") else key] = value
    return out


def speculators_config(config: HeadConfig, *, dtype: str, verifier_name_or_path: str | None,
                       verifier_architectures: list[str], speculative_tokens: int) -> dict[str, Any]:
    """The speculators config.json of an EAGLE-3 head of ``config`` (weights in ``dtype``, e.g. ``"bfloat16"``)."""
    llama = llama_config(config)  # the head's own layer settings, rope included, as the head builds them
    llama.num_hidden_layers = 1
    layer = {**llama.to_diff_dict(), "architectures": ["LlamaForCausalLM"]}  # speculators serialises the same way
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": SPECULATORS_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "norm_before_residual": config.norm_before_residual,  # explicit: vLLM reads a missing one as true
        "norm_before_fc": False, "fc_norm": False, "norm_output": False, "embed_requires_grad": False,
        "eagle_aux_hidden_state_layer_ids": list(config.aux_layers),
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "speculators_config": {
            "algorithm": SPECULATORS_TYPE,
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier_name_or_path, "architectures": list(verifier_architectures)},
        },
    }
