"""specdec's metrics as local ``evaluate`` modules, loadable offline by path.

``evaluate.load("exact_match")`` and the other stock metrics are scripts on the hub and fail offline;
these are plain files in this package, so ``evaluate.load(metric_path(name))`` works anywhere.

>>> from specdec.eval.metrics import compute_metric
>>> compute_metric("acceptance_rate", accepted=[3, 1], proposed=[4, 4])["acceptance_rate"]
0.5
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

METRICS_DIR = Path(__file__).resolve().parent
METRIC_NAMES = ("acceptance_rate", "mean_accepted_length", "speedup", "token_exact_match")


def metric_path(name: str) -> str:
    """Path of the local evaluate module ``name`` (one of :data:`METRIC_NAMES`), for ``evaluate.load``."""
    if name not in METRIC_NAMES:
        raise ValueError(f"unknown specdec metric {name!r}; choose from {', '.join(METRIC_NAMES)}")
    return str(METRICS_DIR / f"{name}.py")


@lru_cache(maxsize=None)
def load_metric(name: str) -> Any:
    """``evaluate.load`` of a specdec metric, kept in memory (no cache files, safe beside other processes)."""
    import evaluate

    return evaluate.load(metric_path(name), keep_in_memory=True)


def compute_metric(name: str, **inputs: Any) -> dict[str, Any]:
    """Compute a specdec metric through ``evaluate``; ``inputs`` are the module's features."""
    metric = load_metric(name)
    if not any(len(v) for v in inputs.values()):
        # evaluate infers the feature format from the first row and fails on empty input; our own
        # modules define the empty case (zeros), so ask them directly
        return metric._compute(**inputs)
    return metric.compute(**inputs)


__all__ = ["METRICS_DIR", "METRIC_NAMES", "compute_metric", "load_metric", "metric_path"]
