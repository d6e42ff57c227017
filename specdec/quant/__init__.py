"""Quantized drafters: cheap copies of a causal LM through maintained backends.

>>> from specdec.quant import quantize, available_schemes, model_bytes
>>> draft = quantize(verifier, "int8")          # shares the embedding table with the verifier
>>> model_bytes(draft, exclude=verifier)        # what the draft adds in memory

Schemes (``SCHEMES`` describes each): ``fp32``/``none``, ``bf16``, ``fp16``, ``int8`` (the best
int8 for the device), ``int8-dynamic``, ``int8-weight-only``, ``int4[:gN]``, ``nf4``, ``fp4``;
append ``+head`` to keep the LM head unquantized. See docs/quantization.md for measurements.
"""

from .core import QuantInfo, available_schemes, quantize, scheme_backend
from .memory import model_bytes
from .schemes import (
    SCHEMES,
    ParsedScheme,
    SchemeInfo,
    UnknownSchemeError,
    UnsupportedSchemeError,
    parse_scheme,
    scheme_names,
)

__all__ = [
    "SCHEMES",
    "ParsedScheme",
    "QuantInfo",
    "SchemeInfo",
    "UnknownSchemeError",
    "UnsupportedSchemeError",
    "available_schemes",
    "model_bytes",
    "parse_scheme",
    "quantize",
    "scheme_backend",
    "scheme_names",
]
