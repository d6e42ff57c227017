"""Prompt-lookup (n-gram) drafting: no model, just copying.

The longest recent n-gram at the end of a row is looked up earlier in that row (prompt and
generated text); the tokens that followed its most recent earlier occurrence are the draft. It
shines where outputs copy inputs: summarisation, RAG, code editing.
"""

from __future__ import annotations

import torch

from specdec.drafters.base import DraftContext, Drafter, Proposal, Rows


def lookup(row: list[int], k: int, min_ngram: int, max_ngram: int) -> list[int]:
    """Up to ``k`` tokens following the latest earlier occurrence of the longest matching suffix n-gram."""
    length = len(row)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = row[length - n :]
        # scan right to left for the most recent occurrence that is not the suffix itself
        for start in range(length - n - 1, -1, -1):
            if row[start : start + n] == suffix:
                follow = row[start + n : start + n + k]
                if follow:
                    return follow
    return []


class PromptLookupDrafter(Drafter):
    """Drafts by n-gram lookup in each row's own context. Batch aware; deterministic (one-hot ``q``).

    Args:
        min_ngram / max_ngram: n-gram sizes tried, longest first.
        max_draft: cap on drafted tokens per step (the loop's ``k`` also caps it).
        window: how many recent tokens to search (bounds the cost on long contexts).
    """

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3, max_draft: int | None = None, window: int = 1024) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram, self.max_ngram, self.max_draft, self.window = min_ngram, max_ngram, max_draft, window
        self._pads: list[int] = []

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: object = None, hidden: torch.Tensor | None = None) -> None:
        batch = input_ids.shape[0]
        self._pads = [0] * batch if attention_mask is None else (attention_mask == 0).sum(dim=1).tolist()

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> Proposal:
        if self.max_draft is not None:
            k = min(k, self.max_draft)
        drafts = []
        for pad, row in zip(self._pads, rows):
            ids = row.tolist()
            context = ids[max(pad, len(ids) - self.window) :]
            drafts.append(lookup(context, k, self.min_ngram, self.max_ngram) if k > 0 else [])
        width = max((len(d) for d in drafts), default=0)
        if width == 0:
            return Proposal(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device))
        # Rows with shorter drafts repeat their last token (or the row's last token): any proposal is
        # safe, since only what the verifier agrees with is kept.
        padded = [d + [(d or [int(row[-1])])[-1]] * (width - len(d)) for d, row in zip(drafts, rows)]
        tokens = torch.tensor(padded, dtype=torch.long, device=rows.device)
        if ctx.vocab_size is not None:
            tokens = tokens.clamp(max=ctx.vocab_size - 1)
        return Proposal(tokens)

    def keep_rows(self, indices: torch.Tensor) -> None:
        self._pads = [self._pads[i] for i in indices.tolist()]
