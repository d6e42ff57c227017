"""The drafter protocol: what the speculative loop asks of anything that proposes tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers import LogitsProcessorList


@dataclass
class Proposal:
    """``k`` proposed tokens per row and, when sampling, the processed probabilities they were drawn from.

    ``probs`` is ``[batch, k, vocab]`` or ``None``; ``None`` means a deterministic drafter, which the
    acceptance rule treats as one-hot ``q``.
    """

    tokens: torch.LongTensor
    probs: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[1])


@dataclass
class DraftContext:
    """What a drafter may use to draft: the processors and the sampling mode of this call."""

    processors: LogitsProcessorList
    do_sample: bool
    generator: torch.Generator | None = None
    vocab_size: int | None = None  # the verifier's vocabulary: never propose ids at or beyond it


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens for the speculative loop.

    The loop calls :meth:`start` once per ``generate`` call, then alternately :meth:`propose` (with
    the committed rows so far) and :meth:`commit` (with the new committed rows after verification,
    so the drafter can roll back its state past the first rejected token). Rows are 1-D tensors in
    transformers' layout: the row's left padding from the prompt batch, then its real tokens; they
    may have different lengths. :meth:`keep_rows` drops finished rows from the batch.
    """

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int) -> None:
        """Prepare for a new batch of prompts; ``max_len`` bounds prompt + generated + draft tokens."""

    def propose(self, rows: list[torch.LongTensor], k: int, ctx: DraftContext) -> Proposal:
        """Return up to ``k`` draft tokens per row, as a ``[batch, k']`` tensor (``k' <= k``)."""

    def commit(self, rows: list[torch.LongTensor]) -> None:
        """Learn the committed rows after a verification step."""

    def keep_rows(self, indices: torch.Tensor) -> None:
        """Keep only these rows (by position in the current batch)."""

    def finish(self) -> None:
        """Release per-call state (caches)."""
