"""Evaluation: prompt sets, side-by-side runs against transformers' baselines, metrics, reports, plots.

>>> from specdec.eval import EvalConfig, load_prompts, run_eval
>>> config = EvalConfig(out_dir="eval-out", draft="self:int8", num_draft_tokens=[2, 4])  # default baselines
>>> report = run_eval(model, tokenizer, load_prompts(per_group=1), config)
>>> report.method("specdec[self:int8,k=4]")["speedup"]      # tokens/s ratio over model.generate
>>> print(report)                                           # the markdown report

``EvalConfig(baselines=[...])`` takes any of :func:`baseline_names` (the registered baselines).

Modules: :mod:`~specdec.eval.config` (:class:`EvalConfig`), :mod:`~specdec.eval.methods` (methods,
drafters for both sides), :mod:`~specdec.eval.baselines` (the baselines, one declaration each:
:func:`register_baseline` adds one), :mod:`~specdec.eval.measure` (timing one generation),
:mod:`~specdec.eval.records` (the output directory, resume checks), :mod:`~specdec.eval.runner` (the
loop), :mod:`~specdec.eval.json_schema` (JSON answers: schema constraints and validity),
:mod:`~specdec.eval.report` and :mod:`~specdec.eval.plots`; prompts come from :mod:`specdec.prompts`.

Command line: ``specdec eval ...`` or ``python -m specdec.eval ...`` (see docs/eval.md).
Heavy dependencies (datasets, evaluate, accelerate, matplotlib: ``pip install 'specdec[eval]'``)
are imported only when used. The public names below are imported on first use too (several need torch), so that
importing a module of this package (``specdec eval --help`` reads :mod:`specdec.eval.__main__`) loads only what
that module needs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdec.lazy import lazy_exports

if TYPE_CHECKING:
    from specdec.drafters import register_drafter
    from specdec.eval.baselines import (
        Baseline, baseline_names, register_baseline, registered_baseline, unregister_baseline)
    from specdec.eval.config import EvalConfig
    from specdec.eval.json_schema import SchemaConstraints, SchemaError, check_output, is_valid
    from specdec.eval.methods import MethodSpec, ResolvedDraft, plan_methods, resolve_draft
    from specdec.eval.metrics import compute_metric, metric_path
    from specdec.eval.records import OutputDirError, ResumeError, check_out_dir, load_records
    from specdec.eval.report import EvalReport, build_summary
    from specdec.eval.runner import run_eval
    from specdec.prompts import DatasetError, Prompt, default_dataset, load_prompts, select_per_group

#: public name -> module that defines it
_LAZY = {
    "register_drafter": "specdec.drafters",  # the one drafter registry; re-exported here for older code
    "Baseline": "specdec.eval.baselines",
    "baseline_names": "specdec.eval.baselines",
    "register_baseline": "specdec.eval.baselines",
    "registered_baseline": "specdec.eval.baselines",
    "unregister_baseline": "specdec.eval.baselines",
    "EvalConfig": "specdec.eval.config",
    "SchemaConstraints": "specdec.eval.json_schema",
    "SchemaError": "specdec.eval.json_schema",
    "check_output": "specdec.eval.json_schema",
    "is_valid": "specdec.eval.json_schema",
    "MethodSpec": "specdec.eval.methods",
    "ResolvedDraft": "specdec.eval.methods",
    "plan_methods": "specdec.eval.methods",
    "resolve_draft": "specdec.eval.methods",
    "compute_metric": "specdec.eval.metrics",
    "metric_path": "specdec.eval.metrics",
    "OutputDirError": "specdec.eval.records",
    "ResumeError": "specdec.eval.records",
    "check_out_dir": "specdec.eval.records",
    "load_records": "specdec.eval.records",
    "EvalReport": "specdec.eval.report",
    "build_summary": "specdec.eval.report",
    "run_eval": "specdec.eval.runner",
    "DatasetError": "specdec.prompts",
    "Prompt": "specdec.prompts",
    "default_dataset": "specdec.prompts",
    "load_prompts": "specdec.prompts",
    "select_per_group": "specdec.prompts",
}

__all__ = [
    "Baseline",
    "DatasetError",
    "EvalConfig",
    "EvalReport",
    "MethodSpec",
    "OutputDirError",
    "Prompt",
    "ResolvedDraft",
    "ResumeError",
    "SchemaConstraints",
    "SchemaError",
    "baseline_names",
    "build_summary",
    "check_out_dir",
    "check_output",
    "compute_metric",
    "default_dataset",
    "is_valid",
    "load_prompts",
    "load_records",
    "metric_path",
    "plan_methods",
    "register_baseline",
    "register_drafter",
    "registered_baseline",
    "resolve_draft",
    "run_eval",
    "select_per_group",
    "unregister_baseline",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
