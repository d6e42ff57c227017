"""The base class of the errors a user can fix, and the one error class two packages share (a leaf: imports nothing).

Every user-facing error derives from :class:`SpecdecError` *and* keeps its builtin base (``class
PlanError(SpecdecError, MemoryError)``), so ``except ValueError`` callers keep working while the command lines catch
``SpecdecError`` alone and print its message as one ``error:`` line. Errors that mean specdec itself is wrong (a
broken invariant, such as :class:`~specdec.runners.cache.CacheOverflowError`) do not derive from it: they keep
their traceback.
"""

from __future__ import annotations

__all__ = ["ResumeError", "SpecdecError"]


class SpecdecError(Exception):
    """A user's input or environment is wrong: the message is one line saying what and how to fix it."""


class ResumeError(SpecdecError, ValueError):
    """An output directory holds work made with other settings (or of other prompt text) than this run's: rerun
    with the same settings, another directory, or ``--overwrite``. Raised by ``specdec eval``
    (:mod:`specdec.eval.records`) and ``specdec train-head`` (:mod:`specdec.training.pipeline`, where it is
    also a :class:`~specdec.training.prompts.TrainHeadError`)."""
