"""How a quantization scheme stores a linear weight, read from specdec.quant's scheme table.

The planner accepts exactly the schemes :func:`specdec.quant.parse_scheme` accepts, with the same
grammar ``BASE[:gN][+head|+head8|+head16]``, and takes bits, group sizes, overheads and compute
dtypes from :data:`specdec.quant.schemes.SCHEMES`. One difference: ``none`` (and ``None``) means
"no quantization" here (the weights as loaded), where specdec.quant reads ``none`` as an fp32 copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specdec.quant.schemes import SCHEMES, UnknownSchemeError, device_type, parse_scheme
from specdec.sizing.memory import dtype_bytes


@dataclass(frozen=True)
class QuantScheme:
    """How a quantization scheme stores a linear weight.

    ``bits`` per weight plus ``overhead_bytes`` (scales, zero points) per group of ``group_size``
    input weights (``group_size`` None: one group per output channel). ``dtype`` is set for the
    plain float "schemes" (``bf16``...), which convert the whole copy instead. ``quantize_head``:
    whether the LM head is quantized too (specdec's default; ``+head`` keeps it). ``compute_dtype``
    is the dtype the quantized copy computes (and caches KV) in on the device it was parsed for.
    """

    name: str
    bits: float
    group_size: int | None = None
    overhead_bytes: float = 0.0
    quantize_head: bool = True
    dtype: str | None = None
    compute_dtype: str | None = None
    head: "QuantScheme | None" = None  # the LM head's own scheme (``+head8`` / ``+head16``), else as the blocks

    def head_bytes(self, hidden: int, vocab: int) -> int:
        """Bytes of the (quantized) LM head matrix."""
        if self.head is None:
            return self.linear_bytes(hidden, vocab)
        if self.head.dtype is not None:
            return hidden * vocab * dtype_bytes(self.head.dtype)
        return self.head.linear_bytes(hidden, vocab)

    def linear_bytes(self, in_features: int, out_features: int) -> int:
        """Bytes of one ``in_features x out_features`` weight matrix under this scheme."""
        groups = out_features * (1 if self.group_size is None else math.ceil(in_features / self.group_size))
        return math.ceil(in_features * out_features * self.bits / 8 + groups * self.overhead_bytes)


#: ``+head8`` / ``+head16``: the scheme specdec.quant applies to the LM head
_HEAD_SCHEMES = {"int8": "int8-weight-only", "bf16": "bf16"}


def parse_quant(spec: str | QuantScheme | None, device: Any = "cpu") -> QuantScheme | None:
    """A weight quantization scheme, in specdec.quant's grammar ``BASE[:gN][+head|+head8|+head16]``.

    ``None``/``"none"`` mean no quantization. ``fp32``, ``bf16``, ``fp16`` convert the weights to that
    dtype; ``int8``, ``int8-dynamic``, ``int8-weight-only``, ``int4`` (groups of 32 unless ``:gN``,
    e.g. ``int4:g128``), ``nf4``, ``fp4`` quantize the linear layers; see
    :data:`specdec.quant.schemes.SCHEMES`. The LM head is quantized unless ``+head`` is appended,
    as in :func:`specdec.quant.quantize`. ``device`` (``"cpu"``, ``"cuda"``) picks the compute dtype,
    which can differ per device (int8: bf16 on CPU, fp16 on CUDA).

    Raises:
        ValueError: unknown scheme (the message lists the accepted forms), or one with no backend
            on ``device``.
    """
    if spec is None or isinstance(spec, QuantScheme):
        return spec
    if str(spec).strip().lower() == "none":
        return None
    try:
        parsed = parse_scheme(str(spec))
    except UnknownSchemeError as exc:
        raise ValueError(f"unknown weight quantization {spec!r}: {exc}") from None
    head = _scheme(_HEAD_SCHEMES[parsed.head], None, False, None, device) if parsed.head in _HEAD_SCHEMES else None
    return _scheme(parsed.base, parsed.group_size, parsed.keep_head, head, device, name=parsed.canonical())


def _scheme(base: str, group: int | None, keep_head: bool, head: QuantScheme | None, device: Any,
            name: str | None = None) -> QuantScheme:
    info = SCHEMES[base]
    compute = info.compute_dtype(device)
    if compute is None:
        raise ValueError(f"quantization scheme {base!r} has no backend on {device_type(device)!r}; "
                         f"it runs on {', '.join(sorted(info.compute_dtypes))}")
    return QuantScheme(
        name=name or base,
        bits=info.bits,
        group_size=group if group is not None else info.block_size,
        overhead_bytes=info.overhead_bytes,
        quantize_head=not keep_head,
        dtype=info.cast_dtype,
        compute_dtype=compute,
        head=head,
    )
