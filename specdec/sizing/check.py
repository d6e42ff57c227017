"""The engine's pre-check: do a call's managed caches and activations fit, before any compute?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec.sizing import advice
from specdec.sizing.budget import Workload
from specdec.sizing.configs import ConfigLike, is_self_draft, resolve
from specdec.sizing.memory import available_memory, check_count, dtype_name, parse_memory
from specdec.sizing.result import PlanError
from specdec.sizing.weights import weight_bytes


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
    raise PlanError(advice.check_fits_failure(work, batch_size, max_len, prefill, budget, dev, need, include_weights))
