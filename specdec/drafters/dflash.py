"""DFlash drafters (``draft="dflash:DIR"``): a block of drafts from one forward of a few layers that read the verifier's
hidden states (:mod:`specdec.heads.dflash`).

Features arrive with the prompt (``start(hidden=...)``) and with every verification (``Commit.hidden``) and wait as
pending until the next proposal feeds them into the drafter's cache, in the same forward that drafts the block. The
block starts at the newest committed token, whose features the verifier has not computed yet. Each position's
distribution does not depend on the drafts before it, so sampled drafts are judged with exactly their ``q``; trees
take each depth's children from that depth's top-ranked tokens, with no further forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specdec.drafters.base import Drafter
from specdec.drafters.scores import chain_of_positions, tree_of_positions
from specdec.heads.dflash import DFlashModel, load_dflash
from specdec.heads.modules import HeadCache
from specdec.protocol import Commit, DraftChain, DraftContext, Rows, left_pads
from specdec.transfer import upload
from specdec.trees.build import TreeShape
from specdec.trees.tree import DraftTree


class DFlashDrafter(Drafter):
    """Draft with the DFlash model ``dflash`` for ``verifier`` (whose embedding and LM head it shares)."""

    supports_tree = True

    def __init__(self, dflash: DFlashModel, verifier: Any) -> None:
        self.dflash = dflash
        self.hidden_layers = tuple(i + 1 for i in dflash.settings.target_layer_ids)
        self._embedding = verifier.get_input_embeddings().weight  # the raw table: no embedding scale of the verifier's
        self._head = verifier.get_output_embeddings()
        self._cache: HeadCache | None = None
        self._pending: list[torch.Tensor] = []  # per row: features not fed to the drafter's cache yet

    @classmethod
    def from_pretrained(cls, directory: str | Path, verifier: Any) -> "DFlashDrafter":
        return cls(load_dflash(directory, verifier), verifier)

    @property
    def block_size(self) -> int:
        return self.dflash.settings.block_size

    @property
    def compilable(self) -> bool:
        return False

    def cost_ratio(self, verifier: torch.nn.Module) -> float:
        """The drafter's layers and the verifier's LM head, over the verifier's bytes: one forward for the block."""
        from specdec.quant.memory import model_bytes

        own = model_bytes(self.dflash) + model_bytes(self._head)
        return min(1.0, max(0.02, own / max(model_bytes(verifier), 1)))

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: Any = None, hidden: torch.Tensor | None = None) -> None:
        if hidden is None:
            raise ValueError("a DFlash drafter needs the verifier's prompt hidden states (start(hidden=...))")
        self.forwards = 0
        pads = left_pads(attention_mask, input_ids.shape[0])
        self._pending = [hidden[b, pad:] for b, pad in enumerate(pads)]
        self._cache = self.dflash.new_cache(input_ids.shape[0], max_len + 1)

    def _block(self, rows: Rows, n: int) -> torch.Tensor:
        """Feed the pending features and draft a block of ``n + 1`` (the newest token, ``n`` masks) in one forward;
        the draft logits ``[B, n, V]`` of the next ``n`` tokens."""
        device = self._cache.lengths.device
        counts = [len(p) for p in self._pending]
        features = torch.zeros(len(rows), max(counts), self._pending[0].shape[-1], dtype=self._pending[0].dtype,
                               device=device)
        for b, pending in enumerate(self._pending):
            features[b, : counts[b]] = pending
        newest = rows.tokens.gather(1, (rows.lengths.to(rows.tokens.device) - 1).unsqueeze(1))
        ids = torch.cat([newest, newest.new_full((len(rows), n), self.dflash.settings.mask_token_id)], dim=1)
        block = torch.nn.functional.embedding(ids, self._embedding) * self.dflash.settings.embedding_scale
        self.forwards += 1
        hidden = self.dflash.draft(self._cache, features, upload(counts, torch.long, device), block)
        self._pending = []
        return self.dflash.logits(hidden[:, 1:], self._head)

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        k = min(k, self.block_size - 1)
        if k <= 0:
            return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device), None)
        with torch.no_grad():
            return chain_of_positions(self._block(rows, k), rows, ctx)

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        with torch.no_grad():
            logits = self._block(rows, max(1, min(shape.depth, self.block_size - 1)))
        return tree_of_positions(logits, shape, rows, ctx)

    def commit(self, update: Commit) -> None:
        if update.hidden is None:
            raise ValueError("a DFlash drafter needs the verifier's hidden states in every Commit")
        fresh = [update.hidden[b, :n] for b, n in enumerate(update.added_host)]
        # another drafter may have proposed this step (composite): features not fed yet stay pending
        self._pending = [torch.cat([old, new]) for old, new in zip(self._pending, fresh)] if self._pending else fresh

    def keep_rows(self, indices: torch.Tensor) -> None:
        index = indices.tolist()
        self._cache.keep_rows(upload(index, torch.long, self._cache.lengths.device))
        if self._pending:
            self._pending = [self._pending[i] for i in index]

    def finish(self) -> None:
        self._cache, self._pending = None, []
