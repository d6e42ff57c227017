"""Scheme names, their parsing, and the one table of what each scheme stores and where it runs.

A scheme string is ``BASE[:gN][+head|+head8|+head16]``:

* ``BASE`` is a registered name (``int8``, ``int4``, ``nf4``, ...; see :data:`SCHEMES`);
* ``:gN`` sets the group size of grouped schemes (``int4:g32``, ``int4:g128``);
* ``+head`` keeps the LM head (``lm_head``) in the model's own precision instead of quantizing it.
  For a verifier with tied embeddings this costs no extra memory (the head is the embedding table
  that the copy shares anyway) but it costs time per token, since the head is a large matmul.
* ``+head8`` quantizes the head with per-channel int8 weights (``int8-weight-only``) whatever the
  body's scheme; ``+head16`` keeps it in bf16. On SmolLM2, int4 loses most of its agreement in
  the head: ``int4+head8`` agrees 0.99 where ``int4`` agrees 0.88, for ~15% more time per token.

:data:`SCHEMES` is the only table of schemes: :func:`specdec.quant.quantize` (through
:data:`specdec.quant.backends.BACKENDS`) and the memory planner (:func:`specdec.sizing.parse_quant`)
both read it, so they accept the same names and agree on storage and compute dtypes. This module
does not import torch at import time, so ``specdec plan`` can read the table without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdec.errors import SpecdecError

if TYPE_CHECKING:
    import torch


class UnknownSchemeError(SpecdecError, ValueError):
    """Raised for a scheme name that is not registered; the message lists the valid ones."""


class OffloadedModelError(SpecdecError, ValueError):
    """Raised for a quantized copy of a model whose weights accelerate offloaded (``device_map`` with CPU or disk
    offload leaves them on the meta device, loaded by hooks at each forward): there is nothing to copy."""


class UnsupportedSchemeError(SpecdecError, ValueError):
    """Raised when a scheme has no working backend on the requested device.

    The message names the scheme, the device, why, and the schemes that do work there.
    """

    def __init__(self, scheme: str, device: str, reason: str, alternatives: list[str]) -> None:
        self.scheme, self.device, self.reason, self.alternatives = scheme, device, reason, alternatives
        super().__init__(
            f"quantization scheme {scheme!r} is not supported on device {device!r}: {reason}. "
            f"Schemes that work on {device!r}: {', '.join(alternatives) or '(none)'}"
        )


@dataclass(frozen=True)
class SchemeInfo:
    """One registered scheme: what it does, how it stores a linear weight, and where it runs.

    Storage (read by the planner): ``bits`` per weight plus ``overhead_bytes`` of scales and zero
    points per group of input weights: the scheme's group size (``:gN``, else
    ``default_group_size``), else its fixed ``block_size``, else one group per output channel.
    Overheads follow the CPU backends (docs/sizing.md lists them).
    """

    name: str
    description: str
    #: device type ("cpu", "cuda") -> human-readable backend name
    backends: dict[str, str]
    #: default group size for grouped schemes (``:gN`` allowed), None otherwise
    default_group_size: int | None = None
    aliases: tuple[str, ...] = ()
    notes: str = ""
    #: bits per stored weight of a quantized (or cast) linear layer
    bits: float = 16.0
    #: bytes of scales / zero points per group (see the class docstring)
    overhead_bytes: float = 0.0
    #: weights per overhead group for schemes whose group cannot be chosen (bitsandbytes blocks)
    block_size: int | None = None
    #: device type -> dtype (name) the copy computes, and so caches KV, in
    compute_dtypes: dict[str, str] = field(default_factory=dict)
    #: the float dtype (name) of a plain cast scheme (fp32/bf16/fp16); None for quantized schemes
    cast_dtype: str | None = None

    def backend(self, device: Any) -> str | None:
        """The backend's name on ``device`` (None when the scheme has none there)."""
        return self.backends.get(device_type(device))

    def compute_dtype(self, device: Any) -> str | None:
        """Name of the dtype the copy computes in on ``device`` (``"bfloat16"``...), None if it cannot run there."""
        return self.compute_dtypes.get(device_type(device))


def _cast(name: str, description: str, dtype: str, bits: int, aliases: tuple[str, ...]) -> SchemeInfo:
    return SchemeInfo(name, description, {"cpu": "torch", "cuda": "torch"}, aliases=aliases, bits=bits,
                      compute_dtypes={"cpu": dtype, "cuda": dtype}, cast_dtype=dtype)


_BF16 = {"cpu": "bfloat16", "cuda": "bfloat16"}

SCHEMES: dict[str, SchemeInfo] = {
    s.name: s
    for s in [
        _cast("fp32", "unquantized float32 copy (the copy shares every tensor with the source if it is fp32)",
              "float32", 32, ("none", "float32")),
        _cast("bf16", "bfloat16 weights and activations", "bfloat16", 16, ("bfloat16",)),
        _cast("fp16", "float16 weights and activations (on CPU fp16 matmuls are slow: prefer bf16)",
              "float16", 16, ("float16",)),
        SchemeInfo(
            "int8",
            "the best int8 for the device. CPU: per-channel int8 weights with bf16 activations on "
            "torch's built-in aten._weight_int8pack_mm (same as int8-weight-only: it agreed 0.98 "
            "with fp32 where dynamic int8 agreed 0.84, at ~15% more time per token). "
            "CUDA: bitsandbytes LLM.int8 (Linear8bitLt, outlier threshold 6.0)",
            {"cpu": "torch", "cuda": "bitsandbytes"},
            bits=8, overhead_bytes=2.0,  # a bf16 scale per output channel
            compute_dtypes={"cpu": "bfloat16", "cuda": "float16"},
        ),
        SchemeInfo(
            "int8-dynamic",
            "dynamic int8 activations x per-channel int8 weights. CPU: torch.ao quantize_dynamic "
            "Linear (per-tensor activation scale, full 8-bit range); CUDA: torchao "
            "Int8DynamicActivationInt8WeightConfig (per-token scales)",
            {"cpu": "torch.ao", "cuda": "torchao"},
            bits=8, overhead_bytes=8.0,  # fbgemm: an fp32 scale and an int32 zero point per output channel
            compute_dtypes={"cpu": "float32", "cuda": "bfloat16"},
        ),
        SchemeInfo(
            "int8-weight-only",
            "per-channel int8 weights, activations in the compute dtype (bf16 on CPU). CPU: torch's "
            "built-in aten._weight_int8pack_mm kernel; CUDA: torchao Int8WeightOnlyConfig",
            {"cpu": "torch", "cuda": "torchao"},
            bits=8, overhead_bytes=2.0, compute_dtypes=_BF16,
        ),
        SchemeInfo(
            "int4",
            "grouped asymmetric int4 weights, bf16 activations. CPU: torch's built-in "
            "aten._weight_int4pack_mm_for_cpu; CUDA: torch's built-in tinygemm "
            "aten._weight_int4pack_mm",
            {"cpu": "torch", "cuda": "torch"},
            default_group_size=32,
            bits=4, overhead_bytes=4.0,  # a bf16 scale and a bf16 zero per group
            compute_dtypes=_BF16,
        ),
        SchemeInfo(
            "nf4",
            "bitsandbytes 4-bit NormalFloat weights (block 64), bf16 compute",
            {"cpu": "bitsandbytes", "cuda": "bitsandbytes"},
            notes="needs the bitsandbytes package; its CPU backend works but is not fast",
            bits=4, overhead_bytes=4.0, block_size=64,  # an fp32 absmax per block
            compute_dtypes=_BF16,
        ),
        SchemeInfo(
            "fp4",
            "bitsandbytes 4-bit float weights (block 64), bf16 compute",
            {"cpu": "bitsandbytes", "cuda": "bitsandbytes"},
            notes="needs the bitsandbytes package; its CPU backend works but is not fast",
            bits=4, overhead_bytes=4.0, block_size=64,
            compute_dtypes=_BF16,
        ),
    ]
}

_ALIASES: dict[str, str] = {a: s.name for s in SCHEMES.values() for a in s.aliases}

_SCHEME_RE = re.compile(r"^(?P<base>[a-z0-9\-]+)(?::g(?P<group>\d+))?(?P<head>\+head(?:8|16)?)?$", re.ASCII)  # ASCII digits only
#: ``+head`` suffix -> how the LM head is treated (None: like the body)
HEAD_MODES = {"+head": "keep", "+head8": "int8", "+head16": "bf16"}


@dataclass(frozen=True)
class ParsedScheme:
    """A scheme string split into its parts (see the module docstring for the grammar)."""

    base: str
    group_size: int | None = None
    #: None: the head is quantized like the body; "keep": source precision; "int8"; "bf16"
    head: str | None = None
    text: str = field(default="", compare=False)

    @property
    def keep_head(self) -> bool:
        return self.head == "keep"

    @property
    def info(self) -> SchemeInfo:
        return SCHEMES[self.base]

    def canonical(self) -> str:
        s = self.base
        if self.group_size is not None:
            s += f":g{self.group_size}"
        if self.head is not None:
            s += {v: k for k, v in HEAD_MODES.items()}[self.head]
        return s


_DEVICE_RE = re.compile(r"^(cpu|cuda|mps|xpu|meta)(?::\d+)?$", re.ASCII)


def device_type(device: str | torch.device | None) -> str:
    """``"cuda:1"`` -> ``"cuda"``; ``None`` -> ``"cpu"``."""
    if device is None:
        return "cpu"
    if isinstance(device, str):
        m = _DEVICE_RE.match(device)
        if m:  # the common spellings need no torch: the planner calls this without it
            return m.group(1)
    import torch  # anything else: torch validates it (and raises for a bad name)

    return torch.device(device).type


def scheme_names() -> list[str]:
    """All registered base names and aliases, sorted."""
    return sorted(set(SCHEMES) | set(_ALIASES))


def parse_scheme(scheme: str) -> ParsedScheme:
    """Parse ``BASE[:gN][+head|+head8|+head16]``; raise :class:`UnknownSchemeError` listing valid names."""
    text = scheme.strip().lower()
    m = _SCHEME_RE.match(text)
    base = _ALIASES.get(m.group("base"), m.group("base")) if m else None
    if base not in SCHEMES:
        raise UnknownSchemeError(
            f"unknown quantization scheme {scheme!r}. Valid schemes: {', '.join(scheme_names())} "
            "(grouped schemes take ':gN', e.g. 'int4:g128'; append '+head' to keep the LM head "
            "unquantized, '+head8' for an int8 head, '+head16' for a bf16 head, e.g. 'int4+head8')"
        )
    info = SCHEMES[base]
    group = m.group("group")
    if group is not None and info.default_group_size is None:
        raise UnknownSchemeError(f"scheme {base!r} takes no group size (got {scheme!r})")
    group_size = int(group) if group is not None else info.default_group_size
    if group_size is not None and (group_size < 1 or group_size & (group_size - 1)):
        raise UnknownSchemeError(f"group size must be a power of two, got {group_size} in {scheme!r}")
    head = HEAD_MODES[m.group("head")] if m.group("head") else None
    return ParsedScheme(base, group_size, head, text=scheme)
