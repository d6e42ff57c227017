"""A batch of draft trees: the proposal a tree drafter returns and the engine verifies in one pass.

Node ``i`` of row ``b`` holds ``tokens[b, i]``; its parent is ``parents[b, i]`` (``-1``: a child of the row's
newest committed token, the *root*), always an earlier node, so index order is topological. Rows may have
different trees: ``valid[b, i]`` marks real nodes, the rest are filler that nothing attends to.

The structure (parents, valid) is also kept on the host: a drafter builds it there (prompt lookup, a static
tree's shape) or reads it once per tree (a dynamic tree), and masks, acceptance tables and cache trimming are
then made from host ints, with no device read (issue 43: at most two host-device syncs per tree pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.processing import CONTEXT_FREE, RowProcessors
from specdec.protocol import Drafts
from specdec.transfer import upload


@dataclass
class DraftTree(Drafts):
    """Draft tokens as a tree: what :meth:`~specdec.drafters.Drafter.propose_tree` returns (a chain's
    :class:`~specdec.drafters.DraftChain` has the same ``tokens`` and ``probs``).

    ``parents [B, N]`` (-1: child of the root), ``valid [B, N]`` (real nodes), ``values [B, N]`` (the
    drafter's estimate that the node is accepted, its cumulative draft probability; for tree sizing),
    ``probs``: ``None`` (deterministic nodes, the usual case: top-k children) or ``[B, N, V]``, the
    distribution each node was sampled from (siblings drawn i.i.d.).

    ``host_parents`` / ``host_valid`` / ``host_tokens``: the same as host lists when the drafter has them (use
    :meth:`from_host`); without them the structure is read back once here (a device sync).
    """

    tokens: torch.LongTensor
    probs: torch.Tensor | None = None
    parents: torch.LongTensor | None = None
    valid: torch.BoolTensor | None = None
    values: torch.Tensor | None = None
    host_parents: list[list[int]] | None = field(default=None, repr=False)
    host_valid: list[list[bool]] | None = field(default=None, repr=False)
    host_tokens: list[list[int]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        batch, n = self.tokens.shape
        if self.parents is None or self.parents.shape != (batch, n):
            raise ValueError(f"a DraftTree needs parents of shape {(batch, n)}")
        if self.valid is None:
            self.valid = torch.ones(batch, n, dtype=torch.bool, device=self.tokens.device)
            if self.host_parents is not None and self.host_valid is None:
                self.host_valid = [[True] * n for _ in range(batch)]
        if self.host_parents is None:  # built from device tensors alone: read the structure once
            self.host_parents, self.host_valid = self.parents.tolist(), self.valid.tolist()
        elif self.host_valid is None:
            self.host_valid = self.valid.tolist()
        if any(p >= i or p < -1 for row in self.host_parents for i, p in enumerate(row)):
            raise ValueError("DraftTree parents must be -1 or an earlier node's index")
        self._parents, self._valid = self.host_parents, self.host_valid

    @classmethod
    def from_host(cls, tokens: torch.LongTensor, parents: list[list[int]], valid: list[list[bool]] | None = None,
                  values: torch.Tensor | None = None, host_tokens: list[list[int]] | None = None) -> "DraftTree":
        """A tree whose structure the caller holds as host lists (uploaded without a sync; never read back)."""
        device = tokens.device
        valid = [[True] * len(row) for row in parents] if valid is None else valid
        width = tokens.shape[1]
        if any(len(row) != width for row in parents):
            raise ValueError(f"a DraftTree needs parents of shape {(tokens.shape[0], width)}")
        return cls(tokens, None, parents=upload(parents, torch.long, device).view(tokens.shape),
                   valid=upload(valid, torch.bool, device).view(tokens.shape), values=values,
                   host_parents=parents, host_valid=valid, host_tokens=host_tokens)

    def scored(self) -> list[tuple[int, int]]:
        """Per row: (real nodes, the deepest real node's depth)."""
        return [(sum(ok), max((d for d, v in zip(depth, ok) if v), default=0))
                for depth, ok in zip(self.depths(), self._valid)]

    def host(self) -> tuple[list[list[int]], list[list[bool]]]:
        """``(parents, valid)`` as host lists (no device sync after construction)."""
        return self._parents, self._valid

    def token_lists(self) -> list[list[int]]:
        """The tokens as host ints: the drafter's copy, else read once (a device sync) and kept."""
        if self.host_tokens is None:
            self.host_tokens = self.tokens.tolist()
        return self.host_tokens

    def depths(self) -> list[list[int]]:
        """Depth of every node (1: a child of the root)."""
        out = []
        for parents in self._parents:
            depth: list[int] = []
            for p in parents:
                depth.append(1 if p < 0 else depth[p] + 1)
            out.append(depth)
        return out

    def paths(self, b: int) -> list[list[int]]:
        """Row ``b``'s root-to-node index paths."""
        paths: list[list[int]] = []
        for i, p in enumerate(self._parents[b]):
            paths.append((paths[p] if p >= 0 else []) + [i])
        return paths

    def children(self, b: int) -> dict[int, list[int]]:
        """Row ``b``'s valid children of each node (``-1``: the root), in index order."""
        kids: dict[int, list[int]] = {}
        for i, (p, ok) in enumerate(zip(self._parents[b], self._valid[b])):
            if ok:
                kids.setdefault(p, []).append(i)
        return kids

    def child_table(self, device: torch.device) -> tuple[torch.Tensor, int]:
        """``(children [B, N + 1, M], depth)``: per verify position (0: the root, ``i + 1``: node ``i``) its valid
        children in index order (-1 past them), uploaded from the host structure; ``depth``: the deepest valid
        node's depth (the most drafts a row can accept). For acceptance walks on the device."""
        kids = [self.children(b) for b in range(len(self._parents))]
        n = self.tokens.shape[1]
        width = max((len(c) for row in kids for c in row.values()), default=0)
        table = [[(row.get(node, []) + [-1] * width)[:width] for node in range(-1, n)] for row in kids]
        depth = max((d for depths, valid in zip(self.depths(), self._valid) for d, ok in zip(depths, valid) if ok),
                    default=0)
        return upload(table, torch.long, device).view(len(kids), n + 1, width), depth

    def verify_inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For a verifier pass over ``[root, nodes]``: ``(depth [B, N+1], tree mask [B, N+1, N+1], valid [B, N+1])``;
        each node sees the root, its ancestors and itself. Built on the host, uploaded without a sync."""
        batch, n = self.tokens.shape
        masks, depths = [], []
        for parents, depth in zip(self._parents, self.depths()):
            rows = [[True] + [False] * n]
            for i, p in enumerate(parents):
                row = list(rows[p + 1])
                row[i + 1] = True
                rows.append(row)
            masks.append(rows)
            depths.append([0] + depth)
        valid = [[True] + row for row in self._valid]
        return (upload(depths, torch.long, device).view(batch, n + 1),
                upload(masks, torch.bool, device).view(batch, n + 1, n + 1),
                upload(valid, torch.bool, device).view(batch, n + 1))

    def path_index(self, device: torch.device) -> tuple[torch.Tensor, list[list[int]]]:
        """``(index [B, N, D], lengths)``: per node its root-to-node path's node indices (0-padded to the deepest,
        ``D``) uploaded, and each path's length on the host: gather ``tokens`` with it for every node's context."""
        batch, n = self.tokens.shape
        paths = [self.paths(b) for b in range(batch)]
        width = max((len(p) for row in paths for p in row), default=1)
        index = [[(p + [0] * width)[:width] for p in row] for row in paths]
        return upload(index, torch.long, device).view(batch, n, width), [[len(p) for p in row] for row in paths]


def reads_context(processors: RowProcessors, owners: list[int]) -> bool:
    """Whether any of these rows' processors reads its context (``input_ids``); the context-free ones
    (temperature, top-k/p, ...) read the scores only, so a tree's per-node contexts need not be built for them."""
    if not processors:
        return False
    return any(not isinstance(p, CONTEXT_FREE) for owner in set(owners) for p in processors.for_row(owner))


class RowTree:
    """One row's tree built on the host, node by node; a child equal to a sibling merges into it (a trie)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.values: list[float] = []
        self._index: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, value: float = 0.0) -> int:
        """Add (or find) the child ``token`` of ``parent``; its value becomes the larger of the two."""
        key = (parent, token)
        if key in self._index:
            i = self._index[key]
            self.values[i] = max(self.values[i], value)
            return i
        self._index[key] = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.values.append(value)
        return len(self.tokens) - 1

    def add_path(self, tokens: list[int], values: list[float] | None = None, parent: int = -1) -> list[int]:
        """Add a chain of ``tokens`` under ``parent``; returns its node indices."""
        nodes = []
        for j, token in enumerate(tokens):
            parent = self.add(parent, token, 0.0 if values is None else values[j])
            nodes.append(parent)
        return nodes

    def best(self, n: int, weights: list[float] | None = None) -> "RowTree":
        """The ``n`` most valuable nodes (by ``weights`` when given, else by value; ties: earlier first),
        re-indexed, keeping their values; ancestor-closed when no child is worth more than its parent."""
        worth = self.values if weights is None else weights
        order = sorted(range(len(self)), key=lambda i: (-worth[i], i))[: max(n, 0)]
        out = RowTree()
        index: dict[int, int] = {}
        for i in sorted(order):
            if self.parents[i] >= 0 and self.parents[i] not in index:
                continue  # its parent was not kept
            index[i] = out.add(index.get(self.parents[i], -1), self.tokens[i], self.values[i])
        return out

    @classmethod
    def from_tree(cls, tree: DraftTree, b: int, values: bool = True) -> "RowTree":
        """Row ``b`` of ``tree``; its valid nodes keep their indices (filler only comes last), equal siblings
        included (later additions merge into the first). Reads the tree's tokens (once per tree, unless the
        drafter gave them) and, with ``values``, its values (a device read each call; without, they are 0)."""
        row = cls()
        parents, valid = tree.host()
        tokens = tree.token_lists()[b]
        values = tree.values[b].tolist() if values and tree.values is not None else [0.0] * len(tokens)
        for i, (p, ok) in enumerate(zip(parents[b], valid[b])):
            if not ok:
                break
            row._index.setdefault((p, tokens[i]), i)
            row.tokens.append(tokens[i])
            row.parents.append(p)
            row.values.append(values[i])
        return row


def pack(rows: list[RowTree], device: torch.device, vocab_size: int | None = None,
         values: torch.Tensor | None = None) -> DraftTree:
    """Pad per-row trees to one :class:`DraftTree` (filler: invalid children of the root); token ids at or
    past ``vocab_size`` (the verifier's vocabulary) are clamped into it. Built on the host and uploaded without a
    sync; ``values``: the trees' values already on the device (``[B, N]``), instead of the rows' own."""
    n = max((len(r) for r in rows), default=0)
    top = (vocab_size - 1) if vocab_size is not None else None
    tokens = [[min(t, top) if top is not None else t for t in r.tokens] + [0] * (n - len(r)) for r in rows]
    parents = [r.parents + [-1] * (n - len(r)) for r in rows]
    valid = [[True] * len(r) + [False] * (n - len(r)) for r in rows]
    if values is None:
        values = upload([r.values + [0.0] * (n - len(r)) for r in rows], torch.float32, device).view(len(rows), n)
    ids = upload(tokens, torch.long, device).view(len(rows), n)
    return DraftTree.from_host(ids, parents, valid, values, host_tokens=tokens)
