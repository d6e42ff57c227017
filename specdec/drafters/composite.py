"""Composite drafting: copy from the context when it repeats itself, otherwise ask the model drafter."""

from __future__ import annotations

import torch

from specdec.drafters.base import DraftContext, Drafter, Proposal
from specdec.drafters.prompt_lookup import PromptLookupDrafter


class CompositeDrafter:
    """Prompt lookup when it finds a continuation of at least ``min_match`` tokens, the model drafter otherwise.

    The lookup is free, so it is tried first; the model drafter is kept in sync either way (it
    catches up on the committed tokens at its next proposal), and there is never an extra verifier pass.

    Args:
        model_drafter: any drafter (usually a :class:`~specdec.drafters.ModelDrafter`).
        lookup: the n-gram drafter; its proposal is used when it covers at least ``min_match`` tokens.
    """

    def __init__(self, model_drafter: Drafter, lookup: PromptLookupDrafter | None = None, min_match: int = 2) -> None:
        self.model_drafter = model_drafter
        self.lookup = lookup or PromptLookupDrafter(min_ngram=2, max_ngram=4)
        self.min_match = min_match
        self.lookup_steps = self.model_steps = 0

    @property
    def forwards(self) -> int:
        return getattr(self.model_drafter, "forwards", 0)

    @property
    def model(self):
        """The model behind the model drafter (for memory planning)."""
        return getattr(self.model_drafter, "model", None)

    def compile(self) -> None:
        """Compile the model drafter's forwards (the lookup has none)."""
        if hasattr(self.model_drafter, "compile"):
            self.model_drafter.compile()

    def prime(self) -> None:
        if hasattr(self.model_drafter, "prime"):
            self.model_drafter.prime()

    def share_prompt(self, verifier) -> None:
        if hasattr(self.model_drafter, "share_prompt"):
            self.model_drafter.share_prompt(verifier)

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int) -> None:
        self.lookup.start(input_ids, attention_mask, max_len)
        self.model_drafter.start(input_ids, attention_mask, max_len)

    def propose(self, rows: list[torch.LongTensor], k: int, ctx: DraftContext) -> Proposal:
        copied = self.lookup.propose(rows, k, ctx)
        if copied.num_tokens >= min(self.min_match, k) > 0:
            self.lookup_steps += 1
            return copied  # deterministic: the acceptance rule treats it as one-hot q
        self.model_steps += 1
        return self.model_drafter.propose(rows, k, ctx)

    def commit(self, rows: list[torch.LongTensor]) -> None:
        self.model_drafter.commit(rows)

    def keep_rows(self, indices: torch.Tensor) -> None:
        self.lookup.keep_rows(indices)
        self.model_drafter.keep_rows(indices)

    def finish(self) -> None:
        self.lookup.finish()
        self.model_drafter.finish()
