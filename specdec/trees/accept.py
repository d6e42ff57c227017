"""Acceptance over a draft tree: the longest root-to-node path the verifier agrees with.

Scores come from one verifier pass over ``[root, node_1 .. node_N]`` (position 0 is the row's newest
committed token; position ``i + 1`` is node ``i``), each position predicting the token after it. Both rules
return ``(accepted [B], tokens [B, D + 1], path [B, D])`` on the device: the accepted path's node indices (-1 past
``accepted[b]``) and the tokens to commit (the path's tokens, then the verifier's own), as the chain rules in
:mod:`specdec.acceptance` do for a chain; ``D`` is the tree's depth.

Both walk every row at once on the device, with no host read: the tree's structure is uploaded from the host
(:meth:`DraftTree.child_table`), each node's accepted child (if any) is decided for all nodes together, one
sibling rank at a time, and the walk then follows those choices ``D`` steps down. The engine reads the result
once, with the pass's other host ints (:meth:`specdec.verification.Verified.read`).
"""

from __future__ import annotations

import torch

from specdec.trees.tree import DraftTree


def _walk(chosen: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Follow ``chosen [B, N + 1]`` (per verify position, the accepted child node or -1) from the root, ``depth``
    steps at most: ``(accepted [B], path [B, depth], end [B])`` with ``end`` the verify position the walk stopped at."""
    batch = chosen.shape[0]
    end = torch.zeros(batch, dtype=torch.long, device=chosen.device)
    alive = torch.ones(batch, dtype=torch.bool, device=chosen.device)
    steps = []
    for _ in range(depth):
        child = chosen.gather(1, end.unsqueeze(1)).squeeze(1)
        alive = alive & (child >= 0)
        steps.append(torch.where(alive, child, -1))
        end = torch.where(alive, child + 1, end)
    path = torch.stack(steps, dim=1) if steps else torch.zeros(batch, 0, dtype=torch.long, device=chosen.device)
    return (path >= 0).sum(dim=1), path, end


def commit_tokens(tree: DraftTree, path: torch.Tensor, accepted: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """``[B, D + 1]``: the accepted path's tokens, then ``last`` (the verifier's own) at ``accepted``; 0 after."""
    on_path = tree.tokens.gather(1, path.clamp_min(0)) if path.shape[1] else path
    tokens = torch.cat([torch.where(path >= 0, on_path, 0), torch.zeros_like(accepted).unsqueeze(1)], dim=1)
    return tokens.scatter(1, accepted.unsqueeze(1), last.unsqueeze(1))


def _child_tokens(tree: DraftTree, child: torch.Tensor) -> torch.Tensor:
    """Tokens of the nodes ``child [B, N + 1]`` (-1: none; its token is then 0, never used)."""
    batch = child.shape[0]
    return tree.tokens.gather(1, child.clamp_min(0).view(batch, -1)).view_as(child) if tree.tokens.shape[1] else \
        torch.zeros_like(child)


def greedy_tree_accept(tree: DraftTree, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the root, follow the child equal to the verifier's argmax while there is one; then its own token.

    Args:
        tree: the drafted tree ``[B, N]``.
        scores: ``[B, N + 1, vocab]`` processed verifier scores.
    """
    table, depth = tree.child_table(scores.device)
    target = scores.argmax(dim=-1)  # [B, N + 1]
    chosen = torch.full_like(target, -1)
    for j in range(table.shape[2]):  # the first child (in index order) equal to the argmax
        child = table[..., j]
        hit = (child >= 0) & (chosen < 0) & (_child_tokens(tree, child) == target)
        chosen = torch.where(hit, child, chosen)
    accepted, path, end = _walk(chosen, depth)
    return accepted, commit_tokens(tree, path, accepted, target.gather(1, end.unsqueeze(1)).squeeze(1)), path


def residual(p: torch.Tensor, q: torch.Tensor | None, token: torch.Tensor | int) -> torch.Tensor:
    """The distribution left after draft ``token`` (drawn from ``q``; ``None``: deterministic) was rejected:
    ``norm(max(0, p - q))``. With a deterministic draft that is ``p`` without ``token``, renormalised.
    Batched: ``p`` / ``q`` ``[..., V]``, ``token`` ``[...]`` (or one int for a single ``[V]``)."""
    if q is None:
        if isinstance(token, int):
            left = p.clone()
            left[..., token] = 0
        else:
            left = p.scatter(-1, token.unsqueeze(-1), 0.0)
    else:
        left = (p - q).clamp_min(0)
    mass = left.sum(dim=-1, keepdim=True)
    # zero mass means p == q, where a rejection cannot happen; keep p
    return torch.where(mass > 0, left / mass.clamp_min(torch.finfo(p.dtype).tiny), p)


def tree_rejection_accept(tree: DraftTree, target_probs: torch.Tensor,
                          generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Multi-draft rejection sampling down the tree (SpecInfer, Miao et al. 2024; EAGLE's tree sampling).

    At a node whose distribution is ``p``, its children are tried in order: child ``x`` (drawn from ``q``,
    or deterministic) is accepted with probability ``min(1, p(x) / q(x))``; after a rejection ``p``
    becomes the residual ``norm(max(0, p - q))`` for the next sibling. If a child is accepted the walk
    continues from it with the verifier's distribution there; if all are rejected (or the node is a leaf)
    the committed token is drawn from the current ``p``. Every committed token is distributed exactly
    as the verifier's ``p``, provided siblings are deterministic given the context or drawn i.i.d. from ``q``.

    Every node's trials are run at once (one uniform per (node, child), drawn up front: the walk uses those of
    the nodes it visits, each independent, so the law is that of trying them one by one), then the walk follows
    the accepted children and draws the last token from the residual where it stopped.

    Args:
        tree: the drafted tree; ``tree.probs [B, N, V]`` or ``None`` (deterministic nodes).
        target_probs: ``[B, N + 1, V]`` the verifier's processed probabilities.
        generator: optional RNG for reproducible runs.
    """
    device = target_probs.device
    table, depth = tree.child_table(device)
    batch, positions, vocab = target_probs.shape
    u = torch.rand(batch, positions, table.shape[2], generator=generator, device=device, dtype=target_probs.dtype)
    p = target_probs
    chosen = torch.full((batch, positions), -1, dtype=torch.long, device=device)
    for j in range(table.shape[2]):  # sibling rank j of every node at once
        child = table[..., j]
        live = (child >= 0) & (chosen < 0)  # a node with a j-th child that rejected all before it
        x = _child_tokens(tree, child)
        p_x = p.gather(2, x.unsqueeze(2)).squeeze(2)
        if tree.probs is None:
            q, q_x = None, torch.ones_like(p_x)
        else:
            q = tree.probs.gather(1, child.clamp_min(0).unsqueeze(2).expand(-1, -1, vocab))
            q_x = q.gather(2, x.unsqueeze(2)).squeeze(2)
        hit = live & (u[..., j] * q_x < p_x)  # u < p/q without dividing by a q that may be 0
        chosen = torch.where(hit, child, chosen)
        p = torch.where((live & ~hit).unsqueeze(2), residual(p, q, x), p)
    accepted, path, end = _walk(chosen, depth)
    last = torch.multinomial(p.gather(1, end.view(batch, 1, 1).expand(-1, 1, vocab)).squeeze(1), 1,
                             generator=generator).squeeze(1)
    return accepted, commit_tokens(tree, path, accepted, last), path
