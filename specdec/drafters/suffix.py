"""Suffix decoding (Oliaro et al., NeurIPS 2025): drafts from this call's text and from earlier calls' outputs.

Two indexes answer each pass (:mod:`specdec.drafters.suffix_index`): a per-call one over each row's prompt and
output so far, and the cross-call :class:`~specdec.drafters.suffix_cache.SuffixCache` that the model-level drafter
owns and every finished call feeds with its rows' outputs (and, with ``learn_prompts``, their prompts). Each finds
the longest suffix of the row that it has seen and counts what followed it; the draft is the most frequent
continuation, as long as the match allows (``factor * match length``, capped by ``k``) and while each token's share
of the occurrences stays above ``min_prob``. The source with the higher score (the sum of those shares) drafts.
Trees take the most frequent nodes instead of one path and go through the tree path as prompt lookup's do.

Drafts are deterministic given the context and the cache (one-hot ``q``): exact under greedy and sampling alike.
``composite:suffix`` (:class:`SuffixCompositeDrafter`) drafts with the model drafter where neither index matches.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from specdec.drafters.base import Drafter, WrappingDrafter
from specdec.drafters.composite import CompositeDrafter
from specdec.drafters.prompt_lookup import chain_of
from specdec.drafters.suffix_cache import DEFAULT_BUDGET, SuffixCache, SuffixCacheError
from specdec.drafters.suffix_index import Continuations, TokenIndex
from specdec.protocol import Commit, DraftChain, DraftContext, Rows, left_pads
from specdec.trees.build import TreeShape
from specdec.trees.tree import DraftTree, RowTree, pack

__all__ = ["SuffixCache", "SuffixCacheError", "SuffixCompositeDrafter", "SuffixDrafter", "cross_call_cache"]

#: how deep a draft may go per matched token (arctic-inference's ``max_spec_factor``), and what it adds
MATCH_FACTOR, MATCH_OFFSET = 1.0, 0.0
#: the least share of the occurrences a drafted token must have (arctic-inference's ``min_token_prob``)
MIN_PROB = 0.1


class SuffixDrafter(Drafter):
    """Suffix decoding: per-call index plus a cross-call cache (see the module docstring). No model.

    Args:
        budget: tokens the cross-call cache keeps (oldest dropped first); ignored when ``cache`` is given.
        cache: a :class:`SuffixCache` to share (e.g. between two models); default: a new one.
        learn_prompts: feed each finished call's prompts to the cache too, not only its outputs.
        factor / offset: a draft goes at most ``factor * match length + offset`` tokens deep (and ``k``).
        min_prob: stop a draft where a token's share of the matched occurrences falls below it.
    """

    supports_tree = True

    def __init__(self, budget: int = DEFAULT_BUDGET, *, cache: SuffixCache | None = None, learn_prompts: bool = False,
                 factor: float = MATCH_FACTOR, offset: float = MATCH_OFFSET, min_prob: float = MIN_PROB) -> None:
        if not factor > 0 or offset < 0 or not 0 <= min_prob <= 1:
            raise ValueError(f"need factor > 0, offset >= 0 and 0 <= min_prob <= 1, got {factor}, {offset}, {min_prob}")
        self.cache = cache if cache is not None else SuffixCache(budget)
        self.learn_prompts, self.factor, self.offset, self.min_prob = learn_prompts, factor, offset, min_prob
        self._reset()

    def _reset(self) -> None:
        self._local: list[TokenIndex] = []  # per active row: its real tokens (prompt and output), indexed
        self._pads: list[int] = []
        self._width = 0  # the prompt width: a row's output starts there
        self._last: Rows | None = None  # the latest committed rows (what leaving rows produced)
        self._owners: list[int] = []
        self._done: list[tuple[list[int], int]] = []  # rows that left: (real tokens, left padding)
        self.local_steps = self.global_steps = self.misses = 0

    # --- the call's life ----------------------------------------------------------------------------------

    def for_call(self) -> "SuffixDrafter":
        call = copy.copy(self)  # shares self.cache: the one cross-call cache
        call._reset()
        return call

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: Any = None, hidden: torch.Tensor | None = None) -> None:
        self._reset()
        batch, self._width = input_ids.shape
        self._pads = left_pads(attention_mask, batch)  # one device read per call
        self._local = [TokenIndex() for _ in range(batch)]
        self._owners = list(range(batch))

    def commit(self, update: Commit) -> None:
        self._last = update.rows  # kept, not copied: read when a row leaves or the call ends

    def keep_rows(self, indices: torch.Tensor) -> None:
        stay = indices.tolist()
        if self._last is not None and len(self._last) == len(self._local):
            kept = set(stay)
            self._done += [self._row_tokens(self._last, b) for b in range(len(self._local)) if b not in kept]
        self._local = [self._local[b] for b in stay]
        self._pads = [self._pads[b] for b in stay]
        self._owners = [self._owners[b] for b in stay]
        self._last = None  # its rows no longer line up with ours

    def finish(self) -> None:
        """Feed the cross-call cache with every row's output (unless it is not :attr:`SuffixCache.learning`)."""
        if self._last is not None and len(self._last) == len(self._local):
            self._done += [self._row_tokens(self._last, b) for b in range(len(self._local))]
        if self.cache.learning:
            for row, pad in self._done:
                prompt = self._width - pad
                if self.learn_prompts:
                    self.cache.add(row[:prompt])
                self.cache.add(row[prompt:])
        self._done, self._last, self._local = [], None, []

    def _row_tokens(self, rows: Rows, b: int) -> tuple[list[int], int]:
        return rows.host(b)[self._pads[b] :], self._pads[b]

    # --- drafting -----------------------------------------------------------------------------------------

    def _sources(self, rows: Rows, b: int, depth: int) -> tuple[list[Continuations], list[Continuations]]:
        """Row ``b``'s matches: ``(in this call's text, in the cache)``; the row's index catches up first."""
        pad = rows.pads[b]
        row = rows.host(b)[pad:]
        local = self._local[b]
        seq = local.seqs.get(0, [])
        if len(seq) < len(row):
            local.extend(0, row[len(seq) :])
        return local.match(row, depth), self.cache.match(row, depth)

    def _best(self, matches: tuple[list[Continuations], list[Continuations]], depth: int,
              pick: Any) -> tuple[Any, float, int]:
        """The highest-scoring draft over both sources and their match lengths: ``(draft, score, source)``
        (source 0: this call, 1: the cache, -1: nothing matched)."""
        best, score, source = None, 0.0, -1
        for where, found in enumerate(matches):
            for trie in found:
                draft, s = pick(trie, trie.limit(depth, self.factor, self.offset))
                if s > score:
                    best, score, source = draft, s, where
        return best, score, source

    def _count(self, source: int) -> None:
        if source == 0:
            self.local_steps += 1
        elif source == 1:
            self.global_steps += 1
        else:
            self.misses += 1

    def branches(self, rows: Rows, depth: int, limit: int = 1) -> list[list[list[int]]]:
        """Per row, its best chain (``depth`` tokens at most) as a one-branch list, or ``[]`` where nothing matched
        (the interface :class:`~specdec.drafters.CompositeDrafter` reads)."""
        out = []
        for b in range(len(rows)):
            chain, _, source = self._best(self._sources(rows, b, depth), depth,
                                          lambda trie, d: trie.chain(d, self.min_prob))
            self._count(source)
            out.append([chain] if chain else [])
        return out

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        return chain_of([found[0] if found else [] for found in self.branches(rows, k)], rows, ctx)

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        """The most frequent continuations as a tree (``total_tokens`` nodes at most, ``depth`` deep), each node
        valued by its share of the matched occurrences; ranked and sized as prompt lookup's trees."""
        depth, size = shape.depth, shape.config.total_tokens
        trees = []
        for b in range(len(rows)):
            found, _, source = self._best(self._sources(rows, b, depth), depth,
                                          lambda trie, d: _split_score(trie.tree(d, size, self.min_prob)))
            self._count(source)
            tree = RowTree()
            if found is not None:
                tokens, parents, probs = found
                for token, parent, prob in zip(tokens, parents, probs):
                    tree.add(parent, token, prob)
            if len(tree):
                weights = shape.weights(tree.parents, tree.values)
                tree = tree.best(shape.select(sorted(weights, reverse=True), 0), weights)
            trees.append(tree)
        return pack(trees, rows.device, ctx.vocab_size)

    def stats(self) -> dict[str, float]:
        return {"suffix_local_steps": self.local_steps, "suffix_cache_steps": self.global_steps,
                "suffix_misses": self.misses, "suffix_cache_tokens": self.cache.tokens}

    # --- the cross-call cache -----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> Path:
        """Write the cross-call cache to ``path`` (atomically; :meth:`SuffixCache.save`)."""
        return self.cache.save(path)

    def load(self, path: str | os.PathLike) -> None:
        """Replace the cross-call cache's contents with ``path``'s (:meth:`SuffixCache.load`)."""
        self.cache.load(path)


class SuffixCompositeDrafter(CompositeDrafter):
    """``composite:suffix``: suffix decoding where it matches (at least ``min_match`` tokens), the model drafter
    otherwise; the suffix drafter is told every commit (it feeds its cache when the call ends)."""

    def __init__(self, model_drafter: Drafter, suffix: SuffixDrafter | None = None, min_match: int = 2) -> None:
        super().__init__(model_drafter, suffix or SuffixDrafter(), min_match)

    @property
    def suffix(self) -> SuffixDrafter:
        """The suffix drafter that drafts first."""
        return self.lookup  # type: ignore[return-value]

    @property
    def cache(self) -> SuffixCache:
        """The suffix drafter's cross-call cache."""
        return self.suffix.cache

    def commit(self, update: Commit) -> None:
        self.lookup.commit(update)
        self.model_drafter.commit(update)

    def stats(self) -> dict[str, float]:
        return {**super().stats(), **self.lookup.stats()}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the suffix drafter's cross-call cache to ``path``."""
        return self.suffix.save(path)

    def load(self, path: str | os.PathLike) -> None:
        """Load the suffix drafter's cross-call cache from ``path``."""
        self.suffix.load(path)


def _split_score(found: tuple[list[int], list[int], list[float], float]) -> tuple[tuple, float]:
    """:meth:`Continuations.tree`'s answer as ``(tree, score)``, the form :meth:`SuffixDrafter._best` compares."""
    return found[:3], found[3]


def cross_call_cache(drafter: Drafter) -> SuffixCache | None:
    """The cross-call cache ``drafter`` drafts from (a suffix drafter's, or the one inside a composite or another
    wrapper); ``None`` for drafters without one."""
    seen = 0
    while seen < 8:  # wrappers nest a few deep at most
        if isinstance(drafter, SuffixDrafter):
            return drafter.cache
        if isinstance(drafter, CompositeDrafter):
            drafter = drafter.lookup
        elif isinstance(drafter, WrappingDrafter):
            drafter = drafter.inner
        else:
            return None
        seen += 1
    return None
