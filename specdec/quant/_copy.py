"""A structural copy of a model that shares every tensor with the source.

Quantizing replaces modules and tensors *in the copy*; whatever a scheme leaves alone (the input
embedding table, norms of an fp32 copy, rotary buffers) stays one tensor in memory for both
models. Nothing here ever writes into a shared tensor: dtype changes go through
:func:`convert_tensors`, which installs new Parameter objects instead of ``param.data = ...``
(what ``Module.to(dtype)`` does, and which would change the source model too).
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def shared_copy(model: nn.Module) -> nn.Module:
    """Deep-copy ``model``'s modules and config while sharing its parameters and buffers."""
    memo: dict[int, object] = {}
    for t in list(model.parameters()) + list(model.buffers()):
        memo[id(t)] = t
    return copy.deepcopy(model, memo)


def convert_tensors(
    module: nn.Module,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | None = None,
    skip: tuple[nn.Module, ...] = (),
    cache: dict[int, torch.Tensor] | None = None,
) -> None:
    """Give ``module`` new tensors where the dtype (floating params) or device must change.

    Floating parameters become ``dtype``; every parameter and buffer moves to ``device``. Tied
    parameters (one Parameter object reached from two modules) stay tied. Float buffers keep their
    dtype: in HF decoders they are rotary ``inv_freq`` tables, which HF computes in float32
    anyway. Modules in ``skip`` (and their children) are left alone; a tensor that needs no
    change stays the shared one.
    """
    cache = {} if cache is None else cache
    skipped = {id(m) for s in skip for m in s.modules()}
    for mod in module.modules():
        if id(mod) in skipped:
            continue
        for table, is_param in ((mod._parameters, True), (mod._buffers, False)):
            for name, t in list(table.items()):
                if t is None:
                    continue
                want_dtype = dtype if (is_param and dtype is not None and t.is_floating_point()) else t.dtype
                want_device = device if device is not None else t.device
                if t.dtype == want_dtype and t.device == torch.device(want_device):
                    continue
                new = cache.get(id(t))
                if new is None:
                    data = t.detach().to(device=want_device, dtype=want_dtype)
                    new = nn.Parameter(data, requires_grad=False) if is_param else data
                    cache[id(t)] = new
                table[name] = new


def cast_output_hook(dtype: torch.dtype):
    """A forward hook that casts a module's floating output to ``dtype``.

    Used on the input embedding so a low-precision copy can keep reading the source's fp32 table
    (one row per token: no speed cost) instead of holding a second, converted copy of it.
    """

    def hook(_module: nn.Module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.to(dtype)
        return output

    return hook
