"""outlines' ``OutlinesCoreLogitsProcessor`` (its default backend) under speculation: a guide per row, rolled back.

The library's processor makes one ``outlines_core.Guide`` per row on its first call and from then on
advances each row's guide by the row's last token, unless the guide has finished and refuses it. Here
each row's guide is brought to the asked context with ``rollback_state``, then masked with the
library's own kernels.
"""

from __future__ import annotations

import torch

from specdec.constraints.base import PrefixConstraint, shared_prefix


class OutlinesCoreRow(PrefixConstraint):
    """One row of an outlines-core processor (``index``: its ``outlines_core.Index``)."""

    def __init__(self, index, prompt_length: int) -> None:
        from outlines_core import Guide
        from outlines_core.kernels import torch as kernels

        super().__init__(prompt_length)
        self.guide = Guide(index, max_rollback=2**31 - 1)
        self.kernels = kernels
        self.bitmask: torch.Tensor | None = None  # sized by the first scores, as the library does
        self.fed: list[tuple[int, bool]] = []  # (token, whether the guide advanced on it)

    def _sync(self, tokens: list[int]) -> bool:
        common = shared_prefix([t for t, _ in self.fed], tokens)
        undo = sum(advanced for _, advanced in self.fed[common:])
        if undo:
            self.guide.rollback_state(undo)
        del self.fed[common:]
        for t in tokens[common:]:
            if not self.guide.accepts_tokens([t]):
                if not self.guide.is_finished():
                    return False  # a token the grammar forbids
                self.fed.append((t, False))  # the library skips a finished guide's refused tokens
                continue
            self.guide.advance(token_id=t, return_tokens=False)
            self.fed.append((t, True))
        return True

    def _fill(self, vocab_size: int) -> torch.Tensor:
        if self.bitmask is None:
            self.bitmask = self.kernels.allocate_token_bitmask(vocab_size)
        self.kernels.fill_next_token_bitmask(self.guide, self.bitmask)
        return self.bitmask

    def valid_prefix(self, tokens: list[int]) -> int:
        return len(tokens) if self._sync(tokens) else len(self.fed)  # on a refusal, fed is the accepted prefix

    def mask(self, tokens: list[int], scores: torch.FloatTensor) -> torch.FloatTensor:
        self._sync(tokens)
        self._fill(scores.shape[-1])
        out = scores.clone()
        self.kernels.apply_token_bitmask_inplace(out, self.bitmask.to(out.device, non_blocking=True))
        return out


def outlines_core_rows(processor, prompt_length: int, batch_size: int) -> list[OutlinesCoreRow]:
    """A row constraint per row for ``processor`` (one grammar for the whole batch, as the library has)."""
    return [OutlinesCoreRow(processor.index, prompt_length) for _ in range(batch_size)]
