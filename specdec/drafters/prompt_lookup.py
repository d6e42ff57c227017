"""Prompt-lookup (n-gram) drafting: no model, just copying.

The longest recent n-gram at the end of a row is looked up earlier in that row (prompt and
generated text); the tokens that followed its most recent earlier occurrence are the draft. It
shines where outputs copy inputs: summarisation, RAG, code editing.
"""

from __future__ import annotations

import torch

from specdec.drafters.base import Drafter
from specdec.protocol import DraftContext, DraftChain, Rows
from specdec.trees.build import TreeShape
from specdec.transfer import upload
from specdec.trees.tree import DraftTree, RowTree, pack


#: how many recent tokens a lookup searches by default (bounds the cost on long contexts)
WINDOW = 1024


def lookup(row: list[int], k: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Up to ``k`` tokens following the latest earlier occurrence of the longest matching suffix n-gram."""
    found = continuations(row, k, min_ngram, max_ngram, 1)
    return found[0] if found else []


def continuations(row: list[int], depth: int, min_ngram: int, max_ngram: int, limit: int) -> list[list[int]]:
    """Up to ``limit`` different continuations of the row's suffix n-grams, longest n-gram and latest
    occurrence first, each up to ``depth`` tokens (the branches of a lookup tree)."""
    length, found = len(row), []
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = row[length - n :]
        # scan right to left for the most recent occurrences that are not the suffix itself
        for start in range(length - n - 1, -1, -1):
            if row[start : start + n] == suffix:
                follow = row[start + n : start + n + depth]
                if follow and follow not in found:
                    found.append(follow)
                    if len(found) == limit:
                        return found
    return found


def lookup_tree(branches: list[list[int]]) -> RowTree:
    """The trie of ``branches``; a node's value is the share of branches through it (an n-gram estimate of
    its chance to be accepted), the first branch's nodes first."""
    tree, counts = RowTree(), []
    for branch in branches:
        for node in tree.add_path(branch):
            counts.extend([0] * (node + 1 - len(counts)))
            counts[node] += 1
    tree.values = [c / len(branches) for c in counts]
    return tree



def chain_of(drafts: list[list[int]], rows: Rows, ctx: DraftContext) -> DraftChain:
    """Per-row host drafts of any lengths as one chain. Rows with shorter drafts repeat their last token (or the
    row's last token): any proposal is safe, since only what the verifier agrees with is kept."""
    width = max((len(d) for d in drafts), default=0)
    if width == 0:
        return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device))
    padded = [d + [(d or rows.host(b)[-1:])[-1]] * (width - len(d)) for b, d in enumerate(drafts)]
    tokens = upload(padded, torch.long, rows.device)
    if ctx.vocab_size is not None:
        tokens = tokens.clamp(max=ctx.vocab_size - 1)
    return DraftChain(tokens)

class PromptLookupDrafter(Drafter):
    """Drafts by n-gram lookup in each row's own context. Batch aware; deterministic (one-hot ``q``).

    Args:
        min_ngram / max_ngram: n-gram sizes tried, longest first.
        max_draft: cap on drafted tokens per step (the loop's ``k`` also caps it).
        window: how many recent tokens to search (bounds the cost on long contexts).
    """

    supports_tree = True

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3, max_draft: int | None = None, window: int = WINDOW) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram, self.max_draft, self.window = min_ngram, max_ngram, max_draft, window

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        if self.max_draft is not None:
            k = min(k, self.max_draft)
        return chain_of([found[0] if found else [] for found in self.branches(rows, k, 1)], rows, ctx)

    def branches(self, rows: Rows, depth: int, limit: int) -> list[list[list[int]]]:
        """Per row, up to ``limit`` different continuations (``depth`` tokens at most) of its suffix n-grams."""
        out = []
        for b, pad in enumerate(rows.pads):
            ids = rows.host(b)  # the engine's host copy: no device read
            context = ids[max(pad, len(ids) - self.window) :]
            out.append(continuations(context, depth, self.min_ngram, self.max_ngram, limit) if depth > 0 else [])
        return out

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        """Several n-gram matches as branches (up to ``top_k`` of them, ``depth`` deep), merged into a trie;
        the best ``total_tokens`` nodes by share of branches are kept."""
        depth = shape.depth if self.max_draft is None else min(shape.depth, self.max_draft)
        trees = []
        for branches in self.branches(rows, depth, shape.config.top_k):
            tree = lookup_tree(branches)
            weights = shape.weights(tree.parents, tree.values)
            trees.append(tree.best(shape.select(sorted(weights, reverse=True), 0), weights) if len(tree) else tree)
        return pack(trees, rows.device, ctx.vocab_size)
