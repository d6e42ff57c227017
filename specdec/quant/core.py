"""``quantize``: a quantized copy of an HF causal LM that shares what it can with the source."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ._copy import cast_output_hook, convert_tensors, shared_copy
from .backends import BACKENDS, Target
from .schemes import SCHEMES, OffloadedModelError, ParsedScheme, UnsupportedSchemeError, device_type, parse_scheme

#: plain dtype schemes (from the scheme table): no backend module, just a cast of every floating parameter
_DTYPE_SCHEMES = {name: getattr(torch, info.cast_dtype) for name, info in SCHEMES.items() if info.cast_dtype}


@dataclass(frozen=True)
class QuantInfo:
    """What :func:`quantize` did; stored on the copy as ``copy.specdec_quant``."""

    scheme: str  # canonical scheme string, e.g. "int4:g32"
    backend: str
    device: str
    compute_dtype: torch.dtype
    quantized_linears: int


def _resolve_device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    if device is None:
        p = next(iter(model.parameters()), None)
        return p.device if p is not None else torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _unavailable(parsed: ParsedScheme, dtype_name: str) -> str | None:
    """Why ``parsed`` cannot run on device type ``dtype_name`` (None when it can)."""
    if dtype_name == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available"  # before any package check: no CUDA scheme can run then
    if parsed.base in _DTYPE_SCHEMES:
        return None
    entry = BACKENDS.get((parsed.base, dtype_name))
    if entry is None:
        return f"no backend for {parsed.base!r} on {dtype_name!r}"
    return entry[1](dtype_name)


def available_schemes(device: str | torch.device = "cpu") -> list[str]:
    """Base names of the schemes that work on ``device`` with the packages installed now."""
    dt = device_type(device)
    return [name for name in SCHEMES if _unavailable(parse_scheme(name), dt) is None]


def scheme_backend(scheme: str, device: str | torch.device = "cpu") -> str:
    """The backend that serves ``scheme`` on ``device`` (raises like :func:`quantize`)."""
    parsed = parse_scheme(scheme)
    dt = device_type(device)
    why = _unavailable(parsed, dt)
    if why is not None:
        raise UnsupportedSchemeError(parsed.canonical(), str(device), why, available_schemes(dt))
    if parsed.base in _DTYPE_SCHEMES:
        return "torch"
    return BACKENDS[(parsed.base, dt)][0]


def _find_targets(copy: nn.Module) -> tuple[list[Target], nn.Module | None]:
    head = copy.get_output_embeddings() if hasattr(copy, "get_output_embeddings") else None
    targets: list[Target] = []
    for parent in copy.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear:
                targets.append((parent, name, child))
    return targets, head


def _cast_inputs_hook(dtype: torch.dtype):
    def hook(_module: nn.Module, args):
        return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    return hook


def quantize(
    model: nn.Module,
    scheme: str,
    *,
    device: str | torch.device | None = None,
) -> nn.Module:
    """Return a quantized copy of the HF causal LM ``model``; ``model`` is left untouched.

    The copy is a module of the same class with the same forward signature (``input_ids``,
    ``position_ids``, ``attention_mask``, the cache (``cache``; ``past_key_values`` in older
    transformers), ``use_cache`` ...; returns an output
    with ``.logits``), in eval mode. Its ``nn.Linear`` layers are replaced by the scheme's
    quantized linears; everything the scheme does not change is *shared* with ``model`` rather
    than copied, in particular the input embedding table (its lookups are cast to the copy's
    compute dtype). ``model_bytes(copy, exclude=model)`` tells what the copy adds.

    Args:
        model: an HF ``PreTrainedModel`` (or any module whose Linears should be quantized).
        scheme: ``BASE[:gN][+head|+head8|+head16]``, e.g. ``"int8"``, ``"bf16"``, ``"int4:g128"``,
            ``"int8+head"`` (keep ``lm_head`` unquantized), ``"int4+head8"`` (int8 head).
            See :data:`specdec.quant.SCHEMES` and :mod:`specdec.quant.schemes`.
        device: where the copy runs; default: the device of ``model``'s parameters.

    Raises:
        UnknownSchemeError: the scheme name is not registered (the message lists valid ones).
        UnsupportedSchemeError: no working backend for this scheme on this device (the message
            names the alternatives that work there).
        OffloadedModelError: ``model``'s weights are offloaded by accelerate (on the meta device).

    Logits come out in the head's dtype: bf16 for ``bf16``, ``int8``, ``int8-weight-only``,
    ``int4`` and the bitsandbytes 4-bit schemes on CPU; float32 for ``fp32``, ``int8-dynamic``
    and ``+head`` on an fp32 model. Compare them with ``.float()``.
    """
    parsed = parse_scheme(scheme)
    offloaded = sum(p.device.type == "meta" for p in model.parameters())
    if offloaded:
        raise OffloadedModelError(
            f"cannot make a {parsed.canonical()!r} copy of a model whose weights accelerate offloaded ({offloaded} of "
            f"{sum(1 for _ in model.parameters())} parameters on the meta device, from a device_map with CPU or disk "
            "offload): load it without offload, or draft with prompt-lookup, suffix or a separate draft model")
    dev = _resolve_device(model, device)
    dt = dev.type
    why = _unavailable(parsed, dt)
    if why is not None:
        raise UnsupportedSchemeError(parsed.canonical(), str(dev), why, available_schemes(dt))

    copy = shared_copy(model)
    copy.eval()
    targets, head = _find_targets(copy)
    embed = copy.get_input_embeddings() if hasattr(copy, "get_input_embeddings") else None
    src_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    head_targets = [t for t in targets if head is not None and t[2] is head]
    body_targets = [t for t in targets if not (head is not None and t[2] is head)]
    if parsed.head is None:
        body_targets += head_targets
    if parsed.head is not None and not head_targets:
        raise UnsupportedSchemeError(parsed.canonical(), str(dev), "the model has no nn.Linear output head",
                                     available_schemes(dt))

    quantized: list[nn.Module] = []
    with torch.no_grad():
        if parsed.base in _DTYPE_SCHEMES:
            backend, compute_dtype = "torch", _DTYPE_SCHEMES[parsed.base]
        else:
            backend, _probe, apply, compute_dtype = BACKENDS[(parsed.base, dt)]
            apply(copy, body_targets, parsed, str(dev))
            # torchao keeps nn.Linear and swaps its weight for a quantized tensor subclass: every
            # target counts as quantized, and none of them goes through the dtype cast below
            quantized += [getattr(parent, name) for parent, name, _ in body_targets]
        if parsed.head == "int8":
            h_backend, h_probe, h_apply, _ = BACKENDS[("int8-weight-only", dt)]
            why = h_probe(dt)
            if why is not None:
                raise UnsupportedSchemeError(parsed.canonical(), str(dev), f"int8 head: {why}", available_schemes(dt))
            h_apply(copy, head_targets, parse_scheme("int8-weight-only"), str(dev))
            quantized += [getattr(parent, name) for parent, name, _ in head_targets]
            if h_backend != backend:
                backend = f"{backend}+{h_backend}"

        # Everything not quantized runs in the compute dtype, except the input embedding (shared
        # with the source; lookups are cast) and a head kept at source precision or in bf16.
        special_head = head if parsed.head in ("keep", "bf16") else None
        skip = tuple(quantized) + tuple(m for m in (embed, special_head) if m is not None)
        convert_tensors(copy, dtype=compute_dtype, device=dev, skip=skip)
        moved: dict[int, torch.Tensor] = {}  # one cache: a tied embedding and kept head stay tied
        if embed is not None:
            convert_tensors(embed, device=dev, cache=moved)
            if compute_dtype != src_dtype:
                embed.register_forward_hook(cast_output_hook(compute_dtype))
        if special_head is not None:
            head_dtype = src_dtype if parsed.head == "keep" else torch.bfloat16
            convert_tensors(special_head, dtype=head_dtype, device=dev,
                            cache=moved if head_dtype == src_dtype else None)
            if head_dtype != compute_dtype:
                special_head.register_forward_pre_hook(_cast_inputs_hook(head_dtype))

    if getattr(copy, "config", None) is not None:
        copy.config.dtype = compute_dtype  # what HF reads for masks and cache dtypes
    copy.specdec_quant = QuantInfo(
        scheme=parsed.canonical(),
        backend=backend,
        device=str(dev),
        compute_dtype=compute_dtype,
        quantized_linears=len(quantized),
    )
    return copy
