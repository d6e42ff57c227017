"""Evaluation: prompt sets, side-by-side runs against transformers' baselines, metrics, reports, plots.

>>> from specdec.eval import run_eval, load_prompts
>>> report = run_eval(model, tokenizer, load_prompts(per_group=1), out_dir="eval-out",
...                   draft="self:int8", num_draft_tokens=[2, 4], baselines=["hf", "hf-assisted"])
>>> report.method("specdec[self:int8,k=4]")["speedup"]      # tokens/s ratio over model.generate
>>> print(report)                                           # the markdown report

Command line: ``specdec eval ...`` or ``python -m specdec.eval ...`` (see docs/eval.md).
Heavy dependencies (datasets, evaluate, accelerate, matplotlib: ``pip install 'specdec[eval]'``)
are imported only when used.
"""

from specdec.eval.datasets import DatasetError, Prompt, default_dataset, load_prompts, select_per_group
from specdec.eval.metrics import compute_metric, metric_path
from specdec.eval.report import EvalReport, build_summary
from specdec.eval.runner import (
    MethodSpec,
    OutputDirError,
    ResolvedDraft,
    ResumeError,
    check_out_dir,
    load_records,
    plan_methods,
    register_drafter,
    resolve_draft,
    run_eval,
)

__all__ = [
    "DatasetError",
    "EvalReport",
    "MethodSpec",
    "OutputDirError",
    "Prompt",
    "ResolvedDraft",
    "ResumeError",
    "build_summary",
    "check_out_dir",
    "compute_metric",
    "default_dataset",
    "load_prompts",
    "load_records",
    "metric_path",
    "plan_methods",
    "register_drafter",
    "resolve_draft",
    "run_eval",
    "select_per_group",
]
