"""A batch of draft trees: the proposal a tree drafter returns and the engine verifies in one pass.

Node ``i`` of row ``b`` holds ``tokens[b, i]``; its parent is ``parents[b, i]`` (``-1``: a child of the row's
newest committed token, the *root*), always an earlier node, so index order is topological. Rows may have
different trees: ``valid[b, i]`` marks real nodes, the rest are filler that nothing attends to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.protocol import Drafts


@dataclass
class DraftTree(Drafts):
    """Draft tokens as a tree: what :meth:`~specdec.drafters.Drafter.propose_tree` returns (a chain's
    :class:`~specdec.drafters.Proposal` has the same ``tokens`` and ``probs``).

    ``parents [B, N]`` (-1: child of the root), ``valid [B, N]`` (real nodes), ``values [B, N]`` (the
    drafter's estimate that the node is accepted, its cumulative draft probability; for tree sizing),
    ``probs``: ``None`` (deterministic nodes, the usual case: top-k children) or ``[B, N, V]``, the
    distribution each node was sampled from (siblings drawn i.i.d.).
    """

    tokens: torch.LongTensor
    probs: torch.Tensor | None = None
    parents: torch.LongTensor | None = None
    valid: torch.BoolTensor | None = None
    values: torch.Tensor | None = None

    def __post_init__(self) -> None:
        batch, n = self.tokens.shape
        if self.parents is None or self.parents.shape != (batch, n):
            raise ValueError(f"a DraftTree needs parents of shape {(batch, n)}")
        if self.valid is None:
            self.valid = torch.ones(batch, n, dtype=torch.bool, device=self.tokens.device)
        host = self.parents.tolist()
        if any(p >= i or p < -1 for row in host for i, p in enumerate(row)):
            raise ValueError("DraftTree parents must be -1 or an earlier node's index")
        self._parents = host
        self._valid = self.valid.tolist()

    def scored(self) -> list[tuple[int, int]]:
        """Per row: (real nodes, the deepest real node's depth)."""
        return [(sum(ok), max((d for d, v in zip(depth, ok) if v), default=0))
                for depth, ok in zip(self.depths(), self._valid)]

    def host(self) -> tuple[list[list[int]], list[list[bool]]]:
        """``(parents, valid)`` as host lists (no device sync after construction)."""
        return self._parents, self._valid

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

    def verify_inputs(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For a verifier pass over ``[root, nodes]``: ``(depth [B, N+1], tree mask [B, N+1, N+1], valid [B, N+1])``;
        each node sees the root, its ancestors and itself."""
        batch, n = self.tokens.shape
        mask = torch.zeros(batch, n + 1, n + 1, dtype=torch.bool, device="cpu")
        mask[:, :, 0] = True
        for b, parents in enumerate(self._parents):
            for i, p in enumerate(parents):
                mask[b, i + 1] |= mask[b, p + 1]
                mask[b, i + 1, i + 1] = True
        depth = torch.tensor([[0] + d for d in self.depths()], dtype=torch.long, device="cpu").view(batch, n + 1)
        valid = torch.cat([torch.ones(batch, 1, dtype=torch.bool, device="cpu"), self.valid.cpu()], dim=1)
        return depth.to(device), mask.to(device), valid.to(device)


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
    def from_tree(cls, tree: DraftTree, b: int) -> "RowTree":
        """Row ``b`` of ``tree``; its valid nodes keep their indices (filler only comes last), equal siblings
        included (later additions merge into the first)."""
        row = cls()
        parents, valid = tree.host()
        tokens = tree.tokens[b].tolist()
        values = tree.values[b].tolist() if tree.values is not None else [0.0] * len(tokens)
        for i, (p, ok) in enumerate(zip(parents[b], valid[b])):
            if not ok:
                break
            row._index.setdefault((p, tokens[i]), i)
            row.tokens.append(tokens[i])
            row.parents.append(p)
            row.values.append(values[i])
        return row


def pack(rows: list[RowTree], device: torch.device, vocab_size: int | None = None) -> DraftTree:
    """Pad per-row trees to one :class:`DraftTree` (filler: invalid children of the root); token ids at or
    past ``vocab_size`` (the verifier's vocabulary) are clamped into it."""
    n = max((len(r) for r in rows), default=0)
    tokens = torch.zeros(len(rows), n, dtype=torch.long, device="cpu")
    parents = torch.full((len(rows), n), -1, dtype=torch.long, device="cpu")
    valid = torch.zeros(len(rows), n, dtype=torch.bool, device="cpu")
    values = torch.zeros(len(rows), n, dtype=torch.float32, device="cpu")
    for b, row in enumerate(rows):
        m = len(row)
        tokens[b, :m] = torch.tensor(row.tokens, dtype=torch.long, device="cpu")
        parents[b, :m] = torch.tensor(row.parents, dtype=torch.long, device="cpu")
        valid[b, :m] = True
        values[b, :m] = torch.tensor(row.values, dtype=torch.float32, device="cpu")
    if vocab_size is not None:
        tokens = tokens.clamp(max=vocab_size - 1)
    return DraftTree(tokens.to(device), None, parents=parents.to(device), valid=valid.to(device), values=values.to(device))
