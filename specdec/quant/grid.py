"""How far a scheme moves a model's weights, and whether they already lie on the scheme's grid.

A quantized self-copy agrees with its verifier as well as its weights stay close to the
verifier's. When the verifier was itself loaded from a quantized checkpoint, a scheme with the
same grid reproduces its weights exactly: the embedded SmolLM2 is a Q4_1 GGUF (4-bit, groups of
32, scale and minimum), so ``int4`` with groups of 32 has a relative weight error of 0.0 on it.
Such a drafter's acceptance measures the verifier against itself (with bf16 activations), not
what a quantized copy of a bf16 checkpoint would do. :func:`weight_error` measures this from the
weights (not from the file name) and sets :attr:`WeightError.grid_bound`.

>>> from specdec.quant import weight_error
>>> e = weight_error(verifier, "int4+head8")
>>> e.weight_error, e.head_weight_error, e.grid_bound
(0.0, 0.0117, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from .backends import _int4_group_quantize, _quiet, bnb_available, int4_group_for, int8_per_channel_quantize
from .schemes import ParsedScheme, UnsupportedSchemeError, parse_scheme

#: a relative weight error at or below this means the weights lie on the scheme's grid: float32
#: round-off is ~1e-7, a bf16 cast of unstructured weights ~1e-3, per-channel int8 ~1e-2
GRID_TOLERANCE = 1e-4

#: the one-line explanation shown next to a grid-bound scheme
GRID_BOUND_NOTE = (
    "the verifier's weights already lie on this scheme's grid: its acceptance says nothing about a bf16 checkpoint"
)


@dataclass(frozen=True)
class WeightError:
    """Relative weight error ``||W_q - W|| / ||W||`` of a scheme against a model's own weights.

    Errors are aggregated over layers (square root of the summed squared differences over the
    summed squared weights), in float64.

    Attributes:
        scheme: the canonical scheme, e.g. ``"int4:g32+head8"``.
        weight_error: over the ``nn.Linear`` layers other than the LM head, with the scheme's
            scales and zero points in exact (float32) arithmetic: 0 when the weights lie on its grid.
        stored_weight_error: the same with scales and zero points rounded to the dtype the CPU
            kernels store them in (bf16 for ``int4`` and ``int8``): the weights the drafter multiplies by.
        head_weight_error: the LM head under the scheme's head treatment (``+head``: 0.0, ``+head8``:
            int8 per channel, ``+head16``: bf16, none: like the body), exact arithmetic like
            ``weight_error``; None when the model has no ``nn.Linear`` output head.
        layers: number of ``nn.Linear`` layers in ``weight_error``.
        grid_bound: ``weight_error <= tolerance`` for a scheme that quantizes (not ``fp32``).
        tolerance: the threshold used for ``grid_bound``.
    """

    scheme: str
    weight_error: float
    stored_weight_error: float
    head_weight_error: float | None
    layers: int
    grid_bound: bool
    tolerance: float = GRID_TOLERANCE

    @property
    def note(self) -> str:
        """:data:`GRID_BOUND_NOTE` for a grid-bound scheme, else ``""``."""
        return GRID_BOUND_NOTE if self.grid_bound else ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, plus ``grid_note``."""
        return {**asdict(self), "grid_note": self.note}


def _int4_dequantize(w: torch.Tensor, group_size: int, scale_dtypes: tuple[torch.dtype, ...]) -> list[torch.Tensor]:
    n, k = w.shape
    g = int4_group_for(k, group_size)
    q, sz = _int4_group_quantize(w, g)  # the backend's own quantizer: same codes, same scales
    codes = q.reshape(n, k // g, g).float() - 8.0
    out = []
    for dt in scale_dtypes:
        s = sz.to(dt).float()  # [K // g, N, 2]
        scale, zero = s[..., 0].t().unsqueeze(-1), s[..., 1].t().unsqueeze(-1)
        out.append((codes * scale + zero).reshape(n, k))
    return out


def _int8_dequantize(w: torch.Tensor, scale_dtypes: tuple[torch.dtype, ...]) -> list[torch.Tensor]:
    q, scale = int8_per_channel_quantize(w)
    q = q.float()
    return [q * scale.to(dt).float()[:, None] for dt in scale_dtypes]


def _int8_dynamic_dequantize(w: torch.Tensor) -> torch.Tensor:
    # torch.ao's dynamic Linear quantizes its weight with the qconfig's per-channel observer
    from torch.ao.quantization import default_per_channel_weight_observer

    with _quiet():
        obs = default_per_channel_weight_observer()
        w = w.float().cpu()
        obs(w)
        scale, zero = obs.calculate_qparams()
        return torch.quantize_per_channel(w, scale, zero, 0, torch.qint8).dequantize()


def _bnb_4bit_dequantize(w: torch.Tensor, quant_type: str) -> torch.Tensor:
    from .backends import _import_bnb

    bnb = _import_bnb()
    wb = w.to(torch.bfloat16)
    packed, state = bnb.functional.quantize_4bit(wb, blocksize=64, quant_type=quant_type)
    return bnb.functional.dequantize_4bit(packed, state, blocksize=64, quant_type=quant_type).float()


def _dequantize(w: torch.Tensor, parsed: ParsedScheme, scale_dtypes: tuple[torch.dtype, ...]) -> list[torch.Tensor]:
    """``w`` through the base scheme once per scale dtype (the codes are computed once)."""
    base = parsed.base
    w = w.detach().float()
    if base == "fp32":
        out = w
    elif base in ("bf16", "fp16"):
        out = w.to(torch.bfloat16 if base == "bf16" else torch.float16).float()
    elif base in ("int8", "int8-weight-only"):
        return _int8_dequantize(w, scale_dtypes)
    elif base == "int4":
        return _int4_dequantize(w, parsed.group_size or 32, scale_dtypes)
    elif base == "int8-dynamic":
        out = _int8_dynamic_dequantize(w).to(w.device)
    elif base in ("nf4", "fp4"):
        why = bnb_available("cpu")
        if why is not None:
            raise UnsupportedSchemeError(parsed.canonical(), "cpu", why, [])
        out = _bnb_4bit_dequantize(w.cpu(), base).to(w.device)
    else:  # pragma: no cover - every registered scheme is handled above
        raise UnsupportedSchemeError(parsed.canonical(), "cpu", "no weight model for this scheme", [])
    return [out for _ in scale_dtypes]  # no separate scales: stored == exact


def dequantize_weight(weight: torch.Tensor, scheme: str | ParsedScheme, *, stored: bool = False) -> torch.Tensor:
    """The float32 weight a scheme's base quantizer turns ``weight`` ([out, in]) into.

    Mirrors specdec's CPU backends (the CUDA ones quantize ``int4`` identically and ``int8`` to
    the same per-channel grid). ``stored=True`` rounds the scales and zero points to the dtype
    the kernels keep them in (bf16); ``stored=False`` keeps them in float32, which is what
    tells whether ``weight`` lies on the scheme's grid. The head suffix is ignored here.

    Raises:
        UnknownSchemeError: the scheme is not registered.
        UnsupportedSchemeError: ``nf4``/``fp4`` without bitsandbytes installed.
    """
    parsed = parse_scheme(scheme) if isinstance(scheme, str) else scheme
    return _dequantize(weight, parsed, (torch.bfloat16 if stored else torch.float32,))[0]


def _head_dequantize(w: torch.Tensor, parsed: ParsedScheme) -> torch.Tensor:
    if parsed.head is None:
        return dequantize_weight(w, parsed)
    if parsed.head == "keep":
        return w.float()
    if parsed.head == "int8":
        return _int8_dequantize(w.float(), (torch.float32,))[0]
    return w.to(torch.bfloat16).float()  # "bf16"


def _sq(t: torch.Tensor) -> float:
    return float(torch.sum(torch.square(t), dtype=torch.float64))


@torch.no_grad()
def weight_error(model: nn.Module, scheme: str, *, tolerance: float = GRID_TOLERANCE) -> WeightError:
    """Relative weight error of ``scheme`` against ``model``'s own ``nn.Linear`` weights.

    The layers are those :func:`specdec.quant.quantize` replaces; the LM head is reported
    separately because schemes treat it apart (``+head8``) and checkpoints often store it
    differently from the body. ``model`` is only read. On SmolLM2-135M this takes a second or
    two per scheme on a CPU.

    Raises:
        UnknownSchemeError / UnsupportedSchemeError: as :func:`dequantize_weight`.
        ValueError: ``model`` has no ``nn.Linear`` layers, or ``tolerance`` is negative.
    """
    if tolerance < 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    parsed = parse_scheme(scheme)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = [m for m in model.modules() if type(m) is nn.Linear and m is not head]
    if not body and type(head) is not nn.Linear:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layers to measure")

    def rel(sq_err: float, sq_ref: float) -> float:
        return (sq_err / sq_ref) ** 0.5 if sq_ref > 0 else 0.0

    err = err_stored = ref = 0.0
    for lin in body:
        w = lin.weight.detach().float()
        exact, stored = _dequantize(w, parsed, (torch.float32, torch.bfloat16))
        ref += _sq(w)
        err += _sq(exact - w)
        err_stored += _sq(stored - w)
    head_error = None
    if type(head) is nn.Linear:
        hw = head.weight.detach().float()
        head_error = rel(_sq(_head_dequantize(hw, parsed) - hw), _sq(hw))
    body_error = rel(err, ref)
    return WeightError(
        scheme=parsed.canonical(),
        weight_error=body_error,
        stored_weight_error=rel(err_stored, ref),
        head_weight_error=head_error,
        layers=len(body),
        # an fp32 copy is the verifier itself, not a quantization that happens to fit its grid
        grid_bound=bool(body) and parsed.base != "fp32" and body_error <= tolerance,
        tolerance=tolerance,
    )
