"""Growing a draft tree from any drafter that scores a frontier of nodes in one pass (heads, model drafters).

The drafter supplies the root's logits and an ``expand`` callback; this module decides which nodes to
feed and which to keep: static trees (paths of top-k ranks) or dynamic ones (EAGLE-2: expand the
``top_k`` best frontier nodes by cumulative draft log-probability, keep the best ``total_tokens``).
Nodes fed to the drafter get *feed positions* ``0, 1, ...`` in feed order; ``expand`` receives, per new
node, which feed positions it may attend to (its fed ancestors and itself), so the drafter can write
them to its cache after its committed slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from specdec.trees.config import TreeConfig
from specdec.trees.sizing import TreeSizer
from specdec.trees.tree import DraftTree

FRONTIER_SHARE = 0.1  # auto feeds a frontier node worth at least this share of the frontier's best

if TYPE_CHECKING:  # trees never import drafters at run time: drafters import trees
    from specdec.protocol import DraftContext, Rows
    from specdec.processing import RowContext


class Expander(Protocol):
    def __call__(self, tokens: torch.Tensor, depth: torch.Tensor, parent_pos: torch.Tensor,
                 visible: torch.Tensor) -> torch.Tensor:
        """Feed frontier nodes ``tokens [B, F]`` at ``depth [B, F]`` (1: a child of the root) whose parents
        were fed at ``parent_pos [B, F]`` (-1: the root); ``visible [B, F, T]`` marks the feed positions
        each may attend to (the last ``F`` are these nodes). Returns their logits ``[B, F, V]`` over the
        verifier's vocabulary."""


@dataclass
class TreeShape:
    """One pass's tree request: the configuration, the depth the call still has room for, and (``auto``)
    the sizer that picks depth and size from measured costs."""

    config: TreeConfig
    room: int
    sizer: TreeSizer | None = None

    @property
    def depth(self) -> int:
        return min(self.config.max_depth, self.room)

    def keep_expanding(self, depth_done: int, values: list[float], frontier: list[float], passes: int) -> bool:
        """Whether to run one more depth step (``values``: candidate weights so far, ``frontier``: those of the
        nodes that would be fed; all probabilities)."""
        if depth_done >= self.depth:
            return False
        return self.sizer is None or self.sizer.worth_expanding(values, frontier, passes)

    def select(self, values: list[float], passes: int) -> int:
        """How many of the candidates (``values`` sorted best first: weights under ``auto``) to verify."""
        if self.sizer is None:
            return min(self.config.total_tokens, len(values))
        return self.sizer.select(values, passes)

    def weights(self, parents: list[int], values: list[float]) -> list[float]:
        """What the nodes of one row's host-built tree are worth for ranking and sizing: ``auto``'s calibrated
        acceptance (:meth:`TreeSizer.weights`), else the cumulative draft probabilities themselves."""
        return values if self.sizer is None else self.sizer.weights(parents, values)


@dataclass
class GrownTree:
    """The tree and, per kept node, the feed position it got in the drafter's cache (-1: not fed)."""

    tree: DraftTree
    fed: torch.LongTensor  # [B, N]


class _Candidates:
    """Candidate nodes of a batch of trees, all rows the same count (tensors [B, C]). ``val``: cumulative draft
    log-probabilities; ``w``: log-weights that rank them (``val`` itself unless ``auto``'s sizer calibrates)."""

    def __init__(self, batch: int, slots: int, device: torch.device, sizer: TreeSizer | None = None) -> None:
        self.device = device
        self.sizer = sizer
        self.tok = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.par = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.val = torch.zeros(batch, 0, dtype=torch.float32, device=device)
        self.w = torch.zeros(batch, 0, dtype=torch.float32, device=device)
        self.depth = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.fed = torch.zeros(batch, 0, dtype=torch.long, device=device)
        self.vis = torch.zeros(batch, 0, slots, dtype=torch.bool, device=device)
        self.fed_count = 0
        self.passes = 0

    def add(self, tok: torch.Tensor, par: torch.Tensor, val: torch.Tensor,
            rank: torch.Tensor | None = None) -> torch.Tensor:
        """Append children ``[B, M]`` of candidates ``par`` (-1: root), ``rank`` among their siblings (needed
        with a sizer); returns their candidate ids ``[B, M]``."""
        batch, m = tok.shape
        start = self.tok.shape[1]
        root = par < 0
        safe = par.clamp_min(0)
        depth = torch.where(root, 1, self.depth.gather(1, safe) + 1) if start else torch.ones_like(par)
        vis = self.vis.gather(1, safe[..., None].expand(-1, -1, self.vis.shape[2])) if start else \
            torch.zeros(batch, m, self.vis.shape[2], dtype=torch.bool, device=self.device)
        vis = vis & ~root[..., None]
        val = val.float()
        w = val
        if self.sizer is not None:  # the parent's weight times the edge's calibrated acceptance
            parent_val = torch.where(root, 0.0, self.val.gather(1, safe)) if start else torch.zeros_like(val)
            parent_w = torch.where(root, 0.0, self.w.gather(1, safe)) if start else torch.zeros_like(val)
            w = (parent_w + self.sizer.log_acceptance(rank, val - parent_val)).nan_to_num(nan=float("-inf"))
        self.w = torch.cat([self.w, w], 1)
        self.tok, self.par = torch.cat([self.tok, tok], 1), torch.cat([self.par, par], 1)
        self.val, self.depth = torch.cat([self.val, val], 1), torch.cat([self.depth, depth], 1)
        self.fed = torch.cat([self.fed, torch.full_like(tok, -1)], 1)
        self.vis = torch.cat([self.vis, vis], 1)
        return torch.arange(start, start + m, device=self.device).expand(batch, m)

    def feed(self, nodes: torch.Tensor, expand: Expander) -> torch.Tensor:
        """Run ``expand`` on candidates ``nodes [B, F]``; returns their logits ``[B, F, V]``."""
        batch, f = nodes.shape
        pos = torch.arange(self.fed_count, self.fed_count + f, device=self.device).expand(batch, f)
        self.fed.scatter_(1, nodes, pos)
        rows = torch.arange(batch, device=self.device)[:, None]
        self.vis[rows, nodes, pos] = True
        self.fed_count += f
        self.passes += 1
        parent = self.par.gather(1, nodes)
        parent_pos = torch.where(parent < 0, -1, self.fed.gather(1, parent.clamp_min(0)))
        visible = self.vis[rows, nodes][:, :, : self.fed_count]
        return expand(self.tok.gather(1, nodes), self.depth.gather(1, nodes), parent_pos, visible)

    def tree(self, chosen: torch.Tensor) -> GrownTree:
        """The tree of candidates ``chosen [B, N]`` (ancestor-closed; any order)."""
        chosen = chosen.sort(dim=1).values  # creation order is topological
        batch, n = chosen.shape
        new_index = torch.full((batch, self.tok.shape[1] + 1), -1, dtype=torch.long, device=self.device)
        new_index.scatter_(1, chosen + 1, torch.arange(n, device=self.device).expand(batch, n))
        parents = new_index.gather(1, self.par.gather(1, chosen) + 1)
        tree = DraftTree(self.tok.gather(1, chosen), None, parents=parents, values=self.val.gather(1, chosen).exp())
        return GrownTree(tree, self.fed.gather(1, chosen))


def grow_tree(root_logits: torch.Tensor, expand: Expander, shape: TreeShape, rows: "Rows", ctx: "DraftContext",
              score: Callable[[torch.Tensor, list["RowContext"]], torch.Tensor]) -> GrownTree:
    """Grow one tree per row from ``root_logits [B, V]`` (static or dynamic per ``shape``).

    ``score(logits [M, V], contexts)`` turns draft logits into the scores children are ranked by (the
    call's processors applied with each node's ``(row owner, context)``); children are the top-ranked tokens, so the
    tree is deterministic given the context and sampling stays exact with one-hot ``q``.
    """
    batch, device = root_logits.shape[0], root_logits.device
    config = shape.config
    cands = _Candidates(batch, config.max_fed, device, shape.sizer)

    def logprobs(logits: torch.Tensor, nodes: torch.Tensor | None) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        contexts = _contexts(rows, cands, nodes) if ctx.processors else [None] * flat.shape[0]
        return torch.log_softmax(score(flat, contexts), dim=-1).view(*logits.shape[:-1], -1)

    root = logprobs(root_logits.unsqueeze(1), None)[:, 0]
    if config.mode == "static":
        return _static(root, cands, expand, shape, logprobs)
    k = config.top_k
    v, t = root.topk(k, dim=-1)
    ranks = torch.arange(k, device=device)
    frontier = _worthy(cands, cands.add(t, torch.full_like(t, -1), v, ranks.expand(batch, k)))
    depth = 1
    # the drafter's passes this proposal: the one that gave the root's logits, then one per depth fed
    while shape.keep_expanding(depth, _sorted(cands.w), _probs(cands.w.gather(1, frontier)), cands.passes + 1):
        lp = logprobs(cands.feed(frontier, expand), frontier)  # [B, F, V]
        v, t = lp.topk(k, dim=-1)
        cum = cands.val.gather(1, frontier).unsqueeze(-1) + v
        ids = cands.add(t.flatten(1), frontier.unsqueeze(-1).expand(-1, -1, k).flatten(1), cum.flatten(1),
                        ranks.repeat(frontier.shape[1]).expand(batch, -1))
        best = cands.w.gather(1, ids).topk(min(k, ids.shape[1]), dim=-1).indices
        frontier = _worthy(cands, ids.gather(1, best))
        depth += 1
    finite = int(torch.isfinite(cands.w).sum(dim=1).min())
    n = min(shape.select(_sorted(cands.w), cands.passes + 1), finite)
    order = cands.w.sort(dim=1, descending=True, stable=True).indices  # ties: parents (earlier) first
    return cands.tree(order[:, :n])


def _static(root: torch.Tensor, cands: _Candidates, expand: Expander, shape: TreeShape,
            logprobs: Callable) -> GrownTree:
    """Static tree: nodes at depth ``d`` are the ranked children of their depth ``d - 1`` parents, one pass a depth."""
    batch, device = root.shape[0], root.device
    choices = sorted((c for c in shape.config.choices if len(c) <= shape.depth), key=lambda c: (len(c), c))
    ids: dict[tuple[int, ...], int] = {}
    ranked = {(): root.topk(_width(choices, ()), dim=-1)}  # one topk per parent: ranks are distinct tokens
    for d in range(1, max((len(c) for c in choices), default=0) + 1):
        level = [c for c in choices if len(c) == d]
        if d > 1:  # feed this depth's parents in one pass
            parents = sorted({c[:-1] for c in level})
            nodes = torch.tensor([ids[p] for p in parents], dtype=torch.long, device=device).expand(batch, -1)
            lp = logprobs(cands.feed(nodes, expand), nodes)
            ranked = {p: lp[:, j].topk(_width(choices, p), dim=-1) for j, p in enumerate(parents)}
        for path in level:
            v, t = ranked[path[:-1]]
            parent = ids[path[:-1]] if d > 1 else -1
            base = cands.val[:, parent] if d > 1 else torch.zeros(batch, device=device)
            par = torch.full((batch, 1), parent, dtype=torch.long, device=device)
            rank = path[-1]
            ids[path] = int(cands.add(t[:, rank : rank + 1], par, (base + v[:, rank]).unsqueeze(1))[0, 0])
    chosen = torch.arange(cands.tok.shape[1], device=device).expand(batch, -1)
    return cands.tree(chosen)


def _worthy(cands: _Candidates, frontier: torch.Tensor) -> torch.Tensor:
    """``auto``: the frontier (best first) without the nodes worth less than ``FRONTIER_SHARE`` of its best in every
    row. Feeding them costs drafter time (the int8 self-copy's frontier pass, 8 nodes wide, was learnt at 27-29 ms on
    this CPU, 0.8 of a one-token verify pass) for children a calibrated drafter says will not be accepted; a
    confident drafter grows a chain."""
    if cands.sizer is None or frontier.shape[1] <= 1:
        return frontier
    w = cands.w.gather(1, frontier)
    keep = int((w >= w[:, :1] + math.log(FRONTIER_SHARE)).sum(dim=1).max())
    return frontier[:, : max(keep, 1)]


def _width(choices: list[tuple[int, ...]], parent: tuple[int, ...]) -> int:
    """How many ranked children of ``parent`` the static tree uses."""
    return max((c[-1] + 1 for c in choices if c[:-1] == parent), default=1)



def _sorted(values: torch.Tensor) -> list[float]:
    """Candidate log-weights ``[B, C]`` as probabilities, best first, averaged over rows."""
    return _probs(values.sort(dim=1, descending=True).values)


def _probs(values: torch.Tensor) -> list[float]:
    return values.exp().mean(dim=0).tolist()


def _contexts(rows: "Rows", cands: _Candidates, nodes: torch.Tensor | None) -> list["RowContext"]:
    """Each node's context for the logits processors: its row's owner, and its row then the tokens on its path."""
    if nodes is None:
        return rows.contexts()
    par, tok = cands.par.tolist(), cands.tok.tolist()
    out = []
    for b, row in enumerate(rows):
        for node in nodes[b].tolist():
            path = []
            while node >= 0:
                path.append(tok[b][node])
                node = par[b][node]
            out.append((rows.owners[b], torch.cat([row, torch.tensor(path[::-1], dtype=torch.long, device=row.device)])))
    return out
