"""A grammar as a pure function of a row's context, which is what speculation needs.

Grammar libraries ship stateful logits processors: each call advances a parser by the last token of
``input_ids`` and assumes one new token per call. specdec calls a row's processors once per verify
position (and per draft position, and per tree node), in any order, with contexts that may be rejected.
A :class:`PrefixConstraint` answers for any context: it brings its parser to that context (rolling back
to the longest prefix it shares with the last one, :func:`shared_prefix`), then masks the scores exactly
as the library's processor would have after ``generate`` fed it those tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from transformers import LogitsProcessor


class PrefixConstraint(LogitsProcessor, ABC):
    """One row's constraint: ``__call__(input_ids [1, L], scores [1, V])`` masks ``scores`` for that context.

    ``prompt_length``: how many leading tokens of every context are the (left-padded) prompt; the parser sees
    only what follows. A context that holds a token the grammar forbids (a rejected draft: the verifier gives it
    probability 0, so nothing scored after it is ever used) is masked as its longest allowed prefix.
    """

    def __init__(self, prompt_length: int) -> None:
        self.prompt_length = prompt_length

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[0] != 1:
            raise ValueError(f"{type(self).__name__} constrains one row; got a batch of {input_ids.shape[0]}")
        return self.mask(input_ids[0, self.prompt_length:].tolist(), scores)

    @abstractmethod
    def mask(self, tokens: list[int], scores: torch.FloatTensor) -> torch.FloatTensor:
        """``scores [1, V]`` masked for a context whose generated tokens are ``tokens``."""

    @abstractmethod
    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of ``tokens`` the grammar accepts."""

    def forced_text(self, tokens: list[int]) -> str:
        """The text the grammar forces after ``tokens`` whatever comes next ("" if none, or if unknown)."""
        return ""


def shared_prefix(fed: list[int], tokens: list[int]) -> int:
    """How many leading tokens ``fed`` (what a parser has accepted) and ``tokens`` (the asked context) share."""
    common = 0
    for a, b in zip(fed, tokens):
        if a != b:
            break
        common += 1
    return common


class BatchConstraint(LogitsProcessor):
    """Row constraints applied to a ``[B, L]`` batch, row ``b`` by ``rows[b]`` (the call's first token)."""

    def __init__(self, rows: list[PrefixConstraint]) -> None:
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return torch.cat([self.rows[b](input_ids[b : b + 1], scores[b : b + 1]) for b in range(input_ids.shape[0])])
