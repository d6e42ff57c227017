"""Traversal verification (Weng et al., NeurIPS 2025, arXiv 2505.12398): a sampled tree judged leaf first.

Per-node rejection sampling (:func:`specdec.trees.accept.tree_rejection_accept`) decides top-down: once a node is
rejected its subtree is gone. Traversal verification walks the tree in post-order instead (a node's subtree before
the node), and weighs a whole path, not one token: node ``c`` under ``X`` gets the weight
``a(c) = min(1, a(X) P_X(c) / Q_c(c))`` (``a(root) = 1``, ``P_X`` the verifier's distribution after ``X``, ``Q_c`` the
law ``c`` was drawn from). A node whose children are all gone is a leaf: it is accepted with probability ``a``, the
walk ends there and the token after it is drawn from ``P`` at that node. A rejected node hands its parent ``X`` the
block residual: ``P_X <- norm(max(0, a(X) P_X - Q_c))``, ``a(X) <- Z / (Z + 1 - a(X))`` with
``Z = sum max(0, a(X) P_X - Q_c)``. On a chain this is block verification (:func:`specdec.acceptance.block_accept`).

Exact (every committed token follows the verifier) when each child was drawn from the law the tree gives it, given
its earlier siblings and nothing later: top-ranked children (``tree.probs is None``: one-hot laws), or children
sampled without replacement in index order (each with its own renormalised law, ``tree.probs``). The proof is
block verification's, by induction over a node's children: a node of weight ``a`` ends accepted with probability
``a``, and then its next token follows ``P``.

Every row runs at once on the device: the post-order walk is a host-built list of events per row (enter a node:
weigh it; leave it: test it, and on a rejection update its parent), padded to one length, with one uniform per
event drawn up front; a row that has accepted ignores the rest. Nothing is read back.
"""

from __future__ import annotations

import torch

from specdec.transfer import upload
from specdec.trees.accept import commit_tokens
from specdec.trees.tree import DraftTree

_PAD, _ENTER, _LEAVE = 0, 1, 2


def _events(tree: DraftTree) -> tuple[list[list[int]], list[list[int]]]:
    """Per row the post-order walk over its valid nodes as verify positions (0: the root, ``i + 1``: node ``i``) and
    event kinds, padded to one length: enter a node, its subtree's events, leave it; the root is left last."""
    positions, kinds = [], []
    for b in range(tree.tokens.shape[0]):
        kids = tree.children(b)
        pos, kind = [], []

        def walk(node: int) -> None:  # node: -1 the root, else a node index
            for child in kids.get(node, []):
                pos.append(child + 1)
                kind.append(_ENTER)
                walk(child)
                pos.append(child + 1)
                kind.append(_LEAVE)

        walk(-1)
        positions.append(pos + [0])
        kinds.append(kind + [_LEAVE])
    width = max(len(p) for p in positions)
    return ([p + [0] * (width - len(p)) for p in positions], [k + [_PAD] * (width - len(k)) for k in kinds])


def traversal_accept(tree: DraftTree, target_probs: torch.Tensor,
                     generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Traversal verification of ``tree`` (see the module docstring).

    Args:
        tree: the drafted tree; ``tree.probs [B, N, V]`` the law each node was drawn from, or ``None`` (top-ranked,
            deterministic nodes).
        target_probs: ``[B, N + 1, V]`` the verifier's processed probabilities (position 0: after the root).
        generator: optional RNG for reproducible runs.

    Returns:
        ``(accepted [B], tokens [B, D + 1], path [B, D])`` as :func:`specdec.trees.accept.tree_rejection_accept`.
    """
    device, dtype = target_probs.device, target_probs.dtype
    batch, positions, vocab = target_probs.shape
    depth = max((d for _, d in tree.scored()), default=0)
    pos_host, kind_host = _events(tree)
    steps = len(pos_host[0])
    ev_pos = upload(pos_host, torch.long, device).view(batch, steps)
    ev_kind = upload(kind_host, torch.long, device).view(batch, steps)
    parents = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), tree.parents + 1], dim=1)  # positions
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), tree.tokens], dim=1)
    u = torch.rand(batch, steps, generator=generator, device=device, dtype=dtype)
    rows = torch.arange(batch, device=device)

    p = target_probs.clone()  # each position's P, a parent's replaced by its residual as children are rejected
    weight = torch.ones(batch, positions, dtype=dtype, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    end = torch.zeros(batch, dtype=torch.long, device=device)
    for t in range(steps):
        kinds = {row[t] for row in kind_host}  # host ints: steps no row leaves on skip the residual's V-wide work
        pos, kind = ev_pos[:, t], ev_kind[:, t]
        par = parents.gather(1, pos.unsqueeze(1)).squeeze(1)
        x = tokens.gather(1, pos.unsqueeze(1)).squeeze(1)
        a_par = weight[rows, par]
        live = ~done & (kind != _PAD)
        if _ENTER in kinds:
            p_x = p[rows, par, x]
            q_x = torch.ones_like(p_x) if tree.probs is None else tree.probs[rows, (pos - 1).clamp_min(0), x].to(dtype)
            ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(torch.finfo(dtype).tiny), torch.zeros_like(p_x))
            weight[rows, pos] = torch.where(live & (kind == _ENTER), (a_par * ratio).clamp(max=1.0), weight[rows, pos])
        if _LEAVE not in kinds:
            continue
        leaving = live & (kind == _LEAVE)
        hit = leaving & ((pos == 0) | (u[:, t] < weight[rows, pos]))  # the root, its children all gone, is kept
        done, end = done | hit, torch.where(hit, pos, end)
        rejected = leaving & ~hit
        p_par, q = p[rows, par], _law(tree, pos, x, vocab, dtype)  # [B, V]: q the law the node was drawn from
        left = (a_par.unsqueeze(1) * p_par - q).clamp_min(0)
        mass = left.sum(dim=1)
        over = (q - a_par.unsqueeze(1) * p_par).clamp_min(0).sum(dim=1)  # = mass + 1 - a(X)
        new_p = torch.where((mass > 0).unsqueeze(1), left / mass.clamp_min(torch.finfo(dtype).tiny).unsqueeze(1), p_par)
        new_a = torch.where(over > 0, mass / over.clamp_min(torch.finfo(dtype).tiny), torch.ones_like(mass))
        p[rows, par] = torch.where(rejected.unsqueeze(1), new_p, p_par)
        weight[rows, par] = torch.where(rejected, new_a.clamp(max=1.0), a_par)
    last = torch.multinomial(p[rows, end], 1, generator=generator).squeeze(1)
    accepted, path = _path(tree, end, depth)
    return accepted, commit_tokens(tree, path, accepted, last), path


def _law(tree: DraftTree, pos: torch.Tensor, x: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, V]``: the law each row's node at verify position ``pos`` was drawn from (one-hot on ``x`` for
    deterministic nodes, and at the root, where it is never used)."""
    if tree.probs is not None:
        node = (pos - 1).clamp_min(0)
        law = tree.probs.gather(1, node.view(-1, 1, 1).expand(-1, 1, vocab)).squeeze(1).to(dtype)
        return torch.where((pos > 0).unsqueeze(1), law, torch.zeros_like(law).scatter_(1, x.unsqueeze(1), 1.0))
    return torch.zeros(x.shape[0], vocab, dtype=dtype, device=x.device).scatter_(1, x.unsqueeze(1), 1.0)


def _path(tree: DraftTree, end: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accepted [B], path [B, depth])``: the root-to-``end`` path (verify position ``end``) as node indices, -1 past
    it, from the tree's host-built path index."""
    batch = end.shape[0]
    if depth == 0:
        return torch.zeros(batch, dtype=torch.long, device=end.device), \
            torch.zeros(batch, 0, dtype=torch.long, device=end.device)
    index, lengths = tree.path_index(end.device)  # [B, N, W]
    length = upload(lengths, torch.long, end.device).view(batch, -1)
    node = (end - 1).clamp_min(0)
    steps = index.gather(1, node.view(batch, 1, 1).expand(-1, 1, index.shape[2])).squeeze(1)  # [B, W]
    accepted = torch.where(end > 0, length.gather(1, node.unsqueeze(1)).squeeze(1), 0)
    steps = torch.cat([steps, steps.new_zeros(batch, max(0, depth - steps.shape[1]))], dim=1)[:, :depth]
    path = torch.where(torch.arange(depth, device=end.device) < accepted.unsqueeze(1), steps, -1)
    return accepted, path
