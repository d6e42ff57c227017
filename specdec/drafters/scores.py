"""Draft logits as the verifier judges them: fitted to its vocabulary and through the call's logits processors."""

from __future__ import annotations

import torch

from specdec.acceptance import draft_distribution
from specdec.processing import RowContext
from specdec.protocol import DraftChain, DraftContext, Rows
from specdec.trees.build import TreeShape, grow_tree
from specdec.trees.tree import DraftTree


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


def draw(scores: torch.Tensor, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One draft per row from processed ``scores [B, V]``: sampled, with the distribution it was drawn from, when the
    call samples; else the argmax, with None (one-hot ``q``)."""
    if not ctx.do_sample:
        return scores.argmax(dim=-1), None
    p = draft_distribution(scores)
    return torch.multinomial(p, 1, generator=ctx.generator).squeeze(-1), p


def extended(contexts: list[RowContext], token: torch.Tensor) -> list[RowContext]:
    """Each row's processor context with its new draft ``token [B]`` after it (processors read the context)."""
    return [(owner, torch.cat([row, t.view(1)])) for (owner, row), t in zip(contexts, token)]


def chain_of_positions(logits: torch.Tensor, rows: Rows, ctx: DraftContext) -> DraftChain:
    """A chain from per-position draft logits ``[B, k, V']`` that do not depend on the drafts before them (block
    drafters): each position processed with the row's context extended by the drafts before it, then drawn."""
    contexts, tokens, probs = rows.contexts(), [], []
    for i in range(logits.shape[1]):
        token, p = draw(processed_scores(logits[:, i], contexts, ctx), ctx)
        tokens.append(token)
        probs += [p] if p is not None else []
        if ctx.processors:
            contexts = extended(contexts, token)
    return DraftChain(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)


def tree_of_positions(logits: torch.Tensor, shape: TreeShape, rows: Rows, ctx: DraftContext) -> DraftTree:
    """A tree from per-position draft logits ``[B, n, V']`` (block drafters): every node at depth ``d`` takes its
    children from position ``d``'s top-ranked tokens, whatever its parent, with no further forward."""
    n, batch = logits.shape[1], torch.arange(len(rows), device=logits.device).unsqueeze(1)

    def expand(tokens, depth, parent_pos, visible):  # children at depth d + 1: position d's logits
        return logits[batch, depth.clamp(max=n - 1)]

    return grow_tree(logits[:, 0], expand, shape, rows, ctx, lambda lg, contexts: processed_scores(lg, contexts, ctx)).tree
