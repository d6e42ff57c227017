"""xgrammar's ``xgrammar.contrib.hf.LogitsProcessor`` under speculation: a matcher per row, rolled back.

The library's processor keeps one ``GrammarMatcher`` per row and, from its second call on, accepts the
last token of each row; a terminated matcher is no longer advanced and its last mask stays in force. Here
each row's matcher is brought to the asked context (rollback to the prefix shared with the last context,
then accept the rest), which gives the same mask for every context ``generate`` would reach.
"""

from __future__ import annotations

import torch

from specdec.constraints.base import PrefixConstraint, shared_prefix


class XGrammarRow(PrefixConstraint):
    """One row of an xgrammar processor: ``compiled`` is that row's ``CompiledGrammar``."""

    def __init__(self, compiled, prompt_length: int) -> None:
        import xgrammar as xgr

        super().__init__(prompt_length)
        self._xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled)  # max_rollback_tokens=-1: any rejected run can be undone
        self.vocab_size = compiled.tokenizer_info.vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, self.vocab_size)
        self.fed: list[int] = []  # tokens the matcher has accepted, in order
        self.ended = False  # the matcher terminated on fed[-1]: later tokens are not fed (as the library does)

    def _sync(self, tokens: list[int]) -> bool:
        """Bring the matcher to ``tokens``; False when one of them breaks the grammar (it then stands at the
        longest allowed prefix)."""
        common = shared_prefix(self.fed, tokens)
        if common < len(self.fed):
            self.matcher.rollback(len(self.fed) - common)
            del self.fed[common:]
            self.ended = False
        for t in tokens[common:]:
            if self.ended:
                return True
            if not self.matcher.accept_token(t):
                return False
            self.fed.append(t)
            self.ended = self.matcher.is_terminated()
        return True

    def _fill(self) -> None:
        if self.ended:  # the library stops filling once terminated: the mask before the final token stays
            last = self.fed[-1]
            self.matcher.rollback(1)
            self.matcher.fill_next_token_bitmask(self.bitmask, 0)
            self.matcher.accept_token(last)
        else:
            self.matcher.fill_next_token_bitmask(self.bitmask, 0)

    def mask(self, tokens: list[int], scores: torch.FloatTensor) -> torch.FloatTensor:
        self._sync(tokens)
        self._fill()
        out = scores.to("cpu", copy=True) if scores.device.type != "cuda" else scores.clone()
        self._xgr.apply_token_bitmask_inplace(out, self.bitmask.to(out.device, non_blocking=True))
        return out.to(scores.device)

    def valid_prefix(self, tokens: list[int]) -> int:
        return len(tokens) if self._sync(tokens) else len(self.fed)  # on a refusal, fed is the accepted prefix

    def forced_text(self, tokens: list[int]) -> str:
        if not self._sync(tokens) or self.ended:
            return ""
        return self.matcher.find_jump_forward_string()


def xgrammar_rows(processor, prompt_length: int, batch_size: int) -> list[XGrammarRow]:
    """A row constraint per row of ``processor`` (one grammar for all rows, or one per row as the library takes)."""
    grammars = processor.compiled_grammars
    if len(grammars) not in (1, batch_size):
        raise ValueError(f"xgrammar LogitsProcessor has {len(grammars)} grammars for a batch of {batch_size}: "
                         "give one, or one per row")
    return [XGrammarRow(grammars[b if len(grammars) > 1 else 0], prompt_length) for b in range(batch_size)]
