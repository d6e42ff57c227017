"""Draft logits as the verifier judges them: fitted to its vocabulary and through the call's logits processors."""

from __future__ import annotations

import torch

from specdec.processing import RowContext
from specdec.protocol import DraftContext


def processed_scores(logits: torch.Tensor, contexts: list[RowContext], ctx: DraftContext) -> torch.Tensor:
    """Draft logits ``[B, V']`` as the verifier will judge them: fitted to its vocabulary (ids past it
    dropped, missing ones -inf) and through the call's logits processors, entry ``b`` with
    ``contexts[b] = (row owner, context)`` (:meth:`Rows.contexts`)."""
    logits = logits.float()
    vocab = ctx.vocab_size or logits.shape[-1]
    if logits.shape[-1] > vocab:  # padded head: ids past the verifier's vocabulary do not exist
        logits = logits[..., :vocab]
    elif logits.shape[-1] < vocab:
        logits = torch.nn.functional.pad(logits, (0, vocab - logits.shape[-1]), value=float("-inf"))
    return ctx.processors.apply(contexts, logits)
