"""Grammar-constrained generation kept exact under speculation (docs/structured.md).

Grammar libraries' logits processors (xgrammar, outlines) keep a parser per row and
advance it one token per call. specdec replaces each by row constraints that answer for any context
(:mod:`specdec.constraints.base`), chosen in :mod:`specdec.constraints.adapt`.
"""

from specdec.constraints.adapt import UnsupportedProcessorError, constrained_rows, has_constraint
from specdec.constraints.base import BatchConstraint, PrefixConstraint

__all__ = ["BatchConstraint", "PrefixConstraint", "UnsupportedProcessorError", "constrained_rows", "has_constraint"]
