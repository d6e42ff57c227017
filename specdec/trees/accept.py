"""Acceptance over a draft tree: the longest root-to-node path the verifier agrees with.

Scores come from one verifier pass over ``[root, node_1 .. node_N]`` (position 0 is the row's newest
committed token; position ``i + 1`` is node ``i``), each position predicting the token after it. Both rules
return ``(accepted [B], tokens [B, D + 1], path [B, D])``: the accepted path's node indices (-1 past
``accepted[b]``) and the tokens to commit (the path's tokens, then the verifier's own), as the chain
rules in :mod:`specdec.acceptance` do for a chain.
"""

from __future__ import annotations

import torch

from specdec.trees.tree import DraftTree


def _pack(paths: list[list[int]], outs: list[list[int]], device: torch.device) -> tuple[torch.Tensor, ...]:
    depth = max(len(p) for p in paths)
    accepted = torch.tensor([len(p) for p in paths], dtype=torch.long, device="cpu")
    path = torch.full((len(paths), depth), -1, dtype=torch.long, device="cpu")
    tokens = torch.zeros(len(paths), depth + 1, dtype=torch.long, device="cpu")
    for b, (p, o) in enumerate(zip(paths, outs)):
        path[b, : len(p)] = torch.tensor(p, dtype=torch.long, device="cpu")
        tokens[b, : len(o)] = torch.tensor(o, dtype=torch.long, device="cpu")
    return accepted.to(device), tokens.to(device), path.to(device)


def greedy_tree_accept(tree: DraftTree, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the root, follow the child equal to the verifier's argmax while there is one; then its own token.

    Args:
        tree: the drafted tree ``[B, N]``.
        scores: ``[B, N + 1, vocab]`` processed verifier scores.
    """
    target = scores.argmax(dim=-1).tolist()
    tokens = tree.tokens.tolist()
    paths, outs = [], []
    for b in range(len(target)):
        kids, node, path, out = tree.children(b), -1, [], []
        while True:
            want = target[b][node + 1]
            out.append(want)
            node = next((c for c in kids.get(node, ()) if tokens[b][c] == want), None)
            if node is None:
                break
            path.append(node)
        paths.append(path)
        outs.append(out)
    return _pack(paths, outs, scores.device)


def residual(p: torch.Tensor, q: torch.Tensor | None, token: int) -> torch.Tensor:
    """The distribution left after draft ``token`` (drawn from ``q``; ``None``: deterministic) was rejected:
    ``norm(max(0, p - q))``. With a deterministic draft that is ``p`` without ``token``, renormalised."""
    if q is None:
        left = p.clone()
        left[token] = 0
    else:
        left = (p - q).clamp_min(0)
    mass = left.sum()
    # zero mass means p == q, where a rejection cannot happen; keep p
    return left / mass if bool(mass > 0) else p


def tree_rejection_accept(tree: DraftTree, target_probs: torch.Tensor,
                          generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Multi-draft rejection sampling down the tree (SpecInfer, Miao et al. 2024; EAGLE's tree sampling).

    At a node whose distribution is ``p``, its children are tried in order: child ``x`` (drawn from ``q``,
    or deterministic) is accepted with probability ``min(1, p(x) / q(x))``; after a rejection ``p``
    becomes the residual ``norm(max(0, p - q))`` for the next sibling. If a child is accepted the walk
    continues from it with the verifier's distribution there; if all are rejected (or the node is a leaf)
    the committed token is drawn from the current ``p``. Every committed token is distributed exactly
    as the verifier's ``p``, provided siblings are deterministic given the context or drawn i.i.d. from ``q``.

    Args:
        tree: the drafted tree; ``tree.probs [B, N, V]`` or ``None`` (deterministic nodes).
        target_probs: ``[B, N + 1, V]`` the verifier's processed probabilities.
        generator: optional RNG for reproducible runs.
    """
    tokens = tree.tokens.tolist()
    device = target_probs.device
    paths, outs = [], []
    for b in range(target_probs.shape[0]):
        kids, node, path, out = tree.children(b), -1, [], []
        p = target_probs[b, 0]
        while True:
            chosen = None
            for child in kids.get(node, ()):
                x = tokens[b][child]
                q = None if tree.probs is None else tree.probs[b, child]
                q_x = 1.0 if q is None else q[x]
                u = torch.rand((), generator=generator, device=device, dtype=p.dtype)
                if bool(u * q_x < p[x]):  # u < p/q without dividing by a q that may be 0
                    chosen = child
                    break
                p = residual(p, q, x)
            if chosen is None:
                out.append(int(torch.multinomial(p, 1, generator=generator)))
                break
            path.append(chosen)
            out.append(tokens[b][chosen])
            node, p = chosen, target_probs[b, chosen + 1]
        paths.append(path)
        outs.append(out)
    return _pack(paths, outs, device)
