"""Layer-skip self-drafting: the verifier's first N decoder layers plus its own final norm and head.

No second model and no extra weights: the drafter's modules *are* the verifier's (shared, not copied).
"""

from __future__ import annotations

import copy

import torch

from specdec.draft_registry import DraftSpecError
from specdec.drafters.model import ModelDrafter


def check_layer_count(num_layers: int, total: int) -> None:
    """Raise :class:`~specdec.draft_spec.DraftSpecError` unless a verifier of ``total`` decoder layers can draft with
    its first ``num_layers`` (the CLI checks this against the verifier's config before the weights load)."""
    if not 1 <= num_layers < total:
        raise DraftSpecError(f"layer-skip needs 1 <= N < {total} (the verifier's layer count), got {num_layers}")


def _decoder_layers_path(model: torch.nn.Module, num_layers: int) -> list[str]:
    """Attribute path to the ModuleList holding the decoder layers (e.g. ['model', 'layers'])."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == num_layers and name:
            return name.split(".")
    raise DraftSpecError(f"cannot find the decoder layers of {type(model).__name__} for layer-skip drafting")


def truncated_model(model: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """A view of ``model`` that runs only its first ``num_layers`` decoder layers (weights shared)."""
    config = model.config
    total = int(config.num_hidden_layers)
    check_layer_count(num_layers, total)
    path = _decoder_layers_path(model, total)
    hooked = [name for name in ["", *(".".join(path[: i + 1]) for i in range(len(path) - 1))]
              if hasattr(model.get_submodule(name), "_hf_hook")]
    if hooked:  # accelerate's forward wrapper is bound to the original module: a view of it would run every layer
        raise DraftSpecError(f"layer-skip:{num_layers} cannot draft with the first layers of a model that accelerate "
                             f"dispatched (device_map; hooked: {hooked[0] or type(model).__name__}): its hooks run the "
                             "whole model. Load it without device_map, or draft with prompt-lookup, suffix or a "
                             "separate draft model")
    small_config = copy.deepcopy(config)
    small_config.num_hidden_layers = num_layers
    if getattr(small_config, "layer_types", None):
        small_config.layer_types = list(small_config.layer_types)[:num_layers]
    # Shallow-copy each container on the path (so the verifier is untouched), share everything else.
    root = copy.copy(model)
    root._modules = dict(model._modules)
    parent = root
    for name in path[:-1]:
        child = copy.copy(parent._modules[name])
        child._modules = dict(child._modules)
        parent._modules[name] = child
        parent = child
    parent._modules[path[-1]] = torch.nn.ModuleList(list(parent._modules[path[-1]])[:num_layers])
    for module in [root, *[root.get_submodule(".".join(path[: i + 1])) for i in range(len(path) - 1)]]:
        if hasattr(module, "config"):
            module.config = small_config
    return root


class LayerSkipDrafter(ModelDrafter):
    """Drafts with the first ``num_layers`` layers of the verifier (optionally early-stopping on low confidence)."""

    def __init__(self, verifier: torch.nn.Module, num_layers: int, confidence_threshold: float | None = None) -> None:
        # the first N layers' keys/values of the prompt *are* the verifier's: reuse them exactly
        super().__init__(truncated_model(verifier, num_layers), confidence_threshold=confidence_threshold,
                         reuse_verifier_prompt=True)
        self.num_layers = num_layers
