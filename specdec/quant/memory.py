"""Real memory of a module's parameters and buffers, packed and quantized weights included."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch import nn


def _leaf_tensors(t: object, depth: int = 0) -> Iterator[torch.Tensor]:
    """The plain tensors that hold ``t``'s data.

    Unwraps tensor subclasses that declare their inner tensors (torchao's quantized tensors) and
    the side tensors bitsandbytes hangs on its parameters (4-bit ``quant_state``, int8 ``SCB``).
    """
    if depth > 8 or t is None:
        return
    if isinstance(t, torch.Tensor):
        flatten = getattr(type(t), "__tensor_flatten__", None)
        if flatten is not None and type(t) not in (torch.Tensor, nn.Parameter):
            try:
                names, _ctx = t.__tensor_flatten__()
            except Exception:  # pragma: no cover - a subclass that cannot flatten
                names = []
            if names:
                for n in names:
                    yield from _leaf_tensors(getattr(t, n, None), depth + 1)
                return
        yield t
        for attr in ("SCB", "quant_state"):  # bitsandbytes Int8Params / Params4bit
            side = getattr(t, attr, None)
            if side is not None and side is not t:
                yield from _leaf_tensors(side, depth + 1)
        return
    # bitsandbytes QuantState (absmax, code, nested state2 ...)
    if type(t).__name__ == "QuantState":
        for attr in ("absmax", "code", "offset"):
            yield from _leaf_tensors(getattr(t, attr, None), depth + 1)
        yield from _leaf_tensors(getattr(t, "state2", None), depth + 1)


def _packed_tensors(module: nn.Module) -> Iterator[torch.Tensor]:
    """Tensors hidden in TorchScript packed-params objects (torch.ao dynamic quantized Linear)."""
    packed = getattr(module, "_packed_params", None)
    inner = getattr(packed, "_packed_params", None)
    if inner is None or isinstance(inner, torch.Tensor):
        return
    try:
        # fbgemm keeps the int8 matrix (re-laid out, same size) with per-channel scale and zero
        # point; unpack gives the equivalent tensors, whose sizes are what we count.
        weight, bias = packed._weight_bias()
    except Exception:  # pragma: no cover - an engine without unpack
        return
    if weight.is_quantized:
        yield weight.int_repr()  # the int8 codes (1 byte each)
        if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            # stored as float32 scale + int32 zero point per channel by fbgemm
            yield torch.empty(weight.q_per_channel_scales().numel(), dtype=torch.float32, device="meta")
            yield torch.empty(weight.q_per_channel_zero_points().numel(), dtype=torch.int32, device="meta")
    else:
        yield weight
    if bias is not None:
        yield bias


def _all_tensors(modules: Iterable[nn.Module]) -> Iterator[torch.Tensor]:
    for mod in modules:
        for t in list(mod._parameters.values()) + list(mod._buffers.values()):
            yield from _leaf_tensors(t)
        yield from _packed_tensors(mod)


def _key(t: torch.Tensor, serial: int) -> tuple:
    if t.device.type == "meta":  # size-only stand-ins: never shared
        return ("meta", serial)
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


def _nbytes(t: torch.Tensor) -> int:
    if t.device.type == "meta":
        return t.numel() * t.element_size()
    # a view counts its whole storage: that is what stays allocated
    return max(t.untyped_storage().nbytes(), t.numel() * t.element_size())


def model_bytes(module: nn.Module, *, exclude: nn.Module | None = None) -> int:
    """Bytes held by ``module``'s parameters and buffers, each storage counted once.

    Quantized and packed weights count at their real size (int8 codes, packed int4 nibbles,
    scales, zero points, bitsandbytes quantization state). Tensors shared between modules (tied
    embeddings) or with views count once. With ``exclude``, storages that ``exclude`` also holds
    are not counted: ``model_bytes(copy, exclude=model)`` is what a quantized copy adds on top of
    the model it was made from.
    """
    # Materialize first: unpacking creates temporaries, and a freed temporary's address could be
    # reused by the next one and wrongly deduplicated.
    tensors = list(_all_tensors(module.modules()))
    skip = set()
    if exclude is not None:
        ex = list(_all_tensors(exclude.modules()))
        skip = {_key(t, -1) for t in ex if t.device.type != "meta"}
    seen: dict[tuple, int] = {}
    for i, t in enumerate(tensors):
        k = _key(t, i)
        if k in skip:
            continue
        seen[k] = max(seen.get(k, 0), _nbytes(t))
    return sum(seen.values())
