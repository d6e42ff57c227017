"""A drafter with another tokenizer than the verifier's: string-level exact match (SLEM; Timor et al., ICML 2025).

The draft model drafts in its own vocabulary. Its drafts become text, and that text is tokenized again in the
verifier's vocabulary: those verifier tokens are the proposal. The verifier then checks them as it checks any
drafts. The drafts are deterministic, with a one-hot ``q``, so the output is the verifier's under greedy decoding and
under sampling alike; what the tokenizers disagree on only costs acceptance.

Per row, the draft model keeps its own KV cache over the draft tokens of the row's text. Each pass re-tokenizes the
committed text in the draft vocabulary, crops the cache to the longest prefix it shares with what was fed (a token
boundary that moved, the rejected drafts), and feeds the rest. The verifier tokens of the drafted text are found by
re-tokenizing it after the context's last few verifier tokens (``lookbehind``), so that a merge across the boundary
shows: where those tokens do not come back unchanged, the row proposes nothing this pass.

Rows are drafted one at a time (any batch, ragged). transformers' ``AssistedCandidateGeneratorDifferentTokenizers``
does the same at batch 1 only. Not yet: trees, and token-level intersection (TLI) for sampled drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.drafters.base import Drafter
from specdec.drafters.prompt_lookup import chain_of
from specdec.protocol import DraftChain, DraftContext, Rows
from specdec.runners.hf import cache_argument
from specdec.transfer import upload

LOOKBEHIND = 8  # verifier tokens before the drafts that are tokenized again with them


@dataclass
class _Row:
    """One row's draft-model state: the draft tokens its cache holds, and the cache."""

    fed: list[int] = field(default_factory=list)
    cache: Any = None


class CrossVocabDrafter(Drafter):
    """``model`` (any causal LM) drafting for a verifier whose tokenizer differs from its own, ``draft_tokenizer``."""

    supports_tree = False

    def __init__(self, model: torch.nn.Module, draft_tokenizer: Any, verifier_tokenizer: Any,
                 lookbehind: int = LOOKBEHIND) -> None:
        self._model, self.dtok, self.vtok, self.lookbehind = model, draft_tokenizer, verifier_tokenizer, lookbehind
        self._rows: list[_Row] = []
        self.forwards = 0
        self._cache_arg = cache_argument(model)

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, **_: Any) -> None:
        self._rows = [_Row() for _ in range(input_ids.shape[0])]
        self.forwards = 0

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        drafts = [self._draft(b, rows.host(b)[rows.pads[b] :], k) if k > 0 else [] for b in range(len(rows))]
        return chain_of(drafts, rows, ctx)

    @torch.no_grad()
    def _draft(self, b: int, context: list[int], k: int) -> list[int]:
        """Up to ``k`` verifier tokens for row ``b``, whose real tokens are ``context`` (verifier ids)."""
        row = self._rows[b]
        ids = self.dtok(self.vtok.decode(context, skip_special_tokens=True)).input_ids
        if not ids:
            return []
        shared = 0
        while shared < min(len(row.fed), len(ids) - 1) and row.fed[shared] == ids[shared]:
            shared += 1
        if row.cache is None or shared == 0:
            from transformers import DynamicCache

            row.cache, shared = DynamicCache(config=self.model.config), 0
        elif shared < len(row.fed):
            row.cache.crop(shared - len(row.fed))  # transformers 5 crops by a negative count
        device = next(self.model.parameters()).device
        logits = self._step(ids[shared:], row.cache, device)
        new: list[int] = []
        for i in range(k):
            new.append(int(logits.argmax()))
            if new[-1] == self.dtok.eos_token_id or i == k - 1:
                break
            logits = self._step(new[-1:], row.cache, device)
        row.fed = ids + new[:-1]
        return self._verifier_tokens(context, ids, new, k)

    def _step(self, tokens: list[int], cache: Any, device: torch.device) -> torch.Tensor:
        self.forwards += 1
        ids = upload(tokens, torch.long, device).view(1, -1)
        out = self.model(input_ids=ids, use_cache=True, **{self._cache_arg: cache})
        return out.logits[0, -1]

    def _verifier_tokens(self, context: list[int], ids: list[int], new: list[int], k: int) -> list[int]:
        """The verifier tokens of the text ``new`` adds to ``ids`` (draft ids), continuing ``context``; none where
        the draft text does not extend the context's text, or the boundary with it merges."""
        full, base = self.dtok.decode(ids + new, skip_special_tokens=True), self.dtok.decode(ids, skip_special_tokens=True)
        if not full.startswith(base) or len(full) == len(base):
            return []
        tail = context[-self.lookbehind :]
        again = self.vtok(self.vtok.decode(tail) + full[len(base) :], add_special_tokens=False).input_ids
        if again[: len(tail)] != tail:
            return []
        return again[len(tail) : len(tail) + k]

    def keep_rows(self, indices: torch.Tensor) -> None:
        self._rows = [self._rows[i] for i in indices.tolist()]

    def finish(self) -> None:
        self._rows = []

    def stats(self) -> dict[str, float]:
        return {"draft_forwards": float(self.forwards)}
