"""Scheme names, their parsing, and the registry of which backend serves which device.

A scheme string is ``BASE[:gN][+head|+head8|+head16]``:

* ``BASE`` is a registered name (``int8``, ``int4``, ``nf4``, ...; see :data:`SCHEMES`);
* ``:gN`` sets the group size of grouped schemes (``int4:g32``, ``int4:g128``);
* ``+head`` keeps the LM head (``lm_head``) in the model's own precision instead of quantizing it.
  For a verifier with tied embeddings this costs no extra memory (the head is the embedding table
  that the copy shares anyway) but it costs time per token, since the head is a large matmul.
* ``+head8`` quantizes the head with per-channel int8 weights (``int8-weight-only``) whatever the
  body's scheme; ``+head16`` keeps it in bf16. On SmolLM2, int4 loses most of its agreement in
  the head: ``int4+head8`` agrees 0.99 where ``int4`` agrees 0.88, for ~15% more time per token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch


class UnknownSchemeError(ValueError):
    """Raised for a scheme name that is not registered; the message lists the valid ones."""


class UnsupportedSchemeError(ValueError):
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
    """One registered scheme: its name, what it does, and its backend per device type."""

    name: str
    description: str
    #: device type ("cpu", "cuda") -> human-readable backend name
    backends: dict[str, str]
    #: default group size for grouped schemes, None otherwise
    default_group_size: int | None = None
    aliases: tuple[str, ...] = ()
    notes: str = ""

    def backend(self, device: str) -> str | None:
        return self.backends.get(device_type(device))


SCHEMES: dict[str, SchemeInfo] = {
    s.name: s
    for s in [
        SchemeInfo(
            "fp32",
            "unquantized float32 copy (the copy shares every tensor with the source if it is fp32)",
            {"cpu": "torch", "cuda": "torch"},
            aliases=("none", "float32"),
        ),
        SchemeInfo(
            "bf16",
            "bfloat16 weights and activations",
            {"cpu": "torch", "cuda": "torch"},
            aliases=("bfloat16",),
        ),
        SchemeInfo(
            "fp16",
            "float16 weights and activations (on CPU fp16 matmuls are slow: prefer bf16)",
            {"cpu": "torch", "cuda": "torch"},
            aliases=("float16",),
        ),
        SchemeInfo(
            "int8",
            "the best int8 for the device. CPU: per-channel int8 weights with bf16 activations on "
            "torch's built-in aten._weight_int8pack_mm (same as int8-weight-only: it agreed 0.98 "
            "with fp32 where dynamic int8 agreed 0.84, at ~15% more time per token). "
            "CUDA: bitsandbytes LLM.int8 (Linear8bitLt, outlier threshold 6.0)",
            {"cpu": "torch", "cuda": "bitsandbytes"},
        ),
        SchemeInfo(
            "int8-dynamic",
            "dynamic int8 activations x per-channel int8 weights. CPU: torch.ao quantize_dynamic "
            "Linear (per-tensor activation scale, full 8-bit range); CUDA: torchao "
            "Int8DynamicActivationInt8WeightConfig (per-token scales)",
            {"cpu": "torch.ao", "cuda": "torchao"},
        ),
        SchemeInfo(
            "int8-weight-only",
            "per-channel int8 weights, activations in the compute dtype (bf16 on CPU). CPU: torch's "
            "built-in aten._weight_int8pack_mm kernel; CUDA: torchao Int8WeightOnlyConfig",
            {"cpu": "torch", "cuda": "torchao"},
        ),
        SchemeInfo(
            "int4",
            "grouped asymmetric int4 weights, bf16 activations. CPU: torch's built-in "
            "aten._weight_int4pack_mm_for_cpu; CUDA: torch's built-in tinygemm "
            "aten._weight_int4pack_mm",
            {"cpu": "torch", "cuda": "torch"},
            default_group_size=32,
        ),
        SchemeInfo(
            "nf4",
            "bitsandbytes 4-bit NormalFloat weights (block 64), bf16 compute",
            {"cpu": "bitsandbytes", "cuda": "bitsandbytes"},
            notes="needs the bitsandbytes package; its CPU backend works but is not fast",
        ),
        SchemeInfo(
            "fp4",
            "bitsandbytes 4-bit float weights (block 64), bf16 compute",
            {"cpu": "bitsandbytes", "cuda": "bitsandbytes"},
            notes="needs the bitsandbytes package; its CPU backend works but is not fast",
        ),
    ]
}

_ALIASES: dict[str, str] = {a: s.name for s in SCHEMES.values() for a in s.aliases}

_SCHEME_RE = re.compile(r"^(?P<base>[a-z0-9\-]+)(?::g(?P<group>\d+))?(?P<head>\+head(?:8|16)?)?$")
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


def device_type(device: str | torch.device | None) -> str:
    """``"cuda:1"`` -> ``"cuda"``; ``None`` -> ``"cpu"``."""
    if device is None:
        return "cpu"
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
