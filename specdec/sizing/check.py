"""The engine's pre-check: do a call's managed caches and activations fit, before any compute?

:class:`PlanError` is what does not fit raises, here and in the planner (:func:`specdec.sizing.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec.errors import SpecdecError
from specdec.sizing.budget import Need, Workload, largest
from specdec.sizing.configs import ConfigLike, is_self_draft, resolve
from specdec.sizing.memory import available_memory, check_count, dtype_name, format_bytes, parse_memory, smaller_dtype
from specdec.sizing.weights import weight_bytes


class PlanError(SpecdecError, MemoryError):
    """A request does not fit in memory. The message says what to change.

    ``plan`` holds the :class:`~specdec.sizing.Plan` the planner computed before giving up, when
    there is one (:func:`check_fits` leaves it None).
    """

    def __init__(self, message: str, plan: Any = None) -> None:
        super().__init__(message)
        self.plan = plan


@dataclass(frozen=True)
class FitCheck:
    """What :func:`check_fits` counted, in bytes."""

    required_bytes: int
    available_bytes: int
    verifier_cache_bytes: int
    drafter_cache_bytes: int
    activation_bytes: int
    weight_bytes: int
    device: str


def check_fits(
    verifier_config: ConfigLike,
    drafter_config: ConfigLike | None,
    batch_size: int,
    max_len: int,
    dtype: Any,
    memory_budget_bytes: int | str | None = None,
    *,
    drafter_dtype: Any = None,
    device: Any = None,
    prefill_tokens: int | None = None,
    draft_len: int = 8,
    include_weights: bool = False,
    weight_dtype: Any = None,
    weight_quant: str | None = None,
    draft_quant: str | None = None,
) -> FitCheck:
    """Check, before any compute, that the managed caches for ``batch_size`` rows of ``max_len``
    slots (:func:`specdec.slots.cache_slots`) plus the prefill/verify activations fit in memory.

    ``dtype`` is the KV dtype of the verifier cache (the model's dtype), ``drafter_dtype`` the
    drafter's (default ``dtype``). ``memory_budget_bytes`` defaults to what is free now on
    ``device`` (:func:`available_memory`); since the models are normally loaded already, weights
    are not counted unless ``include_weights``. ``prefill_tokens`` is the prompt length per row
    (default ``max_len``, an upper bound). Counts with the planner's own
    :meth:`~specdec.sizing.budget.Workload.need`.

    Raises:
        PlanError: when it does not fit, saying how far to lower the batch or the length, or which
            smaller dtype would fit.
    """
    check_count("batch_size", batch_size)
    check_count("max_len", max_len)
    vcfg = resolve(verifier_config)
    if is_self_draft(verifier_config, drafter_config):
        dcfg = vcfg
    else:
        dcfg = resolve(drafter_config) if drafter_config is not None else None
    d_dtype = drafter_dtype if drafter_dtype is not None else dtype
    dev = "cpu" if device is None else str(device)
    budget = parse_memory(memory_budget_bytes) if memory_budget_bytes is not None else available_memory(device)
    prefill = max_len if prefill_tokens is None else int(prefill_tokens)
    v_weights = d_weights = 0
    if include_weights:
        v_weights = weight_bytes(vcfg, weight_dtype if weight_dtype is not None else dtype, weight_quant)
        if dcfg is not None:
            d_weights = weight_bytes(dcfg, d_dtype if weight_dtype is None else weight_dtype, draft_quant)
    work = Workload(vcfg, dcfg, dtype=dtype_name(dtype), draft_dtype=dtype_name(d_dtype), kv_dtype=dtype_name(dtype),
                    draft_kv_dtype=dtype_name(d_dtype), draft_len=draft_len, verifier_weights=v_weights,
                    drafter_weights=d_weights)
    need = work.need(batch_size, max_len, prefill)
    if need.total <= budget:
        return FitCheck(need.total, budget, need.verifier_cache, need.drafter_cache, need.activations, need.weights,
                        dev)
    raise PlanError(_does_not_fit(work, batch_size, max_len, prefill, budget, dev, need, include_weights))


def _does_not_fit(work: Workload, batch: int, slots: int, prefill: int, budget: int, device: str, need: Need,
                  include_weights: bool) -> str:
    """:func:`check_fits`'s message: what was counted, and the batch, row length or dtype that would fit."""

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
