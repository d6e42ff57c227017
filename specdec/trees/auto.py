"""``tree="auto"``: size each pass's tree from what a pass costs on this device and what drafts are worth.

:func:`measure_verify_cost` times the verifier over passes of 1..64 tokens (through the same tree-mask path a
tree pass takes). :class:`TreeSizer` then chooses, per pass, how deep to grow and how many candidates to
verify: each candidate gets a *weight*, the chance that the verifier accepts it, and with weights sorted
``w_1 >= w_2 >= ...`` ``n`` nodes are expected to commit ``1 + w_1 + ... + w_n`` tokens at a cost
``C(n + 1) + passes * t_draft``; the sizer takes the ``n`` with the most tokens per second.
A node's weight is the product over its path of :class:`EdgeCalibration`'s acceptance of each edge, learnt
from what the verifier accepted, by the edge's rank among its siblings and its draft probability.
On this CPU ``C`` grows steeply with ``n``, so trees stay small; on a GPU it is nearly flat, so they grow.
"""

from __future__ import annotations

import bisect
import statistics
import time

import torch

from specdec.costs import VerifyCost
from specdec.trees.arms import ChainOrTree
from specdec.trees.tree import DraftTree
from specdec.runners.hf import lm_head_rows

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
PRIOR = 1.0  # pseudo-count of the calibration: accepted / predicted starts at 1 and moves with evidence
P_EDGES = (0.05, 0.15, 0.3, 0.5, 0.7, 0.9)  # upper edges of the draft-probability bins (the last bin runs to 1)
RANKS = 3  # sibling ranks the calibration tells apart: 0, 1, 2 and below


@torch.inference_mode()
def measure_verify_cost(runner, sizes: tuple[int, ...] = SIZES, context: int = 256, repeats: int = 3,
                        min_seconds: float = 0.05, max_repeats: int = 25) -> VerifyCost:
    """Time ``runner``'s model over a pass of each size after a ``context``-token prompt: the median of at least
    ``repeats`` passes, more (up to ``max_repeats``) until ``min_seconds`` per size were timed, then the monotone
    envelope (a pass never costs more than a longer one: ``seconds[i] = min(seconds[i:])``).

    Why both: a small model on a GPU is launch-bound, each pass ~15 ms of host work whose jitter is +-30%, and the
    first H100 check measured 16 tokens *cheaper* than 1 from three repeats; a longer pass can always stand in for
    a shorter one (padding), so a dip past a size is the true bound for it too.

    On a model with fewer positions than ``context`` + the largest size (``max_position_embeddings``), both are
    clamped to fit: sizes up to half its positions, the context filling the rest (the curve is extrapolated past
    the largest size measured)."""
    model = runner.model
    device = model.device
    sizes, context = _fit_positions(model.config, tuple(sizes), context)
    vocab = lm_head_rows(model)
    gen = torch.Generator(device="cpu").manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=gen, device="cpu").to(device)
    session, _ = runner.prefill(prompt, None, context + max(sizes) + 1)
    seconds = []
    try:
        for n in sizes:
            tokens = torch.randint(0, vocab, (1, n), generator=gen, device="cpu").to(device)
            chain = torch.tril(torch.ones(n, n, dtype=torch.bool, device=device)).unsqueeze(0)
            positions = (context + torch.arange(n, device=device)).unsqueeze(0)
            times: list[float] = []
            while len(times) < repeats + 1 or (sum(times[1:]) < min_seconds and len(times) < max_repeats + 1):
                _sync(device)  # the first pass is a warm-up
                t0 = time.perf_counter()
                session.forward(tokens, position_ids=positions, tree_mask=chain)
                _sync(device)
                times.append(time.perf_counter() - t0)
                session.rollback(context)
            seconds.append(statistics.median(times[1:]))
    finally:
        session.release()
    envelope = [min(seconds[i:]) for i in range(len(seconds))]
    return VerifyCost(tuple(sizes), tuple(envelope), context, str(device))


def _fit_positions(config, sizes: tuple[int, ...], context: int) -> tuple[tuple[int, ...], int]:
    """``sizes`` and ``context`` clamped so that a ``context``-token prompt and the largest pass fit the model's
    positions (learnt position tables index past their end otherwise)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0 or context + max(sizes) <= limit:
        return sizes, context
    if limit < 2:
        raise ValueError(f"the verifier has {limit} position(s): too few to measure a tree's verify cost")
    fitted = tuple(n for n in sizes if n <= limit // 2) or (1,)
    return fitted, max(1, min(context, limit - max(fitted)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class EdgeCalibration:
    """How often the verifier accepts a draft node whose parent it accepted, by the node's rank among its
    siblings and the drafter's probability ``p`` of it given the parent (the *edge*):
    ``g(rank, p) = min(1, p * (accepted + m) / (predicted + m))``, with ``accepted`` and ``predicted`` (summed
    ``p``) decaying sums over the edges verified so far in the edge's (rank, probability bin) cell, and a prior of
    ``PRIOR`` edge(s) at the bin's middle ``m`` accepted as often as ``m`` says. With no evidence ``g = p``: the
    drafter's own estimate; a prior in units of edges, not of probability, lets a bin of small ``p`` learn
    from a few edges.

    Why not one factor for all nodes (the model before this): under greedy decoding the verifier takes the
    drafter's top child whenever the two argmaxes agree, whatever ``p``, and a second child only when the first
    was wrong. A near-perfect drafter (an int8 self-copy) with ``p`` 0.4 on its top token is accepted almost
    always at rank 0 and almost never below; one factor valued a depth-``d`` chain at ``~p^d`` and kept its
    trees at ~2 tokens a pass where its chain committed 5.5 (measured on Spec-Bench prompts, this CPU).
    Under sampling with deterministic children ``g`` stays near the verifier's ``p(x)``, which ``p`` estimates.
    """

    def __init__(self, decay: float = 0.95) -> None:
        self.decay = decay
        self.accepted = torch.zeros(RANKS, len(P_EDGES) + 1, dtype=torch.float64, device="cpu")
        self.predicted = torch.zeros_like(self.accepted)
        bounds = (0.0, *P_EDGES, 1.0)
        self._prior = PRIOR * torch.tensor([(lo + hi) / 2 for lo, hi in zip(bounds, bounds[1:])], dtype=torch.float64,
                                           device="cpu")
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # per device: factors, bin edges

    def factor(self) -> torch.Tensor:
        """``[RANKS, bins]``: what ``p`` is multiplied by (before the cap at 1) in each cell."""
        return (self.accepted + self._prior) / (self.predicted + self._prior)

    def _table(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._tables:  # one small copy per device until the next observation
            edges = torch.tensor(P_EDGES, dtype=torch.float32, device="cpu")
            self._tables[device] = (self.factor().float().to(device), edges.to(device))
        return self._tables[device]

    def acceptance(self, rank: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """``g`` per edge (``rank`` and ``p`` of one shape; the result is ``p``'s shape, device, float32)."""
        factor, edges = self._table(p.device)
        p = p.float()
        cell = factor[rank.clamp(0, RANKS - 1), torch.bucketize(p, edges, right=True)]
        return (p * cell).clamp(max=1.0)

    def observe(self, rank: list[int], p: list[float], accepted: list[bool]) -> None:
        """Learn from one pass's verified edges (those whose parent was accepted): decay, then count them."""
        self.accepted *= self.decay
        self.predicted *= self.decay
        for r, q, hit in zip(rank, p, accepted):
            cell = (min(max(r, 0), RANKS - 1), bisect.bisect_right(P_EDGES, q))
            self.accepted[cell] += float(hit)
            self.predicted[cell] += q
        self._tables.clear()

    def to_dict(self) -> dict:
        """The factor per (rank, bin): what ``p`` is multiplied by before the cap at 1."""
        return {"p_edges": list(P_EDGES), "factor": [[round(x, 3) for x in row] for row in self.factor().tolist()]}


def edges(parents: list[int], values: list[float]) -> tuple[list[int], list[float]]:
    """Per node of one row's tree (``parents``: -1 for the root's children; ``values``: cumulative draft
    probabilities): its rank among its siblings by value (ties: earlier first) and its edge probability
    ``value / parent's value`` (0 where either is not positive: a node without an estimate)."""
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(parents):
        kids.setdefault(par, []).append(i)
    rank = [0] * len(parents)
    for siblings in kids.values():
        for r, i in enumerate(sorted(siblings, key=lambda i: (-values[i], i))):
            rank[i] = r
    edge = []
    for i, par in enumerate(parents):
        base = 1.0 if par < 0 else values[par]
        edge.append(values[i] / base if values[i] > 0 and base > 0 else 0.0)
    return rank, edge


class TreeSizer:
    """Per-pass tree size and depth for ``tree="auto"`` (module docstring).

    ``draft_step``: seconds of one drafter pass; ``None`` learns it from the clock (an EMA of what the
    engine measures), a number fixes it (seeded calls: their tree sizes, and so their samples, must not
    depend on timing). ``max_tokens`` bounds the tree. ``edges`` learns what nodes are worth;
    ``calibration`` (reported, not used) is accepted drafts over the weights predicted: near 1 when it has.
    ``arms``: under sampling, whether a pass drafts a sampled chain or a tree (:class:`ChainOrTree`).
    """

    def __init__(self, cost: VerifyCost, draft_step: float | None = None, max_tokens: int = 64) -> None:
        self.cost = cost
        self.timed = draft_step is None
        self.draft_step = draft_step if draft_step is not None else 0.05 * cost(1)
        self.max_tokens = max_tokens
        self.edges = EdgeCalibration()
        self.calibration = 1.0
        self.arms = ChainOrTree()
        self._predicted = self._accepted = 0.0  # EMAs of the weights verified and the drafts accepted

    def log_acceptance(self, rank: torch.Tensor, edge_logp: torch.Tensor) -> torch.Tensor:
        """``log g`` of edges given by sibling rank and draft log-probability (for weights summed along paths)."""
        return self.edges.acceptance(rank, edge_logp.exp()).log()

    def weights(self, parents: list[int], values: list[float]) -> list[float]:
        """Each node's weight in one row's tree (``values``: cumulative draft probabilities): the product of
        its path's edge acceptances. Never more than its parent's, so the heaviest nodes are ancestor-closed."""
        return self._path_products(parents, *edges(parents, values))

    def _path_products(self, parents: list[int], rank: list[int], edge: list[float]) -> list[float]:
        """:meth:`weights` from the row's :func:`edges`."""
        g = self.edges.acceptance(torch.tensor(rank, dtype=torch.long, device="cpu"),
                                  torch.tensor(edge, dtype=torch.float32, device="cpu")).tolist()
        out: list[float] = []
        for i, par in enumerate(parents):
            out.append(g[i] * (out[par] if par >= 0 else 1.0))
        return out

    def select(self, weights: list[float], passes: int) -> int:
        """The number of candidates (``weights`` best first) with the most expected tokens per second, at least
        one: a pass without drafts would teach the calibration nothing, and a low estimate would then stick
        (measured: verifying none whenever that looked best locked a Spec-Bench run into plain decoding)."""
        best, best_rate, total = 0, 1 / (self.cost(1) + passes * self.draft_step), 0.0
        for n, w in enumerate(weights[: self.max_tokens], start=1):
            total += w
            rate = (1 + total) / (self.cost(n + 1) + passes * self.draft_step)
            if rate > best_rate:
                best, best_rate = n, rate
        return max(best, 1)

    def worth_expanding(self, weights: list[float], frontier: list[float], passes: int) -> bool:
        """Whether one more drafter pass can pay for itself: the frontier's children are worth at most the
        frontier's weight, against the time of a pass at the best rate reachable now."""
        n = self.select(weights, passes)
        tokens = 1 + sum(weights[:n])
        seconds = self.cost(n + 1) + passes * self.draft_step
        return (tokens + sum(frontier)) / (seconds + self.draft_step) > tokens / seconds

    def update(self, tree: DraftTree, path: torch.Tensor | list[list[int]], draft_seconds: float | None = None,
               draft_passes: int = 0, decay: float = 0.9) -> None:
        """Learn from one verified ``tree`` (its ``values``) and the accepted ``path [B, D]`` (node indices, -1
        past the accepted ones; a tensor or host ints): every valid node whose parent was accepted (or is the root)
        is one edge for :class:`EdgeCalibration`; and (timed) the drafter's time over its passes."""
        parents, valid = tree.host()
        values = tree.values.tolist()  # a device read (auto only): what the drafter valued each node at
        paths = path.tolist() if isinstance(path, torch.Tensor) else path  # the engine passes host ints
        ranks, probs, hits = [], [], []
        predicted = accepted = 0.0
        for b in range(len(parents)):  # filler nodes are children of the root with value 0: ranked last
            on = {i for i in paths[b] if i >= 0}
            rank, edge = edges(parents[b], values[b])
            weight = self._path_products(parents[b], rank, edge)
            predicted += sum(w for w, ok in zip(weight, valid[b]) if ok)
            accepted += len(on)
            for i, par in enumerate(parents[b]):
                if valid[b][i] and edge[i] > 0 and (par < 0 or par in on):
                    ranks.append(rank[i])
                    probs.append(edge[i])
                    hits.append(i in on)
        rows = max(len(parents), 1)
        self.edges.observe(ranks, probs, hits)
        self._predicted = decay * self._predicted + predicted / rows
        self._accepted = decay * self._accepted + accepted / rows
        self.calibration = (self._accepted + PRIOR) / (self._predicted + PRIOR)
        if draft_seconds is not None:
            self.learn_draft_step(draft_seconds, draft_passes)

    def learn_draft_step(self, seconds: float, passes: int) -> None:
        """(timed) The drafter's measured time over its ``passes`` passes, into the moving average."""
        if self.timed and passes > 0:
            self.draft_step = 0.8 * self.draft_step + 0.2 * seconds / passes
