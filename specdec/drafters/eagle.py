"""EAGLE-style draft heads as drafters: a small head reads the verifier's own hidden states.

The head keeps its own KV cache (:class:`~specdec.heads.modules.HeadCache`); its slot ``i`` of a row holds
the pair (verifier feature at position ``i``, token ``i + 1``). Features arrive with the prompt
(``start(hidden=...)``) and with every verification (``Commit.hidden``); they wait as *pending* until the
token after them is committed, and :meth:`EagleDrafter.propose` feeds them in one pass whose last output
gives the first draft. Later drafts feed the head's own output back. Draft slots are dropped at the next
commit, since the verifier's real features replace them (as in EAGLE).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdec.acceptance import draft_distribution
from specdec.drafters.base import Drafter
from specdec.protocol import Commit, DraftContext, Proposal, Rows
from specdec.drafters.model import processed_scores
from specdec.heads.checkpoint import load_head, verifier_shape
from specdec.heads.modules import CachedKeyValues, EagleHead, HeadCache, TreeKeyValues
from specdec.trees.build import TreeShape, grow_tree
from specdec.trees.tree import DraftTree


class EagleDrafter(Drafter):
    """Draft with an EAGLE-1/2 or EAGLE-3 head (:func:`specdec.heads.load_head`) for ``verifier``."""

    supports_tree = True

    def __init__(self, head: EagleHead, verifier: Any) -> None:
        self.head = head
        _, layers, _ = verifier_shape(verifier)
        self.hidden_layers = (layers,) if head.config.kind == "eagle" else tuple(head.config.aux_layers)
        self._cache: HeadCache | None = None
        self._pending: list[torch.Tensor] = []  # per row: features whose next token was not yet fed
        self._pads: list[int] = []  # per row: left padding of its prompt
        self._committed: torch.Tensor | None = None
        c = head.config
        identity = c.kind == "eagle" or (c.draft_vocab_size == c.vocab_size and not bool(head.d2t.any()))
        # verifier ids of the head's vocabulary rows; None when they are the verifier's ids already
        self._draft_ids = None if identity else head.to_target(torch.arange(c.draft_vocab_size, device=head.d2t.device))

    @classmethod
    def from_pretrained(cls, directory: str | Path, verifier: Any) -> "EagleDrafter":
        """Load the head in ``directory`` (EAGLE-1/2 or EAGLE-3 layout) for ``verifier``."""
        return cls(load_head(directory, verifier), verifier)

    @property
    def kind(self) -> str:
        return self.head.config.kind

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: Any = None, hidden: torch.Tensor | None = None) -> None:
        if hidden is None:
            raise ValueError("an EAGLE drafter needs the verifier's prompt hidden states (start(hidden=...))")
        self.forwards = 0
        batch = input_ids.shape[0]
        self._pads = [0] * batch if attention_mask is None else (attention_mask == 0).sum(dim=1).tolist()
        c, p = self.head.config, next(self.head.parameters())
        self._cache = HeadCache(len(self.head.decoder_layers), batch, max_len + 1, c.num_key_value_heads, c.head_dim,
                                p.dtype, p.device)
        self._pending = [hidden[b, pad:] for b, pad in enumerate(self._pads)]
        self._committed = self._cache.lengths.clone()

    def _feed_pending(self, rows: Rows) -> torch.Tensor:
        """Feed every row's pending (feature, next token) pairs in one pass; the output after each row's last."""
        cache, counts = self._cache, [len(p) for p in self._pending]
        width, lengths = max(counts), cache.lengths.tolist()
        device = cache.lengths.device
        feats = torch.zeros(len(rows), width, self._pending[0].shape[-1], dtype=self._pending[0].dtype, device=device)
        tokens = torch.zeros(len(rows), width, dtype=torch.long, device=device)
        for b, (pending, n) in enumerate(zip(self._pending, counts)):
            start = self._pads[b] + lengths[b] + 1  # the token after slot lengths[b], in the padded row
            feats[b, :n] = pending
            tokens[b, :n] = rows[b][start:start + n]
        out = self._run(tokens, feats, own=False)
        cache.lengths = cache.lengths + torch.tensor(counts, dtype=torch.long, device=device)
        self._pending = []
        last = torch.tensor([n - 1 for n in counts], dtype=torch.long, device=device)
        return out[torch.arange(len(rows), device=device), last].unsqueeze(1)

    def _run(self, tokens: torch.Tensor, feats: torch.Tensor, own: bool) -> torch.Tensor:
        head, cache = self.head, self._cache
        embeds = head.embed(tokens)
        hidden = head.input_hidden(embeds, feats.to(embeds.dtype), own=own)
        kv = CachedKeyValues(cache, tokens.shape[1])
        self.forwards += 1
        return head(embeds, hidden, kv.positions, kv)

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> Proposal:
        if k <= 0:
            return Proposal(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device), None)
        with torch.no_grad():
            out = self._feed_pending(rows)
            self._committed = self._cache.lengths.clone()
            ids, tokens, probs = rows.contexts(), [], []
            for i in range(k):
                logits = self.head.logits(out[:, -1])
                if ctx.do_sample or ctx.processors:
                    scores = processed_scores(self._full_vocab(logits), ids, ctx)
                    p = draft_distribution(scores)
                    token = torch.multinomial(p, 1, generator=ctx.generator).squeeze(-1) if ctx.do_sample else scores.argmax(-1)
                    if ctx.do_sample:
                        probs.append(p)
                    ids = [(owner, torch.cat([row, t.view(1)])) for (owner, row), t in zip(ids, token)]
                else:
                    token = self.head.to_target(logits.argmax(dim=-1))
                tokens.append(token)
                if i < k - 1:
                    out = self._run(token.unsqueeze(1), out, own=True)
                    self._cache.lengths = self._cache.lengths + 1
        return Proposal(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        """A static or dynamic tree (EAGLE-2): each depth's frontier runs through the head in one pass, each
        node attending to the committed slots and its own ancestors; the slots go at the next commit."""
        with torch.no_grad():
            out = self._feed_pending(rows)[:, -1]  # [B, H]: the output that predicts the first draft
            self._committed = base = self._cache.lengths.clone()
            outputs: list[torch.Tensor] = []  # per expansion: [B, F, H], in feed order

            def expand(tokens, depth, parent_pos, visible):
                fed = torch.cat([out.unsqueeze(1)] + outputs, dim=1)  # feed position p is at p + 1
                feats = fed.gather(1, (parent_pos + 1)[..., None].expand(-1, -1, fed.shape[-1]))
                embeds = self.head.embed(tokens)
                hidden = self.head.input_hidden(embeds, feats.to(embeds.dtype), own=True)
                kv = TreeKeyValues(self._cache, base, visible, depth)
                self.forwards += 1
                h = self.head(embeds, hidden, kv.positions, kv)
                outputs.append(h)
                return self._full_vocab(self.head.logits(h))

            root = self._full_vocab(self.head.logits(out))
            grown = grow_tree(root, expand, shape, rows, ctx, lambda logits, contexts: processed_scores(logits, contexts, ctx))
        return grown.tree

    def _full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits spread over the verifier's vocabulary (-inf where the head cannot draft)."""
        if self._draft_ids is None:
            return logits
        full = logits.new_full(logits.shape[:-1] + (self.head.config.vocab_size,), float("-inf"))
        full[..., self._draft_ids] = logits
        return full

    def commit(self, update: Commit) -> None:
        self._cache.lengths = self._committed.clone()  # drafts' slots go: the verifier's features replace them
        hidden, added = update.hidden, update.added.tolist()
        if hidden is None:
            raise ValueError("an EAGLE drafter needs the verifier's hidden states in every Commit")
        fresh = [hidden[b, :n] for b, n in enumerate(added)]
        # another drafter may have proposed this step (composite): features not fed yet stay pending
        self._pending = [torch.cat([old, new]) for old, new in zip(self._pending, fresh)] if self._pending else fresh

    def keep_rows(self, indices: torch.Tensor) -> None:
        self._cache.keep_rows(indices)
        self._committed = self._committed.index_select(0, indices.to(self._committed.device))
        index = indices.tolist()
        self._pads = [self._pads[i] for i in index]
        if self._pending:
            self._pending = [self._pending[i] for i in index]

    def finish(self) -> None:
        self._cache, self._pending, self._committed = None, [], None
