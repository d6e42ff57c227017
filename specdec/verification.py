"""One verifier pass over a proposal (a chain or a tree of drafts) and what it decides to keep.

Both paths return a :class:`Verified`: per row the accepted drafts, the tokens to commit, the scores,
logits and hidden states at the committed positions (in commit order), and, for trees, the accepted path.
:meth:`Verified.keep` then drops everything else from the verifier's cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch
from typing import Callable

import torch

from specdec.acceptance import CHAIN_RULES, greedy_accept, one_hot
from specdec.arguments import GenerationSetup
from specdec.protocol import Commit, DraftedIds, Drafts, DraftChain, Rows
from specdec.rules import chain_rule
from specdec.trees.accept import greedy_tree_accept, tree_rejection_accept
from specdec.trees.traversal import traversal_accept
from specdec.trees.tree import DraftTree, reads_context
from specdec.runners.session import CacheSession


@dataclass
class Verified:
    """What one verify pass decided. ``tokens [B, D + 1]``: row ``b`` commits ``tokens[b, :accepted[b] + 1]``;
    ``scores`` / ``logits`` / ``hidden`` ``[B, D + 1, ...]`` are at those positions (the newest committed
    token's, then each accepted draft's); ``path [B, D]``: tree node of each accepted draft (trees only)."""

    accepted: torch.LongTensor
    tokens: torch.LongTensor
    scores: torch.Tensor
    logits: torch.Tensor
    hidden: torch.Tensor | None = None
    path: torch.LongTensor | None = None
    block: int = 0  # trees: tokens in the verify pass (root + nodes)
    path_host: list[list[int]] | None = None  # trees: ``path`` as host ints, set by :meth:`read`
    drafted: DraftedIds | None = None  # the drafter's own ids, checked by :meth:`read` (``specdec.protocol.checked``)

    def read(self) -> tuple[list[int], list[list[int]]]:
        """The pass's one device read: ``accepted`` per row and each row's tokens to commit, as host ints (a tree's
        accepted ``path`` rides along, kept as :attr:`path_host`; so do the drafter's own ids, which are checked here,
        before anything is committed: a :class:`~specdec.protocol.ProposalError` if any is outside the vocabulary)."""
        path = [] if self.path is None else [self.path]
        ids = [] if self.drafted is None else [self.drafted.ids]
        both = torch.cat([self.accepted.unsqueeze(1), self.tokens, *path, *ids], dim=1).tolist()
        start = 1 + self.tokens.shape[1]
        end = start + (self.path.shape[1] if self.path is not None else 0)
        if self.drafted is not None:
            self.drafted.check([row[end:] for row in both])
        if self.path is not None:
            self.path_host = [row[start:end] for row in both]
        return [row[0] for row in both], [row[1 : row[0] + 2] for row in both]

    def keep(self, cache: CacheSession, update: Commit) -> None:
        """Keep each row's newest committed token and its first ``added - 1`` accepted drafts in ``cache``; the
        newest committed token stays unfed."""
        if self.path is None:  # a chain: the pass's slots were all real, keep a prefix of each row's
            return cache.keep_recent(self.tokens.shape[1], update.added_host, update.added)
        # a tree: the root's slot and the first added - 1 accepted nodes' (node i's slot is i + 1), from host ints
        path = self.path_host if self.path_host is not None else self.path.tolist()
        cache.keep_slots([[0] + [node + 1 for node in row[: n - 1]] for row, n in zip(path, update.added_host)],
                         self.block)


def verify(cache: CacheSession, rows: Rows, drafts: Drafts, setup: GenerationSetup, layers: tuple[int, ...],
           generator: torch.Generator | None, rule: str = "token") -> Verified:
    """One verify pass over ``drafts``: :func:`verify_chain` for a chain, :func:`verify_tree` for a tree; sampled ones by
    ``rule`` (:mod:`specdec.rules`)."""
    verified = _pass_for(drafts)(cache, rows, drafts, setup, layers, generator, rule)
    verified.drafted = drafts.drafted
    return verified


@singledispatch
def _pass_for(drafts: Drafts) -> Callable[..., Verified]:
    raise TypeError(f"cannot verify {type(drafts).__name__}: a drafter proposes a DraftChain (chain) or a DraftTree")


def _process(setup: GenerationSetup, rows: Rows, contexts: list[list[torch.Tensor]], logits: torch.Tensor) -> torch.Tensor:
    """Apply the logits processors at each verify position, with the context that position sees
    (``contexts[b][j]``: row ``b``'s tokens up to and including position ``j``'s token) and row ``b``'s
    own processors."""
    if not setup.processors:
        return logits
    out = torch.empty_like(logits)
    for b, row in enumerate(contexts):
        out[b, : len(row)] = setup.processors.apply([(rows.owners[b], ids) for ids in row], logits[b, : len(row)])
    return out


def verify_chain(cache: CacheSession, rows: Rows, proposal: DraftChain, setup: GenerationSetup,
                 layers: tuple[int, ...], generator: torch.Generator | None, rule: str = "token") -> Verified:
    """Score ``[last, d_1 .. d_k]`` per row in one pass; greedy acceptance, or sampling by ``rule``
    (:data:`~specdec.acceptance.CHAIN_RULES`: token-by-token rejection sampling, or block verification)."""
    drafts = proposal.tokens
    last = torch.stack([row[-1] for row in rows]).unsqueeze(1)
    step = cache.forward(torch.cat([last, drafts], dim=1), hidden_layers=layers)
    logits = step.logits.float()
    contexts = [[torch.cat([row, drafts[b, :j]]) for j in range(drafts.shape[1] + 1)] for b, row in enumerate(rows)] \
        if setup.processors else []
    scores = _process(setup, rows, contexts, logits)
    if not setup.do_sample:
        accepted, tokens = greedy_accept(drafts, scores)
    else:
        p = torch.softmax(scores, dim=-1)
        q = proposal.probs
        rule = chain_rule(rule)
        if q is None:  # deterministic drafts: one-hot q, where the token rule keeps as much as any (and costs least)
            q, rule = one_hot(drafts, p.shape[-1], p.dtype), "token"
        accepted, tokens = CHAIN_RULES[rule](drafts, q, p, generator)
    return Verified(accepted, tokens, scores, logits, step.hidden)


def verify_tree(cache: CacheSession, rows: Rows, tree: DraftTree, setup: GenerationSetup,
                layers: tuple[int, ...], generator: torch.Generator | None, rule: str = "token") -> Verified:
    """Score ``[last, node_1 .. node_N]`` per row in one pass: each node sees the cache, the root, its
    ancestors and itself, at position committed + depth; then walk the tree: greedy, or sampled by ``rule``
    (:data:`TREE_RULES`: per-node rejection sampling top-down, or traversal verification leaf first)."""
    device = tree.tokens.device
    last = torch.stack([row[-1] for row in rows]).unsqueeze(1)
    depth, mask, valid = tree.verify_inputs(device)
    positions = cache.counts.unsqueeze(1) + depth
    step = cache.forward(torch.cat([last, tree.tokens], dim=1), valid, position_ids=positions, tree_mask=mask,
                         hidden_layers=layers)
    logits = step.logits.float()
    scores = _process(setup, rows, _tree_contexts(rows, tree, setup), logits) if setup.processors else logits
    if setup.do_sample:
        # top-ranked nodes (one-hot laws): traversal keeps what the token rule keeps, which costs less on the host
        rule = "token" if tree.probs is None else rule
        accepted, tokens, path = TREE_RULES[rule](tree, torch.softmax(scores, dim=-1), generator)
    else:
        accepted, tokens, path = greedy_tree_accept(tree, scores)
    index = torch.cat([torch.zeros(path.shape[0], 1, dtype=torch.long, device=path.device), path + 1], dim=1).clamp_min(0)  # committed positions
    pick = lambda t: None if t is None else t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))  # noqa: E731
    return Verified(accepted, tokens, pick(scores), pick(logits), pick(step.hidden), path, tree.tokens.shape[1] + 1)


def _tree_contexts(rows: Rows, tree: DraftTree, setup: GenerationSetup) -> list[list[torch.Tensor]]:
    """Per row, per verify position (root, then each node): the row and the tokens on the node's path. Gathered
    on the device with one uploaded index (no read); context-free processors (temperature, top-k/p) read no
    context, so each position then gets the row itself, unread."""
    n = tree.tokens.shape[1]
    if not reads_context(setup.processors, rows.owners):
        return [[row] * (n + 1) for row in rows]
    index, lengths = tree.path_index(tree.tokens.device)
    on_path = tree.tokens.gather(1, index.flatten(1)).view_as(index) if n else index  # [B, N, D]
    return [[row] + [torch.cat([row, on_path[b, i, :m]]) for i, m in enumerate(lengths[b])]
            for b, row in enumerate(rows)]


#: how a sampled tree is verified, by name (:mod:`specdec.rules`)
TREE_RULES = {"token": tree_rejection_accept, "traversal": traversal_accept}

_pass_for.register(DraftChain, lambda drafts: verify_chain)
_pass_for.register(DraftTree, lambda drafts: verify_tree)
