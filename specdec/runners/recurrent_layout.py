"""Which layers of a hybrid model hold recurrent or convolutional state, the mixers that read and write it, and the
hooks that hand each mixer's call to its session's history (docs/design.md, "Hybrid models").

transformers declares each decoder layer's cache class (``get_layer_types_and_kwargs``); a layer whose class keeps
conv/recurrent state (``LinearAttentionCacheLayerMixin``) is recurrent, and its mixer is the module of that
``layer_idx`` whose forward reads the state from the cache. :func:`layout` finds them once per runner, routes their
modules' scans through :mod:`specdec.runners.scans` and hooks them; :func:`refusal` words what stays refused.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from specdec.runners import scans

try:  # transformers >= 5.2x declares each layer type's cache class; older ones run no hybrid (check_supported refuses)
    from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING, DummyLayer, get_layer_types_and_kwargs
except ImportError:
    DYNAMIC_LAYER_TYPE_MAPPING, DummyLayer, get_layer_types_and_kwargs = {}, None, None

#: the first transformers release whose cache declares every layer's class per layer (``DummyLayer``, per-layer kwargs)
HYBRID_TRANSFORMERS = "5.23"
#: whether the installed transformers can run hybrid and recurrent models here
HYBRIDS_SUPPORTED = DummyLayer is not None

_HOOKED = "_specdec_recurrent_hooks"  # set on a model whose mixers carry our pre-hook (copies of it inherit both)


@dataclass
class Layout:
    """Which decoder layers of a model hold recurrent state, how many states each, and the mixer module that
    reads and writes them (found once per runner)."""

    states: dict[int, int]  # layer index -> number of conv/recurrent states
    mixers: dict[int, torch.nn.Module]
    stateless: tuple[int, ...] = ()  # layers that keep nothing (MLP/MoE-only blocks)
    raw_mask: bool = False  # the model hands its 2-D padding mask to the mixers untrimmed (mamba, falcon_mamba)


def cache_layer_types(config: Any) -> list[str]:
    """The transformers cache layer type of each decoder layer of ``config`` ("full_attention", "linear_attention",
    "conv", "hybrid", "dummy", ...); empty if transformers cannot tell."""
    return _types_and_kwargs(config)[0]


def _types_and_kwargs(config: Any) -> tuple[list[str], list[dict]]:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if get_layer_types_and_kwargs is None:
        return [], []
    try:
        return get_layer_types_and_kwargs(text)
    except (AttributeError, TypeError, ValueError):
        return [], []


def recurrent_layer_types(config: Any) -> dict[int, int]:
    """``{layer index: number of states}`` for the layers of ``config`` whose transformers cache layer keeps
    recurrent or convolutional state (empty for attention-only models)."""
    types, kwargs = _types_and_kwargs(config)
    out = {}
    for i, (kind, extra) in enumerate(zip(types, kwargs)):
        cls = DYNAMIC_LAYER_TYPE_MAPPING.get(kind)
        if isinstance(cls, type) and issubclass(cls, LinearAttentionCacheLayerMixin):
            out[i] = int(extra.get("number_of_states", 1))
    return out


def _source(module: torch.nn.Module) -> str:
    return _forward_source(type(module))


@functools.lru_cache(maxsize=None)
def _forward_source(cls: type) -> str:
    """The source of ``cls.forward``, read once per class (``layout`` walks every module of a model, and
    ``check_supported`` and the runner each ask)."""
    try:
        return inspect.getsource(inspect.unwrap(cls.forward))
    except (OSError, TypeError):
        return ""


def _reads_state(module: torch.nn.Module) -> bool:
    """Whether ``module``'s forward reads a recurrent or conv state from the cache (a mixer, not an attention)."""
    source = _source(module)
    return "get_conv_state" in source or "get_recurrent_state" in source


# Mamba-1 mixers (jamba, mamba, falcon_mamba) scan a multi-token input with transformers' ``mamba_selective_scan``,
# which takes no initial state: a verify pass would restart the recurrence from zero instead of the cached state.
_RESTARTS_STATE = "mamba_selective_scan("


def layout(model: torch.nn.Module) -> Layout | None:
    """The recurrent layout of ``model`` (None for attention-only models), with a pre-hook on each mixer that
    records its input for the session whose cache it is handed. Raises ``ValueError`` if some recurrent layer's
    mixer cannot be found (the caller refuses the model)."""
    states = recurrent_layer_types(model.config)
    if not states:
        return None
    mixers: dict[int, torch.nn.Module] = {}
    for module in model.modules():
        idx = getattr(module, "layer_idx", None)
        if isinstance(idx, int) and idx in states and _reads_state(module):
            if idx in mixers:
                raise ValueError(f"layer {idx} has two modules that read its recurrent state")
            mixers[idx] = module
    missing = sorted(set(states) - set(mixers))
    if missing:
        raise ValueError(f"no module reading the recurrent state of layers {missing} was found")
    # every mixer's multi-token scan keeps a state per position within a session's forward (scans.py); a
    # Mamba-1 mixer whose scan cannot be routed there would restart each verify pass from zero
    installed = {idx: scans.install(m) for idx, m in mixers.items()}
    restarts = sorted({type(m).__name__ for idx, m in mixers.items()
                       if _RESTARTS_STATE in _source(m) and "mamba_selective_scan" not in installed[idx]})
    if restarts:
        raise ValueError(f"its mixer {restarts[0]} scans several tokens from a zero state (transformers' "
                         "mamba_selective_scan takes no initial state), so a verify pass cannot continue a sequence")
    if not getattr(model, _HOOKED, False):
        for module in mixers.values():
            module.register_forward_pre_hook(_record_input, with_kwargs=True)
            module.register_forward_hook(_skip_filler, with_kwargs=True)
        setattr(model, _HOOKED, True)
    stateless = tuple(i for i, kind in enumerate(cache_layer_types(model.config)) if kind == "dummy")
    base = getattr(model, "base_model", model)
    # only where no layer attends (an attention layer needs the whole 2-D mask)
    raw = "create_recurrent_attention_mask" not in _source(base) and "attention_mask" in _source(base) \
        and len(states) + len(stateless) == len(cache_layer_types(model.config))
    return Layout(states, mixers, stateless, raw_mask=raw)


def _history(kwargs: dict) -> tuple[str, Any]:
    """The keyword a mixer got its cache by, and that cache's history (None: not a specdec session's cache)."""
    for name in ("cache", "cache_params", "past_key_values"):
        history = getattr(kwargs.get(name), "recurrent_history", None)
        if history is not None:
            return name, history
    return "", None


def _record_input(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook of a mixer: hand its input to the history of the managed cache it runs on, if any."""
    name, history = _history(kwargs)
    if history is not None:
        history.record(module.layer_idx, name, args, kwargs)


def _skip_filler(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    """Forward hook of a mixer: in a block with filler before some rows' real tokens, redo those rows over their real
    tokens alone (state and output), so the filler never enters a recurrence (None: the output stands)."""
    _, history = _history(kwargs)
    return None if history is None else history.skip_filler(module.layer_idx, output)


def refusal(model: torch.nn.Module, feature: str = "compile") -> str:
    """The one-line reason ``feature`` is refused for a hybrid ``model``: trees under ``compile_verifier``, or a
    model drafter's static passes."""
    kind = getattr(model.config, "model_type", type(model).__name__)
    if feature == "tree":
        return (f"{kind} has recurrent layers, whose tree passes are not compiled: use trees without "
                "compile_verifier, or chains with it")
    return (f"{kind} has recurrent layers, whose catch-up filler a model drafter's static passes would feed into "
            "its recurrence; compile it eagerly or not at all")
