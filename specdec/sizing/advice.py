"""What to change when a request does not fit: the messages of PlanError and Plan.advice."""

from __future__ import annotations

from typing import Any, Callable

from specdec.sizing.budget import Need, Workload, largest
from specdec.sizing.memory import format_bytes, smaller_dtype
from specdec.sizing.quant import QuantScheme, parse_quant
from specdec.sizing.weights import weight_bytes


def check_fits_failure(work: Workload, batch: int, slots: int, prefill: int, budget: int, device: str,
                       need: Need, include_weights: bool) -> str:
    """:func:`~specdec.sizing.check_fits`'s message: what was counted, and the batch, row length or
    dtype that would fit."""

    def fits(w: Workload, b: int, n: int) -> bool:
        return w.need(b, n, prefill).total <= budget

    tips = []
    max_b = largest(lambda b: fits(work, b, slots), 1)
    max_l = largest(lambda n: fits(work, batch, n), 1)
    if max_b:
        tips.append(f"lower the batch to {max_b}")
    if max_l:
        tips.append(f"shorten the rows to {max_l} cache slots each (prompt + max_new_tokens, plus a batch's slack)")
    smaller = smaller_dtype(work.dtype)
    if smaller is not None:
        draft_smaller = smaller_dtype(work.draft_dtype) or work.draft_dtype
        if fits(work.with_dtypes(smaller, draft_smaller), batch, slots):
            tips.append(f"load the models in {smaller} (halves the KV cache)")
        else:
            tips.append(f"use a smaller dtype ({smaller} halves the KV cache)")
    if not tips:
        tips.append("free memory or use a smaller model/draft")
    return (
        f"not enough memory on {device}: batch {batch} x {slots} slots needs {format_bytes(need.total)} "
        f"(verifier KV cache {format_bytes(need.verifier_cache)}, drafter KV cache {format_bytes(need.drafter_cache)}, "
        f"activations ~{format_bytes(need.activations)}"
        + (f", weights {format_bytes(need.weights)}" if include_weights else "")
        + f") but {format_bytes(budget)} is available. To fit: " + "; or ".join(tips) + "."
    )


def weights_do_not_fit(work: Workload, wq: QuantScheme | None, budget: int) -> str:
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


def lower_both(fits: Callable[[int, int], bool], batch: int, context: int, model_max: int | None, budget: int,
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


def does_not_fit(total: int, budget: int, max_batch: int, max_context: int, batch: int, context: int, dtype: Any,
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
