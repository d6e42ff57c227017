"""Composite drafting: copy from the context when it repeats itself, otherwise ask the model drafter."""

from __future__ import annotations

import copy

import torch

from specdec.drafters.base import Drafter, WrappingDrafter
from specdec.protocol import DraftContext, DraftChain, Rows
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.trees.build import TreeShape
from specdec.transfer import upload
from specdec.trees.tree import DraftTree, RowTree, pack
from specdec.runners.session import CacheSession


#: the n-gram sizes (shortest, longest) a composite's own lookup tries
LOOKUP_NGRAMS = (2, 4)


class CompositeDrafter(WrappingDrafter):
    """Prompt lookup when it finds a continuation of at least ``min_match`` tokens, the model drafter otherwise.

    The lookup is free, so it is tried first; the model drafter is kept in sync either way (it
    catches up on the committed tokens at its next proposal), and there is never an extra verifier pass.

    Args:
        model_drafter: any drafter (usually a :class:`~specdec.drafters.ModelDrafter`).
        lookup: the n-gram drafter; its proposal is used when it covers at least ``min_match`` tokens.
    """

    def __init__(self, model_drafter: Drafter, lookup: PromptLookupDrafter | None = None, min_match: int = 2) -> None:
        self.model_drafter = model_drafter
        self.lookup = lookup or PromptLookupDrafter(*LOOKUP_NGRAMS)
        self.min_match = min_match
        self.lookup_steps = self.model_steps = 0
        self.lookup_nodes = 0

    @property
    def inner(self) -> Drafter:  # what is not the lookup's is the model drafter's (hidden layers, compile, commit)
        return self.model_drafter

    def for_call(self) -> "CompositeDrafter":
        call = copy.copy(self)
        call.model_drafter, call.lookup = self.model_drafter.for_call(), self.lookup.for_call()
        return call

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: CacheSession | None = None, hidden: torch.Tensor | None = None) -> None:
        self.lookup_steps = self.model_steps = self.lookup_nodes = 0
        self.lookup.start(input_ids, attention_mask, max_len)
        self.model_drafter.start(input_ids, attention_mask, max_len, verifier=verifier, hidden=hidden)

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        copied = self.lookup.propose(rows, k, ctx)
        if copied.num_tokens >= min(self.min_match, k) > 0:
            self.lookup_steps += 1
            return copied  # deterministic: the acceptance rule treats it as one-hot q
        self.model_steps += 1
        return self.model_drafter.propose(rows, k, ctx)

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        """Where a row's text repeats (a continuation of at least ``min_match`` tokens), the lookup's own tree and
        the model drafter rests, as chains do (rows without a continuation draft nothing that pass); otherwise
        the model drafter's tree with the lookup's best continuation merged in as one more branch of the root
        (shared prefixes merge; the model's nodes keep their indices, so it commits its own part).

        Why the first case: running the model drafter on passes the lookup covers is what made composite trees
        lose to composite chains on copy-heavy text (Spec-Bench summarization and RAG, int8 self-copy: 1.07x
        against 1.31x ``hf``, BENCHMARKS.md section 13)."""
        branches = self.lookup.branches(rows, shape.depth, 1)
        if shape.depth > 0 and any(branch and len(branch[0]) >= self.min_match for branch in branches):
            self.lookup_steps += 1
            return self.lookup.propose_tree(rows, shape, ctx)
        self.model_steps += 1
        tree = self.model_drafter.propose_tree(rows, shape, ctx)
        merged, sizes = [], []
        for b, branch in enumerate(branches):
            own = RowTree.from_tree(tree, b, values=False)  # its tokens: the model's host copy, or one read per tree
            size = len(own)
            if branch and len(branch[0]) >= self.min_match:
                own.add_path(branch[0], [0.0] * len(branch[0]))
                self.lookup_nodes += len(own) - size
            merged.append(own)
            sizes.append(size)
        width = max(map(len, merged))
        own = torch.arange(width, device=rows.device) < upload(sizes, torch.long, rows.device).unsqueeze(1)
        out = pack(merged, rows.device, ctx.vocab_size, _merged_values(tree.values, own))
        out.probs = _merged_laws(tree.probs, out, own)
        return out

    # commit is the model drafter's: a no-op for it when the lookup proposed

    def stats(self) -> dict[str, float]:
        return {"lookup_steps": self.lookup_steps, "model_steps": self.model_steps, "lookup_tree_nodes": self.lookup_nodes,
                **self.model_drafter.stats()}

    def keep_rows(self, indices: torch.Tensor) -> None:
        self.lookup.keep_rows(indices)
        self.model_drafter.keep_rows(indices)

    def finish(self) -> None:
        self.lookup.finish()
        self.model_drafter.finish()


def _merged_laws(laws: torch.Tensor | None, merged: DraftTree, own: torch.Tensor) -> torch.Tensor | None:
    """The merged trees' node laws ``[B, N, V]`` where the model drew its children (``laws``, else ``None``): the
    model's own nodes (``own [B, N]``) keep theirs, the lookup's (deterministic given the context, each after the
    siblings the model drew) are one-hot. Exact: a lookup node exists or merges depending only on its ancestors and
    earlier siblings."""
    if laws is None:
        return None
    vocab = laws.shape[-1]
    fixed = torch.zeros(*merged.tokens.shape, vocab, dtype=laws.dtype, device=laws.device)
    fixed.scatter_(-1, merged.tokens.clamp(max=vocab - 1).unsqueeze(-1), 1.0)
    return torch.where(own.unsqueeze(-1), _to_width(laws, own.shape[1]), fixed)


def _merged_values(values: torch.Tensor | None, own: torch.Tensor) -> torch.Tensor | None:
    """The merged trees' values ``[B, N]`` on the device: the model's nodes (``own [B, N]``, each row's first ones)
    keep their values, the lookup's after them are worth 0 (as :class:`RowTree` values them). No device read."""
    if values is None:
        return None
    return torch.where(own, _to_width(values, own.shape[1]), 0.0)


def _to_width(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t [B, n, ...]`` cut or zero-padded to ``width`` nodes."""
    n = t.shape[1]
    return t[:, :width] if n >= width else torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, width - n))
