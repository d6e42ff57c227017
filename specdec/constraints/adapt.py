"""Which grammar processors specdec keeps exact, and how: the user's processors in, row constraints out.

Recognised by class (module and name), so no grammar library is imported unless the call uses it.
A processor of a library known to keep state between calls that has no adapter here is refused with
a one-line error: run under speculation it would be fed contexts out of order and answer wrongly.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from transformers import LogitsProcessor

from specdec.constraints.base import BatchConstraint, PrefixConstraint
from specdec.errors import SpecdecError


class UnsupportedProcessorError(SpecdecError, TypeError):
    """A logits processor that keeps state between calls and that specdec cannot keep exact."""


def _xgrammar(processor, input_ids: torch.LongTensor) -> list[PrefixConstraint]:
    from specdec.constraints.xgrammar import xgrammar_rows

    return xgrammar_rows(processor, input_ids.shape[1], input_ids.shape[0])


def _outlines_xgrammar(processor, input_ids: torch.LongTensor) -> list[PrefixConstraint]:
    from specdec.constraints.xgrammar import XGrammarRow

    # the same matcher protocol as xgrammar's own processor, one grammar for every row
    return [XGrammarRow(processor.compiled_grammar, input_ids.shape[1]) for _ in range(input_ids.shape[0])]


def _outlines_core(processor, input_ids: torch.LongTensor) -> list[PrefixConstraint]:
    from specdec.constraints.outlines import outlines_core_rows

    return outlines_core_rows(processor, input_ids.shape[1], input_ids.shape[0])


#: "module.ClassName" -> how to build its row constraints from (processor, the call's input_ids)
ADAPTERS: dict[str, Callable[[LogitsProcessor, torch.LongTensor], list[PrefixConstraint]]] = {
    "xgrammar.contrib.hf.LogitsProcessor": _xgrammar,
    "outlines.backends.outlines_core.OutlinesCoreLogitsProcessor": _outlines_core,
    "outlines.backends.xgrammar.XGrammarLogitsProcessor": _outlines_xgrammar,
}

#: stateful processors (a class or a base class) without an adapter: refused, never run wrong. outlines' llguidance
#: backend shares its base class; transformers-cfg 0.2 cannot be built under transformers 5
#: (its tokenizer check refuses transformers 5's tokenizer classes), so its adapter could not be tested.
STATEFUL = ("outlines.processors.base_logits_processor.OutlinesLogitsProcessor",
            "transformers_cfg.generation.logits_process.GrammarConstrainedLogitsProcessor")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _adapter(processor: object):
    for cls in type(processor).__mro__:
        if _name(cls) in ADAPTERS:
            return ADAPTERS[_name(cls)]
        if _name(cls) in STATEFUL:
            raise UnsupportedProcessorError(
                f"{_name(type(processor))} keeps parser state between calls and specdec has no adapter for it, so "
                "speculation would feed it out of order; supported grammar processors: "
                + ", ".join(sorted(ADAPTERS)))
    return None


def constrained_rows(processors: Sequence[object] | None, input_ids: torch.LongTensor
                     ) -> tuple[list[object], list[list[object]]]:
    """The call's processor list for the batch and for each row, with grammar processors replaced by
    :class:`PrefixConstraint` s (one per row, a :class:`BatchConstraint` of them for the batch); other
    processors are kept as they are (they must be pure functions of ``input_ids`` and the scores)."""
    batch = input_ids.shape[0]
    batched: list[object] = []
    rows: list[list[object]] = [[] for _ in range(batch)]
    for processor in processors or ():
        adapter = _adapter(processor)
        if adapter is None:
            batched.append(processor)
            for row in rows:
                row.append(processor)
            continue
        row_constraints = adapter(processor, input_ids)
        batched.append(BatchConstraint(row_constraints))
        for row, constraint in zip(rows, row_constraints):
            row.append(constraint)
    return batched, rows


def has_constraint(processors: Sequence[object]) -> bool:
    """Whether a processor list holds a grammar constraint (whose contexts are read on the host)."""
    return any(isinstance(p, (PrefixConstraint, BatchConstraint)) for p in processors)


class AnyOrder(LogitsProcessor):
    """A grammar processor list made safe for callers that score several positions per call, such as transformers'
    assisted generation (``assistant_model=`` / ``prompt_lookup_num_tokens=``), which fails on xgrammar's processor
    as speculation does. Its first call must be the prompt ``[B, L]`` (it sets each row's prompt length); after that
    any context of those rows, in any order."""

    def __init__(self, processors: Sequence[object]) -> None:
        self.processors = list(processors)
        self._batched: list[object] | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._batched is None:
            self._batched, _ = constrained_rows(self.processors, input_ids)
        for processor in self._batched:
            scores = processor(input_ids, scores)
        return scores
