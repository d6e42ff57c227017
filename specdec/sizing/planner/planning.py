"""``plan``: memory for speculative decoding with a verifier (+ drafter), what fits, and what to
change when it does not (the messages of PlanError and ``Plan.advice``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from specdec.sizing.budget import Need, Workload, largest
from specdec.sizing.check import PlanError
from specdec.sizing.configs import Arch, ConfigLike, arch, is_self_draft, resolve
from specdec.sizing.kv import kv_profile
from specdec.sizing.memory import (
    GiB,
    available_memory,
    check_count,
    dtype_name,
    format_bytes,
    parse_memory,
    smaller_dtype,
)
from specdec.sizing.planner.result import Plan
from specdec.sizing.weights import QuantScheme, copy_weight_bytes, param_count, parse_quant, weight_bytes
from specdec.slots import cache_slots

DEFAULT_CONTEXT = 4096
DEFAULT_RUNTIME_RESERVE = GiB


@dataclass(frozen=True)
class _Request:
    """``plan``'s arguments, checked and resolved."""

    verifier: Arch
    drafter: Arch | None
    self_copy: bool
    wq: QuantScheme | None
    dq: QuantScheme | None
    batch: int
    context: int
    prompt_len: int | None
    draft_len: int
    model_max: int | None
    budget: int | None

    def slots(self, batch: int, context: int) -> int:
        """Cache slots per row, as the engine allocates them (:func:`specdec.slots.cache_slots`).

        Without a prompt length the prompt is taken as 1 token: the largest slack a ragged batch
        gets, so that together with the whole-context prefill the plan holds for any prompt length.
        """
        prompt = min(context, self.prompt_len) if self.prompt_len else 1
        return cache_slots(batch, prompt, context, self.draft_len)

    def prefill(self, context: int) -> int:
        """Prompt tokens per row: ``prompt_len``, else the whole context (the activation worst case)."""
        return min(context, self.prompt_len) if self.prompt_len else context

    def need(self, work: Workload, batch: int, context: int) -> Need:
        return work.need(batch, self.slots(batch, context), self.prefill(context))


def plan(
    verifier: ConfigLike,
    drafter: ConfigLike | None = None,
    memory: int | str | None = None,
    context: int | None = None,
    batch: int | None = None,
    dtype: Any = "bfloat16",
    kv_dtype: Any = None,
    weight_quant: str | None = None,
    draft_quant: str | None = None,
    draft_len: int = 8,
    headroom: int | float | str | None = "auto",
    prompt_len: int | None = None,
    device: str = "cpu",
) -> Plan:
    """Plan memory for speculative decoding with ``verifier`` (+ ``drafter``) and say what fits.

    Args:
        verifier, drafter: config objects, dicts, ``config.json`` paths or preset names; a drafter
            of ``"self"`` (or the verifier's own spec) is a copy of the verifier quantized by
            ``draft_quant`` that shares the embedding and unchanged tensors, as
            :func:`specdec.quant.quantize` builds it.
        memory: budget (``"80GiB"``, ``"24GB"``, bytes) or ``"auto"`` for what is free now on
            ``device``; None plans without a budget (no ``max_batch``/``max_context``).
        context: tokens per row, prompt + generated (default: the verifier's maximum, else 4096).
        batch: rows (default 1).
        dtype: weight and compute dtype; ``kv_dtype`` the cache dtype (default ``dtype``), used by
            both caches.
        weight_quant, draft_quant: quantization of the verifier's / drafter's linear layers
            (:func:`parse_quant`, the schemes of :mod:`specdec.quant`), e.g. ``"int8"``,
            ``"int4:g32"``, ``"nf4"``.
        draft_len: drafted tokens per step: the verify step's activations and a batch's cache slack.
        headroom: runtime reserve on top of the activation estimate: bytes, a size string, a
            fraction of ``memory``, or ``"auto"`` (1 GiB: CUDA context and allocator slack, or the
            Python/torch process on CPU).
        prompt_len: prompt tokens per row (default: unknown, planned for the worst case of each
            part: the whole context prefilled at once, and the cache slack of a 1-token prompt).
        device: ``"cpu"`` or ``"cuda"``: where a quantized drafter runs, which sets its compute
            (and KV) dtype, and where ``memory="auto"`` looks.

    The caches hold :func:`specdec.slots.cache_slots` slots per row, what the engine allocates.

    Raises:
        PlanError: when ``memory`` is given and nothing fits: not even batch 1 at the context, nor
            one token at the batch. The message says what to change.
        ValueError: bad arguments (unknown model, dtype, quantization, memory string).
    """
    self_copy = is_self_draft(verifier, drafter)
    vcfg = resolve(verifier)
    dcfg = vcfg if self_copy else (resolve(drafter) if drafter is not None else None)
    dtype_n = dtype_name(dtype)
    kv_n = dtype_name(kv_dtype if kv_dtype is not None else dtype)
    req = _request(vcfg, dcfg, self_copy, memory, context, batch, weight_quant, draft_quant, draft_len,
                   prompt_len, device)
    # A quantized drafter computes, and so caches, in its scheme's compute dtype (bf16 for int4/nf4).
    dq = req.dq
    d_kv_n = dtype_name(dq.compute_dtype) if (dq is not None and dq.compute_dtype and kv_dtype is None) else kv_n
    work = Workload(
        vcfg, dcfg, dtype=dtype_n, draft_dtype=d_kv_n, kv_dtype=kv_n, draft_kv_dtype=d_kv_n, draft_len=draft_len,
        verifier_weights=weight_bytes(vcfg, dtype_n, req.wq),
        drafter_weights=_drafter_weights(vcfg, dcfg, self_copy, dtype_n, dq),
        reserve=_reserve_bytes(headroom, req.budget),
    )
    result = _describe(req, work)
    if req.budget is not None:
        _apply_budget(result, req, work)
    return result


def _request(vcfg: Any, dcfg: Any, self_copy: bool, memory: Any, context: int | None, batch: int | None,
             weight_quant: Any, draft_quant: Any, draft_len: int, prompt_len: int | None, device: str) -> _Request:
    varch = arch(vcfg)
    darch = arch(dcfg) if dcfg is not None else None
    check_count("draft_len", draft_len, allow_zero=True)
    model_max = varch.max_positions
    if darch is not None and darch.max_positions:
        model_max = min(model_max, darch.max_positions) if model_max else darch.max_positions
    ctx = context if context is not None else (varch.max_positions or DEFAULT_CONTEXT)
    rows = batch if batch is not None else 1
    check_count("context", ctx)
    check_count("batch", rows)
    if prompt_len is not None:
        check_count("prompt_len", prompt_len)
    if isinstance(memory, str) and memory.strip().lower() == "auto":
        budget: int | None = available_memory(device)
    else:
        budget = parse_memory(memory) if memory is not None else None
    return _Request(varch, darch, self_copy, parse_quant(weight_quant, device), parse_quant(draft_quant, device),
                    rows, ctx, prompt_len, draft_len, model_max, budget)


def _drafter_weights(vcfg: Any, dcfg: Any, self_copy: bool, dtype: str, dq: QuantScheme | None) -> int:
    if dcfg is None:
        return 0
    if self_copy:
        # specdec's quantized self-copy shares the embedding and unchanged tensors with the verifier.
        return copy_weight_bytes(vcfg, dtype, dq)
    return weight_bytes(dcfg, dtype, dq)


def _reserve_bytes(headroom: Any, budget: int | None) -> int:
    if headroom is None or (isinstance(headroom, str) and headroom.strip().lower() == "auto"):
        return DEFAULT_RUNTIME_RESERVE
    fraction = None
    if isinstance(headroom, float) and 0 <= headroom < 1:
        fraction = headroom
    elif isinstance(headroom, str):
        text = headroom.strip()
        try:
            fraction = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            fraction = None
        if fraction is not None and not 0 <= fraction < 1:
            fraction = None
    if fraction is not None:
        if budget is None:
            raise ValueError("a fractional headroom needs a memory budget")
        return int(fraction * budget)
    return parse_memory(headroom)


def _describe(req: _Request, work: Workload) -> Plan:
    """The plan at the requested batch x context, without a budget's verdict."""
    need = req.need(work, req.batch, req.context)
    profile = kv_profile(work.verifier, work.kv_dtype)
    v, d = req.verifier, req.drafter
    return Plan(
        verifier=v.name,
        drafter=(f"{d.name} (self copy)" if req.self_copy else d.name) if d is not None else None,
        dtype=work.dtype,
        kv_dtype=work.kv_dtype,
        weight_quant=req.wq.name if req.wq else None,
        draft_quant=req.dq.name if req.dq else None,
        draft_len=req.draft_len,
        batch=req.batch,
        context=req.context,
        cache_len=req.slots(req.batch, req.context),
        verifier_params=param_count(work.verifier),
        drafter_params=param_count(work.drafter) if work.drafter is not None else 0,
        verifier_weight_bytes=need.verifier_weights,
        drafter_weight_bytes=need.drafter_weights,
        verifier_cache_bytes=need.verifier_cache,
        drafter_cache_bytes=need.drafter_cache,
        activation_bytes=need.activations,
        runtime_reserve_bytes=need.reserve,
        total_bytes=need.total,
        kv_bytes_per_token=work.verifier_kv_per_token,
        kv_bytes_per_token_by_type=dict(profile.bytes_per_token_by_type),
        kv_layers=dict(profile.layers),
        kv_windows=dict(profile.windows),
        naive_kv_bytes_per_token=profile.naive_bytes_per_token,
        kv_cache_bytes=req.batch * profile.per_sequence(req.context, cap_sliding=True),
        naive_kv_cache_bytes=req.batch * req.context * profile.naive_bytes_per_token,
        drafter_kv_bytes_per_token=work.drafter_kv_per_token,
        kv_heads=profile.kv_heads,
        query_heads=profile.query_heads,
        head_dim=profile.head_dim,
        model_max_context=req.model_max,
        prefill_tokens=req.prefill(req.context),
        kv_geometry=(f"MLA latent {v.mla['kv_lora_rank']} + rope key {v.mla['qk_rope_head_dim']}"
                     if v.mla else f"{v.kv_heads} KV heads x head_dim {v.head_dim}"),
        drafter_shares_weights=req.self_copy,
        notes=_notes(profile.layers, req.context, req.model_max),
    )


def _notes(layers: dict[str, int], context: int, model_max: int | None) -> list[str]:
    notes = []
    if layers.get("sliding") or layers.get("chunked"):
        notes.append("sliding layers: kv_cache_bytes caps them at the window; specdec's managed cache keeps the "
                     "full context on them (exact rollback), and the breakdown counts that")
    if layers.get("none"):
        notes.append("layers without KV (linear attention / recurrent) keep a fixed-size state per row: counted in the "
                     "caches with the checkpoints specdec's rollback keeps (specdec.sizing.state)")
    if model_max and context > model_max:
        notes.append(f"context {context:,} exceeds the model's max_position_embeddings {model_max:,}")
    return notes


def _apply_budget(result: Plan, req: _Request, work: Workload) -> None:
    """Fill in the verdict against ``req.budget``: fits, max batch and context, advice.

    Raises:
        PlanError: nothing fits (neither batch 1 at the context nor 1 token at the batch).
    """
    budget = req.budget
    assert budget is not None

    def fits(b: int, c: int) -> bool:
        return req.need(work, b, c).total <= budget

    naive = work.naive()
    result.memory_bytes = budget
    result.free_bytes = budget - result.total_bytes
    result.fits = result.total_bytes <= budget
    result.max_batch = largest(lambda b: fits(b, req.context), 1)
    result.max_context = largest(lambda c: fits(req.batch, c), 1, req.model_max)
    result.max_context_limited_by = "model" if req.model_max and result.max_context == req.model_max else "memory"
    result.naive_max_batch = largest(lambda b: req.need(naive, b, req.context).total <= budget, 1)
    if result.max_batch == 0 and result.max_context == 0:
        if not fits(1, 1):
            raise PlanError(_weights_do_not_fit(work, req.wq, budget), result)
        raise PlanError(_lower_both(fits, req.batch, req.context, req.model_max, budget, work.dtype), result)
    if not result.fits:
        result.advice = _does_not_fit(result.total_bytes, budget, result.max_batch, result.max_context,
                                      req.batch, req.context, work.dtype, req.wq)


def _weights_do_not_fit(work: Workload, wq: QuantScheme | None, budget: int) -> str:
    """The planner's message when even the weights and the reserve leave no room."""
    v, d = work.verifier_weights, work.drafter_weights
    return (f"nothing fits in {format_bytes(budget)}: weights take {format_bytes(v + d)} "
            f"(verifier {format_bytes(v)}" + (f", drafter {format_bytes(d)}" if work.drafter is not None else "")
            + f") plus {format_bytes(work.reserve)} runtime reserve. " + _weight_tips(work, wq, budget))


def _weight_tips(work: Workload, wq: QuantScheme | None, budget: int) -> str:
    """What would make the weights fit: a smaller dtype, or quantizing the verifier's linears."""
    tips = []
    for scheme in ("int8", "int4"):
        if wq is not None and wq.bits <= parse_quant(scheme).bits:
            continue
        w = weight_bytes(work.verifier, work.dtype, scheme) + work.drafter_weights
        verdict = "would leave room" if w + work.reserve < budget else "still too much"
        tips.append(f"--quant {scheme} brings the weights to {format_bytes(w)} ({verdict})")
    smaller = smaller_dtype(work.dtype)
    if smaller:
        tips.insert(0, f"--dtype {smaller} halves the weights")
    tips.append("use more memory or a smaller model/drafter")
    return "To fit: " + "; ".join(tips) + "."


def _lower_both(fits: Callable[[int, int], bool], batch: int, context: int, model_max: int | None, budget: int,
                dtype: Any) -> str:
    """The planner's message when neither batch 1 at the context nor 1 token at the batch fits."""
    best_c = largest(lambda c: fits(1, c), 1, model_max)
    small_c = min(context, 2048)
    best_b = largest(lambda b: fits(b, small_c), 1)
    smaller = smaller_dtype(dtype)
    return (f"batch {batch} x context {context:,} does not fit in {format_bytes(budget)}: not even batch 1 at "
            f"context {context:,}, nor 1 token at batch {batch}. Lower both: batch 1 fits up to context "
            f"{best_c:,}; context {small_c:,} fits up to batch {best_b}"
            + (f"; or use a smaller dtype ({smaller})" if smaller else "") + ".")


def _does_not_fit(total: int, budget: int, max_batch: int, max_context: int, batch: int, context: int, dtype: Any,
                  wq: QuantScheme | None) -> str:
    """``Plan.advice`` when the requested batch x context does not fit but something smaller does."""
    tips = []
    if max_batch:
        tips.append(f"lower the batch to {max_batch} at context {context:,}")
    if max_context:
        tips.append(f"shorten the context to {max_context:,} at batch {batch}")
    smaller = smaller_dtype(dtype)
    if smaller:
        tips.append(f"use --dtype {smaller}")
    elif wq is None:
        tips.append("quantize the weights (--quant int8 / int4)")
    return f"DOES NOT FIT: needs {format_bytes(total)} of {format_bytes(budget)}; " + "; or ".join(tips) + "."
