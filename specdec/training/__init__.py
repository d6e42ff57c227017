"""Training draft heads, and reporting on them: applications of the API above the :mod:`specdec.heads` leaf.

>>> from specdec.training import PipelineConfig, TrainConfig, run_pipeline
>>> run_pipeline(model, tokenizer, "data/train_prompts", "runs/head", PipelineConfig(train=TrainConfig()))

Modules: :mod:`~specdec.training.prompts` (training prompts, :class:`TrainHeadError`),
:mod:`~specdec.training.self_instruct` and :mod:`~specdec.training.distill` (the verifier writes the data),
:mod:`~specdec.training.features` (cached verifier features), :mod:`~specdec.training.train` (the training loop),
:mod:`~specdec.training.pipeline` (the resumable stages), :mod:`~specdec.training.card` (the model card),
:mod:`~specdec.training.cli` (``specdec train-head``), :mod:`~specdec.training.report` and
:mod:`~specdec.training.report_cli` (``specdec head-report``). See docs/heads.md.

Drafters load heads from :mod:`specdec.heads` (configs, modules, checkpoints, shipped heads) and never import
this package.

The public names below are imported on first use (they need torch), so that the command-line modules of this
package (``specdec train-head --help`` reads :mod:`~specdec.training.cli`) load only what they need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdec.lazy import lazy_exports

if TYPE_CHECKING:
    from specdec.training.pipeline import PipelineConfig, ResumeError, run_pipeline
    from specdec.training.prompts import TrainHeadError
    from specdec.training.report import first_draft_agreement, head_report
    from specdec.training.train import TrainConfig, train_head

#: public name -> module that defines it
_LAZY = {
    "PipelineConfig": "specdec.training.pipeline",
    "ResumeError": "specdec.training.pipeline",
    "run_pipeline": "specdec.training.pipeline",
    "TrainHeadError": "specdec.training.prompts",
    "first_draft_agreement": "specdec.training.report",
    "head_report": "specdec.training.report",
    "TrainConfig": "specdec.training.train",
    "train_head": "specdec.training.train",
}

__all__ = ["PipelineConfig", "ResumeError", "TrainConfig", "TrainHeadError", "first_draft_agreement", "head_report",
           "run_pipeline", "train_head"]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
