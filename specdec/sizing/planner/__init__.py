"""The memory planner, a layer above the sizing core: :func:`plan` (``planning``), its result
:class:`Plan` with its text and HTML tables (``result``), and the ``specdec plan`` command
(``command``). It counts with the core's :class:`~specdec.sizing.budget.Workload`, as
:func:`~specdec.sizing.check_fits` does; the core never imports it."""

from __future__ import annotations

from specdec.sizing.planner.command import add_plan_arguments, run_plan
from specdec.sizing.planner.planning import DEFAULT_CONTEXT, DEFAULT_RUNTIME_RESERVE, plan
from specdec.sizing.planner.result import Plan

__all__ = ["DEFAULT_CONTEXT", "DEFAULT_RUNTIME_RESERVE", "Plan", "add_plan_arguments", "plan", "run_plan"]
