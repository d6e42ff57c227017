"""Growing a draft tree from any drafter that scores a frontier of nodes in one pass (heads, model drafters).

The drafter supplies the root's logits and an ``expand`` callback; this module decides which nodes to
feed and which to keep: static trees (paths of top-k ranks) or dynamic ones (EAGLE-2: expand the
``top_k`` best frontier nodes by cumulative draft log-probability, keep the best ``total_tokens``).
Nodes fed to the drafter get *feed positions* ``0, 1, ...`` in feed order; ``expand`` receives, per new
node, which feed positions it may attend to (its fed ancestors and itself), so the drafter can write
them to its cache after its committed slots.

Host-device syncs (issue 43): growing reads nothing back from the device. A static tree's shape is known before
drafting (:func:`_static_plan`, on the host) and only its tokens are data, so it is never read; a dynamic tree's
shape is data, read once when it is chosen (:func:`_choose`). ``auto`` also reads the weights it sizes by.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from specdec.transfer import upload
from specdec.trees.config import TreeConfig
from specdec.trees.auto import TreeSizer
from specdec.trees.tree import DraftTree, reads_context

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
    """One pass's tree request: the configuration, the depth the call still has room for, (``auto``) the sizer that
    picks depth and size from measured costs, and whether children are sampled (a fixed shape only: see
    :func:`grow_tree`)."""

    config: TreeConfig
    room: int
    sizer: TreeSizer | None = None
    sample: bool = False

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
    """The tree and, per kept node, the feed position it got in the drafter's cache (-1: not fed), host ints."""

    tree: DraftTree
    fed: list[list[int]]  # [B][N]


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


def grow_tree(root_logits: torch.Tensor, expand: Expander, shape: TreeShape, rows: "Rows", ctx: "DraftContext",
              score: Callable[[torch.Tensor, list["RowContext"]], torch.Tensor]) -> GrownTree:
    """Grow one tree per row from ``root_logits [B, V]`` (static or dynamic per ``shape``).

    ``score(logits [M, V], contexts)`` turns draft logits into the scores children are ranked by (the
    call's processors applied with each node's ``(row owner, context)``); children are the top-ranked tokens, so the
    tree is deterministic given the context and sampling stays exact with one-hot ``q``. With ``shape.sample`` (a
    fixed shape under sampling: its nodes do not depend on what was drawn) a node's children are drawn from its
    processed ``q`` without replacement instead (:func:`_children`), and the tree carries each child's law
    (``tree.probs``), which every tree rule reads.
    """
    batch, device = root_logits.shape[0], root_logits.device
    config = shape.config
    cands = _Candidates(batch, config.max_fed, device, shape.sizer)
    reads = reads_context(ctx.processors, rows.owners)

    def logprobs(logits: torch.Tensor, nodes: torch.Tensor | None, depth: int) -> torch.Tensor:
        """Log-probabilities of the children of ``nodes`` (all at ``depth``: a frontier is one depth)."""
        flat = logits.reshape(-1, logits.shape[-1])
        contexts = _contexts(rows, cands, nodes, depth, reads) if ctx.processors else [None] * flat.shape[0]
        return torch.log_softmax(score(flat, contexts), dim=-1).view(*logits.shape[:-1], -1)

    root = logprobs(root_logits.unsqueeze(1), None, 0)[:, 0]
    if config.tree_mode.grows_paths:
        return _static(root, cands, expand, shape, logprobs, ctx.generator)
    k = config.top_k
    v, t = root.topk(k, dim=-1)
    ranks = torch.arange(k, device=device)
    frontier = _worthy(cands, cands.add(t, torch.full_like(t, -1), v, ranks.expand(batch, k)))
    depth = 1

    def more() -> bool:
        """One more depth? Up to the requested depth; ``auto`` asks its sizer (reading the weights: a sync)."""
        if depth >= shape.depth:
            return False
        # the drafter's passes this proposal: the one that gave the root's logits, then one per depth fed
        return shape.sizer is None or shape.keep_expanding(depth, _sorted(cands.w),
                                                           _probs(cands.w.gather(1, frontier)), cands.passes + 1)

    while more():
        lp = logprobs(cands.feed(frontier, expand), frontier, depth)  # [B, F, V]
        v, t = lp.topk(k, dim=-1)
        cum = cands.val.gather(1, frontier).unsqueeze(-1) + v
        ids = cands.add(t.flatten(1), frontier.unsqueeze(-1).expand(-1, -1, k).flatten(1), cum.flatten(1),
                        ranks.repeat(frontier.shape[1]).expand(batch, -1))
        best = cands.w.gather(1, ids).topk(min(k, ids.shape[1]), dim=-1).indices
        frontier = _worthy(cands, ids.gather(1, best))
        depth += 1
    return _choose(cands, shape)


def _choose(cands: _Candidates, shape: TreeShape) -> GrownTree:
    """A dynamic tree: the best candidates by weight (ties: parents, created earlier, first), as many as the shape
    asks and every row has finite weights for. Its structure is data: read here in one device read (with the
    tokens and feed positions), so that everything after it runs on host ints."""
    batch, count = cands.tok.shape
    order = cands.w.sort(dim=1, descending=True, stable=True).indices
    finite = torch.isfinite(cands.w).sum(dim=1, keepdim=True)
    host = torch.cat([order, cands.tok, cands.par, cands.fed, finite], dim=1).tolist()  # the tree's one read
    n = shape.select(_sorted(cands.w), cands.passes + 1) if shape.sizer is not None else \
        min(shape.config.total_tokens, count)
    n = min(n, min(row[-1] for row in host))
    chosen, tokens, parents, fed = [], [], [], []
    for row in host:
        tok, par, pos = row[count : 2 * count], row[2 * count : 3 * count], row[3 * count : 4 * count]
        nodes = sorted(row[:n])  # creation order is topological
        index = {c: i for i, c in enumerate(nodes)}
        chosen.append(nodes)
        tokens.append([tok[c] for c in nodes])
        parents.append([index.get(par[c], -1) for c in nodes])
        fed.append([pos[c] for c in nodes])
    picked = upload(chosen, torch.long, cands.device).view(batch, n)
    tree = DraftTree.from_host(cands.tok.gather(1, picked), parents, values=cands.val.gather(1, picked).exp(),
                               host_tokens=tokens)
    return GrownTree(tree, fed)


@functools.lru_cache(maxsize=64)
def _static_plan(choices: tuple[tuple[int, ...], ...]) -> tuple[list[int], list[tuple[int, ...]], list[int], list[int]]:
    """A static tree's shape, on the host before drafting (only its tokens are data).

    Returns ``(ints, levels, parents, fed)``. ``levels``, per depth: ``(fed_at, fed_n, width, pick_at, n, par_at)``,
    offsets into ``ints`` (uploaded once per tree) of the candidates fed to expand that depth (none at depth 1), of
    each of its ``n`` nodes' index into its parents' flattened top-``width`` children ``[P * width]``, and of each
    node's parent. ``parents`` / ``fed``: every node's parent (-1: the root) and feed position (-1: not fed). Nodes
    are numbered by (depth, path), their parents fed in path order, as one ``add`` per path would."""
    ordered = sorted(choices, key=lambda c: (len(c), c))
    ids: dict[tuple[int, ...], int] = {}
    ints: list[int] = []
    levels: list[tuple[int, ...]] = []
    parents: list[int] = []
    fed: list[int] = []
    fed_count = 0
    for d in range(1, max((len(c) for c in ordered), default=0) + 1):
        level = [c for c in ordered if len(c) == d]
        heads = sorted({c[:-1] for c in level})
        feed = [ids[h] for h in heads] if d > 1 else []
        for j, node in enumerate(feed):
            fed[node] = fed_count + j
        fed_count += len(feed)
        slot = {h: j for j, h in enumerate(heads)}
        width = max(c[-1] + 1 for c in level)  # one top-k per depth: the first ranks of a wider one are the same
        par = [ids[c[:-1]] if d > 1 else -1 for c in level]
        fed_at = len(ints)
        ints += feed
        pick_at = len(ints)
        ints += [slot[c[:-1]] * width + c[-1] for c in level]
        par_at = len(ints)
        ints += par
        levels.append((fed_at, len(feed), width, pick_at, len(level), par_at))
        for c, p in zip(level, par):
            ids[c] = len(parents)
            parents.append(p)
            fed.append(-1)
    return ints, levels, parents, fed


def _static(root: torch.Tensor, cands: _Candidates, expand: Expander, shape: TreeShape,
            logprobs: Callable, generator: torch.Generator | None = None) -> GrownTree:
    """Static tree: nodes at depth ``d`` are the ranked (or, with ``shape.sample``, drawn) children of their depth
    ``d - 1`` parents, one pass a depth. Its shape comes from the host (:func:`_static_plan`): nothing is read back."""
    batch, device = root.shape[0], root.device
    ints, levels, parents, fed = _static_plan(tuple(c for c in shape.config.choices if len(c) <= shape.depth))
    plan = upload(ints, torch.long, device)  # the whole shape in one upload; each depth slices it (views)
    laws = []
    for d, (fed_at, fed_n, width, pick_at, n, par_at) in enumerate(levels, start=1):
        if d == 1:
            v, t, law = _children(root, width, shape.sample, generator)  # [B, W]
        else:  # feed this depth's parents in one pass
            nodes = plan[fed_at : fed_at + fed_n].expand(batch, -1)
            v, t, law = _children(logprobs(cands.feed(nodes, expand), nodes, d - 1), width, shape.sample, generator)
            v = (cands.val.gather(1, nodes).unsqueeze(-1) + v).flatten(1)  # cumulative log-probabilities
            t = t.flatten(1)
        pick = plan[pick_at : pick_at + n]
        if law is not None:
            laws.append(law.flatten(1, -2).index_select(1, pick))
        cands.add(t.index_select(1, pick), plan[par_at : par_at + n].expand(batch, -1), v.index_select(1, pick))
    tree = DraftTree.from_host(cands.tok, [list(parents) for _ in range(batch)], values=cands.val.exp())
    tree.probs = torch.cat(laws, dim=1) if laws else None
    return GrownTree(tree, [list(fed) for _ in range(batch)])


def _children(logprobs: torch.Tensor, width: int, sample: bool, generator: torch.Generator | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``width`` children of each node from its log-probabilities ``[..., V]``: ``(log-probabilities, tokens, laws)``
    ``[..., W]``. Top-ranked (laws ``None``), or with ``sample`` drawn without replacement (Gumbel top-k: the order of
    the keys is that of drawing one at a time), child ``j``'s law ``[..., W, V]`` being ``q`` without the ``j``
    drawn before it, renormalised (one-hot where those took all of ``q``'s mass: it is then fixed by them)."""
    if not sample:
        return (*logprobs.topk(width, dim=-1), None)
    u = torch.rand(logprobs.shape, generator=generator, device=logprobs.device, dtype=logprobs.dtype)
    keys = logprobs - torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
    tokens = keys.topk(width, dim=-1).indices
    q, laws = logprobs.exp(), []
    for j in range(width):
        mass = q.sum(dim=-1, keepdim=True)
        fixed = torch.zeros_like(q).scatter_(-1, tokens[..., j : j + 1], 1.0)
        laws.append(torch.where(mass > 0, q / mass.clamp_min(torch.finfo(q.dtype).tiny), fixed))
        q = q.scatter(-1, tokens[..., j : j + 1], 0.0)
    return logprobs.gather(-1, tokens), tokens, torch.stack(laws, dim=-2)


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


def _sorted(values: torch.Tensor) -> list[float]:
    """Candidate log-weights ``[B, C]`` as probabilities, best first, averaged over rows."""
    return _probs(values.sort(dim=1, descending=True).values)


def _probs(values: torch.Tensor) -> list[float]:
    return values.exp().mean(dim=0).tolist()


def _contexts(rows: "Rows", cands: _Candidates, nodes: torch.Tensor | None, depth: int,
              reads: bool) -> list["RowContext"]:
    """Each node's context for the logits processors: its row's owner, and its row then the tokens on its path
    (``nodes [B, F]``, all at ``depth``: gathered on the device, no read). ``reads``: whether a processor reads the
    context at all; when none does (temperature, top-k/p), each node gets its row, unread."""
    if nodes is None:
        return rows.contexts()
    f = nodes.shape[1]
    if not reads:
        return [(rows.owners[b], row) for b, row in enumerate(rows) for _ in range(f)]
    steps, node = [], nodes
    for _ in range(depth):  # from the node up to the root's child
        steps.append(cands.tok.gather(1, node))
        node = cands.par.gather(1, node).clamp_min(0)
    path = torch.stack(steps[::-1], dim=2)  # [B, F, depth]
    return [(rows.owners[b], torch.cat([row, path[b, j]])) for b, row in enumerate(rows) for j in range(f)]
