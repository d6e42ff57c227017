"""Quantized drafters: cheap copies of a causal LM through maintained backends.

>>> from specdec.quant import quantize, available_schemes, model_bytes
>>> draft = quantize(verifier, "int8")          # shares the embedding table with the verifier
>>> model_bytes(draft, exclude=verifier)        # what the draft adds in memory

Schemes (``SCHEMES`` describes each): ``fp32``/``none``, ``bf16``, ``fp16``, ``int8`` (the best
int8 for the device), ``int8-dynamic``, ``int8-weight-only``, ``int4[:gN]``, ``nf4``, ``fp4``;
append ``+head`` to keep the LM head unquantized. See docs/quantization.md for measurements.

``weight_error(verifier, scheme)`` says how far a scheme moves the verifier's weights, and flags
a scheme whose grid the verifier's weights already lie on (``grid_bound``; e.g. ``int4`` on the
embedded Q4_1 SmolLM2), whose acceptance says nothing about a bf16 checkpoint.

The scheme table and its parser are torch-free; everything that needs torch (``quantize``,
``model_bytes``, ``weight_error``...) is imported on first use, so ``specdec plan`` can read the
table without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .schemes import (
    SCHEMES,
    OffloadedModelError,
    ParsedScheme,
    SchemeInfo,
    UnknownSchemeError,
    UnsupportedSchemeError,
    parse_scheme,
    scheme_names,
)

if TYPE_CHECKING:
    from .core import QuantInfo, available_schemes, quantize, scheme_backend
    from .grid import GRID_BOUND_NOTE, GRID_TOLERANCE, WeightError, dequantize_weight, weight_error
    from .backends import int8_dynamic_packing
    from .memory import model_bytes

#: public name -> submodule that defines it (imported on first access: it imports torch)
_LAZY = {
    "QuantInfo": ".core", "available_schemes": ".core", "quantize": ".core", "scheme_backend": ".core",
    "GRID_BOUND_NOTE": ".grid", "GRID_TOLERANCE": ".grid", "WeightError": ".grid",
    "dequantize_weight": ".grid", "weight_error": ".grid",
    "model_bytes": ".memory", "int8_dynamic_packing": ".backends",
}

__all__ = [
    "GRID_BOUND_NOTE",
    "GRID_TOLERANCE",
    "OffloadedModelError",
    "SCHEMES",
    "ParsedScheme",
    "QuantInfo",
    "SchemeInfo",
    "UnknownSchemeError",
    "UnsupportedSchemeError",
    "WeightError",
    "available_schemes",
    "dequantize_weight",
    "int8_dynamic_packing",
    "model_bytes",
    "parse_scheme",
    "quantize",
    "scheme_backend",
    "scheme_names",
    "weight_error",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
