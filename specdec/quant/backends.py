"""Backends: each turns the target ``nn.Linear`` modules of a shared copy into quantized ones.

Every backend is a function ``(copy, targets, parsed, device) -> None`` that replaces modules in
place *in the copy* (the source model's modules and tensors are never written), plus an
``available(device) -> str | None`` probe that returns why it cannot run (None when it can).

* torch (built in): dtype casts, and the aten int8 / int4 weight-only CPU and CUDA kernels
  (``_weight_int8pack_mm``, ``_weight_int4pack_mm_for_cpu``, ``_weight_int4pack_mm``), the same
  kernels torchao and gpt-fast dispatch to, called directly so eager mode is fast.
* torch.ao: ``quantize_dynamic``'s dynamic int8 Linear (fbgemm/x86 on CPU), for ``int8-dynamic``.
  Deprecated upstream in favour of torchao but still working in torch 2.13; on CPU it is the
  cheapest int8 per token, though it agrees less than int8 weight-only (docs/quantization.md).
* torchao: ``quantize_`` with its int8 configs, used on CUDA.
* bitsandbytes: LLM.int8 and 4-bit (nf4/fp4) linears.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import warnings
from typing import Callable

import torch
from torch import nn

from .schemes import SCHEMES, ParsedScheme

Target = tuple[nn.Module, str, nn.Linear]  # (parent, attribute name, linear)


@contextlib.contextmanager
def _quiet():
    # torch.ao and quantized-tensor creation warn on every call that they are deprecated; the
    # warning is documented once in docs/quantization.md instead of being printed per layer.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_.*deprecated.*")
        warnings.filterwarnings("ignore", message=".*deprecated.*", category=UserWarning)
        yield


# --------------------------------------------------------------------------------------------
# torch.ao dynamic int8 (CPU)
# --------------------------------------------------------------------------------------------


def torch_ao_available(device: str) -> str | None:
    if device != "cpu":
        return "torch.ao dynamic quantized Linear runs on CPU only"
    try:
        with _quiet():
            import torch.ao.nn.quantized.dynamic  # noqa: F401
            from torch.ao.quantization import QConfig  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the torch build
        return f"torch.ao.quantization is not importable ({e})"
    if not ({"x86", "fbgemm", "qnnpack", "onednn"} & set(torch.backends.quantized.supported_engines)):
        return "this torch build has no quantized CPU engine"  # pragma: no cover
    return _dynamic_engine()[1]


@contextlib.contextmanager
def _engine(name: str):
    """torch's quantized engine set to ``name`` while packing weights (the packed weights keep their engine's
    kernel), and the user's setting restored after."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


@functools.lru_cache(maxsize=None)
def engine_saturates(engine: str) -> bool:
    """Whether ``engine``'s dynamic int8 Linear is wrong at the full 8-bit activation range.

    fbgemm and oneDNN on a CPU without VNNI (AVX2 only) add pairs of u8 x s8 products in int16
    (``vpmaddubsw``), which saturates at 32767 where two products reach 2 x 255 x 127: on SmolLM2 that
    took top-1 agreement from 0.85 to 0.0. The probe is one layer in which every pair saturates there:
    weights at +127 and activations at 255, the output compared with the float product."""
    k = 64
    with _quiet(), _engine(engine):
        layer = _full_range_dynamic_linear_class().from_float(_stub(torch.ones(2, k, device="cpu"), None))
        x = torch.ones(1, k, device="cpu")
        x[0, 0] = 0.0  # the activations' minimum at 0 puts the zero point at 0 and 1.0 at code 255
        y = layer(x)
    return bool(((y - (k - 1)).abs() > 0.05 * (k - 1)).any())


@functools.lru_cache(maxsize=None)
def _dynamic_engine() -> tuple[str | None, str | None]:
    """``(engine, None)`` for the quantized engine ``int8-dynamic`` packs with, or ``(None, why)``: torch's
    current engine where its full-range kernel is exact, else QNNPACK (16-bit products, no saturation)."""
    current = torch.backends.quantized.engine
    if not engine_saturates(current):
        return current, None
    if "qnnpack" in torch.backends.quantized.supported_engines and not engine_saturates("qnnpack"):
        return "qnnpack", None
    return None, (f"torch's dynamic int8 kernel ({current}) saturates 8-bit activations on this CPU (no VNNI) and "
                  "no exact engine is available; use int8")


def int8_dynamic_packing() -> str | None:
    """The quantized engine ``int8-dynamic`` copies are packed for on this CPU (``"qnnpack"`` where torch's current
    engine saturates 8-bit activations: AVX2 without VNNI), or ``None`` where no exact engine exists. QNNPACK keeps
    a float32 bias of every output row inside its packed weights; the planner counts it
    (:func:`specdec.sizing.copy_weight_bytes`, ``int8_packing``)."""
    return _dynamic_engine()[0]


def _dynamic_qconfig():
    from torch.ao import quantization as q

    # Per-channel symmetric int8 weights, and the *full* 8-bit activation range: the default
    # qconfig uses reduce_range=True (7-bit activations, for old AVX2 overflow), which cost ~13
    # points of top-1 agreement on SmolLM2. VNNI/AMX CPUs do not need it.
    act = q.PlaceholderObserver.with_args(
        dtype=torch.quint8, quant_min=0, quant_max=255, is_dynamic=True
    )
    return q.QConfig(activation=act, weight=q.default_per_channel_weight_observer)


@functools.lru_cache(maxsize=None)
def _full_range_dynamic_linear_class():
    from torch.ao.nn.quantized.dynamic import Linear as DynLinear

    class FullRangeDynamicLinear(DynLinear):
        """torch.ao's dynamic int8 Linear, quantizing activations over the full 8-bit range.

        The stock forward hard-codes ``reduce_range=True`` (7-bit activations, a guard against
        int16 saturation on pre-VNNI AVX2); with it SmolLM2's top-1 agreement drops from 0.84 to
        0.72. Where the full range saturates, :func:`engine_saturates` finds it and the weights are
        packed for QNNPACK instead.
        """

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, reduce_range=False)
            return y.to(x.dtype)

        def _get_name(self) -> str:
            return "FullRangeDynamicQuantizedLinear"

    return FullRangeDynamicLinear


def _stub(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A float Linear holding ``weight`` and ``bias`` with the full-range qconfig, for ``from_float``."""
    stub = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    stub.weight = nn.Parameter(weight.detach().float(), requires_grad=False)
    if bias is not None:
        stub.bias = nn.Parameter(bias.detach().float(), requires_grad=False)
    stub.qconfig = _dynamic_qconfig()
    return stub


def torch_ao_dynamic_int8(copy: nn.Module, targets: list[Target], parsed: ParsedScheme, device: str) -> None:
    engine, why = _dynamic_engine()
    if engine is None:  # pragma: no cover - the probe refuses first; kept for direct callers
        raise RuntimeError(why)
    if engine != torch.backends.quantized.engine:
        warnings.warn(f"int8-dynamic: torch's {torch.backends.quantized.engine} int8 kernel saturates 8-bit activations "
                      f"on this CPU (no VNNI), so the weights are packed for {engine}: exact, but about twice int8's "
                      "time per token where measured (docs/quantization.md); prefer int8", stacklevel=3)
    with _quiet(), _engine(engine):
        cls = _full_range_dynamic_linear_class()
        for parent, name, lin in targets:
            # from_float reads .qconfig and the float weight: a stand-in keeps the copy's Linear (whose
            # weight tensor is shared with the source model) free of new attributes.
            setattr(parent, name, cls.from_float(_stub(lin.weight, lin.bias)))


# --------------------------------------------------------------------------------------------
# aten weight-only kernels (CPU and CUDA)
# --------------------------------------------------------------------------------------------


def int8_per_channel_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: ``w ~ q * scale[:, None]``.

    Returns the int8 codes [N, K] and the float32 scales [N]. Shared by the int8 weight-only
    Linear and :func:`specdec.quant.dequantize_weight`, so the reported weight error is the
    error of the weights the kernel multiplies by.
    """
    w = w.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scale


class Int8WeightOnlyLinear(nn.Module):
    """y = x @ (int8 W).T * scale[n] (+ b), via ``aten._weight_int8pack_mm``.

    Weights are symmetric per output channel. Activations run in ``compute_dtype``.
    """

    def __init__(self, lin: nn.Linear, compute_dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.compute_dtype = compute_dtype
        q, scale = int8_per_channel_quantize(lin.weight.detach().to(device))
        self.register_buffer("weight_int8", q.contiguous())
        self.register_buffer("scales", scale.to(compute_dtype))
        self.register_buffer(
            "bias", None if lin.bias is None else lin.bias.detach().to(device=device, dtype=compute_dtype)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        # contiguous: the kernels refuse a strided view (a ragged batch's rows; every input on torch < 2.7); a no-op
        # for the contiguous inputs of a plain pass
        x2 = x.reshape(-1, shape[-1]).to(self.compute_dtype).contiguous()
        y = torch.ops.aten._weight_int8pack_mm(x2, self.weight_int8, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 per-channel, {self.compute_dtype}"


def int8_weight_only_available(device: str) -> str | None:
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return "this torch build has no aten._weight_int8pack_mm"  # pragma: no cover
    return None


def torch_int8_weight_only(copy: nn.Module, targets: list[Target], parsed: ParsedScheme, device: str) -> None:
    dev = torch.device(device)
    for parent, name, lin in targets:
        setattr(parent, name, Int8WeightOnlyLinear(lin, torch.bfloat16, dev))


def _int4_group_quantize(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric min/max uint4 per group, in tinygemm's form: w ~ (q - 8) * scale + zero.

    Returns the int32 codes [N, K] and scales_and_zeros [K // group, N, 2] (float32).
    """
    n, k = w.shape
    g = w.float().reshape(n, k // group_size, group_size)
    wmax, wmin = g.amax(dim=-1, keepdim=True), g.amin(dim=-1, keepdim=True)
    scale = (wmax - wmin).clamp(min=1e-6) / 15.0
    q = torch.round((g - wmin) / scale).clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = wmin + scale * 8.0  # tinygemm stores the float value of code 8
    sz = torch.cat([scale, zero], dim=-1).reshape(n, k // group_size, 2).transpose(0, 1).contiguous()
    return q, sz


class Int4WeightOnlyLinear(nn.Module):
    """Grouped int4 weight-only Linear on torch's built-in packed int4 kernels (bf16 activations).

    CPU: ``aten._weight_int4pack_mm_for_cpu``; CUDA: ``aten._weight_int4pack_mm`` (tinygemm).
    """

    def __init__(self, lin: nn.Linear, group_size: int, device: torch.device) -> None:
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.group_size = group_size
        self.on_cpu = device.type == "cpu"
        q, sz = _int4_group_quantize(lin.weight.detach().to(device), group_size)
        if self.on_cpu:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        else:
            # the CUDA kernel wants the codes as uint8 pairs; inner_k_tiles 8 (gpt-fast's choice)
            # needs K % 128 == 0, so narrower layers (576 in SmolLM2) take 4 or 2
            q_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
            tiles = next(t for t in (8, 4, 2) if self.in_features % (t * 16) == 0)
            packed = torch.ops.aten._convert_weight_to_int4pack(q_u8, tiles)
        self.register_buffer("weight_int4", packed)
        self.register_buffer("scales_and_zeros", sz.to(torch.bfloat16))
        self.register_buffer(
            "bias", None if lin.bias is None else lin.bias.detach().to(device=device, dtype=torch.bfloat16)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16).contiguous()  # as in the int8 forward
        if self.on_cpu:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2, self.weight_int4, self.group_size, self.scales_and_zeros
            )
        else:
            y = torch.ops.aten._weight_int4pack_mm(x2, self.weight_int4, self.group_size, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4 group={self.group_size}, bf16"


def int4_available(device: str) -> str | None:
    if device == "cpu":
        if not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"):
            return "this torch build has no aten._weight_int4pack_mm_for_cpu"  # pragma: no cover
        return None
    if device == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available"
        if torch.cuda.get_device_capability() < (8, 0):
            return "the tinygemm int4 kernel needs compute capability >= 8.0 (Ampere or newer)"
        return None
    return f"no int4 kernel for device type {device!r}"


def torch_int4(copy: nn.Module, targets: list[Target], parsed: ParsedScheme, device: str) -> None:
    dev = torch.device(device)
    for parent, name, lin in targets:
        setattr(parent, name, Int4WeightOnlyLinear(lin, int4_group_for(lin.in_features, parsed.group_size), dev))


def int4_group_for(in_features: int, group_size: int) -> int:
    """The group size actually used for a layer: ``group_size``, or when the layer's width is not
    a multiple of it, the largest power of two below it that divides the width (SmolLM2's 576-wide
    projections take g64 under ``int4:g128``). Leaving such layers unquantized instead (what
    torchao does) made ``int4:g128`` slower than bf16."""
    g = group_size
    while g > 16 and in_features % g:
        g //= 2
    if in_features % g:
        raise ValueError(f"int4: in_features {in_features} is not a multiple of 16")
    return g


# --------------------------------------------------------------------------------------------
# torchao (CUDA)
# --------------------------------------------------------------------------------------------


def torchao_available(device: str) -> str | None:
    if importlib.util.find_spec("torchao") is None:
        return "the torchao package is not installed (pip install torchao)"
    if device == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available"
    return None


def _torchao_apply(config_name: str) -> Callable:
    def apply(copy: nn.Module, targets: list[Target], parsed: ParsedScheme, device: str) -> None:
        import torchao.quantization as tq

        config = getattr(tq, config_name)()
        dev = torch.device(device)
        for _, _, lin in targets:  # torchao quantizes bf16 weights already on the device
            lin.weight = nn.Parameter(lin.weight.detach().to(dev, torch.bfloat16), requires_grad=False)
            if lin.bias is not None:
                lin.bias = nn.Parameter(lin.bias.detach().to(dev, torch.bfloat16), requires_grad=False)
        ids = {id(lin) for _, _, lin in targets}
        tq.quantize_(copy, config, filter_fn=lambda m, _fqn: id(m) in ids)

    return apply


# --------------------------------------------------------------------------------------------
# bitsandbytes
# --------------------------------------------------------------------------------------------


def bnb_available(device: str) -> str | None:
    if importlib.util.find_spec("bitsandbytes") is None:
        return "the bitsandbytes package is not installed (pip install bitsandbytes)"
    if device == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available"
    if device not in ("cpu", "cuda"):
        return f"bitsandbytes has no backend wired here for {device!r}"
    return None


def bnb_int8_available(device: str) -> str | None:
    if device != "cuda":
        return "bitsandbytes LLM.int8 is only offered on CUDA (its CPU path measured slower than fp32)"
    return bnb_available(device)


def _import_bnb():
    with _quiet():  # bitsandbytes' import trips torch.jit.script_method deprecation warnings
        import bitsandbytes as bnb
    return bnb


def bnb_int8(copy: nn.Module, targets: list[Target], parsed: ParsedScheme, device: str) -> None:
    bnb = _import_bnb()

    for parent, name, lin in targets:
        new = bnb.nn.Linear8bitLt(
            lin.in_features, lin.out_features, bias=lin.bias is not None,
            has_fp16_weights=False, threshold=6.0, device="meta",
        )
        new.weight = bnb.nn.Int8Params(
            lin.weight.detach().to(torch.float16).cpu(), requires_grad=False, has_fp16_weights=False
        )
        if lin.bias is not None:
            new.bias = nn.Parameter(lin.bias.detach().to(torch.float16).cpu(), requires_grad=False)
        setattr(parent, name, new.to(device))  # the move to the device quantizes the weight


def _bnb_4bit(quant_type: str) -> Callable:
    def apply(copy: nn.Module, targets: list[Target], parsed: ParsedScheme, device: str) -> None:
        bnb = _import_bnb()

        for parent, name, lin in targets:
            new = bnb.nn.Linear4bit(
                lin.in_features, lin.out_features, bias=lin.bias is not None,
                compute_dtype=torch.bfloat16, quant_type=quant_type, device="meta",
            )
            new.weight = bnb.nn.Params4bit(
                lin.weight.detach().to(torch.bfloat16).cpu(), requires_grad=False, quant_type=quant_type
            )
            if lin.bias is not None:
                new.bias = nn.Parameter(lin.bias.detach().to(torch.bfloat16).cpu(), requires_grad=False)
            setattr(parent, name, new.to(device))  # Params4bit quantizes on the move to a device

    return apply


# --------------------------------------------------------------------------------------------
# the table: (scheme, device type) -> (backend name, probe, apply, compute dtype of the rest)
# --------------------------------------------------------------------------------------------

Backend = tuple[str, Callable[[str], "str | None"], Callable, torch.dtype]

#: (scheme, device type) -> (probe, apply). The backend's name and the compute dtype come from
#: :data:`specdec.quant.schemes.SCHEMES`, the one table the planner reads too.
_IMPLEMENTATIONS: dict[tuple[str, str], tuple[Callable[[str], "str | None"], Callable]] = {
    ("int8", "cpu"): (int8_weight_only_available, torch_int8_weight_only),
    ("int8", "cuda"): (bnb_int8_available, bnb_int8),
    ("int8-dynamic", "cpu"): (torch_ao_available, torch_ao_dynamic_int8),
    ("int8-dynamic", "cuda"): (torchao_available, _torchao_apply("Int8DynamicActivationInt8WeightConfig")),
    ("int8-weight-only", "cpu"): (int8_weight_only_available, torch_int8_weight_only),
    ("int8-weight-only", "cuda"): (torchao_available, _torchao_apply("Int8WeightOnlyConfig")),
    ("int4", "cpu"): (int4_available, torch_int4),
    ("int4", "cuda"): (int4_available, torch_int4),
    ("nf4", "cpu"): (bnb_available, _bnb_4bit("nf4")),
    ("nf4", "cuda"): (bnb_available, _bnb_4bit("nf4")),
    ("fp4", "cpu"): (bnb_available, _bnb_4bit("fp4")),
    ("fp4", "cuda"): (bnb_available, _bnb_4bit("fp4")),
}


def _entry(scheme: str, device: str, probe: Callable[[str], "str | None"], apply: Callable) -> Backend:
    info = SCHEMES[scheme]
    return info.backends[device], probe, apply, getattr(torch, info.compute_dtypes[device])


BACKENDS: dict[tuple[str, str], Backend] = {
    key: _entry(*key, probe, apply) for key, (probe, apply) in _IMPLEMENTATIONS.items()
}
