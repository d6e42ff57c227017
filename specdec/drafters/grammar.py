"""Drafting that knows the grammar: text the grammar forces is proposed for free, drafts it forbids are cut.

Much of a schema-following JSON document is forced (keys, quotes, braces, ``": "``). Where the grammar
forces text from a row's committed point on, that text, tokenized, is the pass's proposal and the inner
drafter is not asked (it catches up at its next proposal, as inside a composite drafter). Otherwise the
inner drafter proposes; its chain is cut at the first token the grammar forbids (the verifier would reject
it, and everything after it, anyway), and with one row the room left is filled with the forced text that
follows the accepted drafts. Forced text is deterministic (one-hot ``q``): exact under sampling too.
Trees are drafted by the inner drafter alone.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.acceptance import one_hot
from specdec.constraints.adapt import has_constraint
from specdec.constraints.base import PrefixConstraint
from specdec.drafters.base import Drafter, WrappingDrafter
from specdec.processing import RowProcessors
from specdec.protocol import DraftContext, DraftChain, Rows, checked
from specdec.transfer import upload


def row_constraint(processors: RowProcessors, owner: int) -> PrefixConstraint | None:
    """The first grammar constraint among row ``owner``'s processors (``None`` without one)."""
    if not processors:
        return None
    return next((p for p in processors.for_row(owner) if isinstance(p, PrefixConstraint)), None)


class GrammarDrafter(WrappingDrafter):
    """``inner`` drafting under a grammar (see the module docstring).

    Args:
        inner: any drafter.
        tokenizer: encodes forced text; without one only the cut of forbidden drafts applies.
        min_forced: the shortest forced run (in tokens) proposed instead of asking ``inner``.
    """

    def __init__(self, inner: Drafter, tokenizer: Any = None, min_forced: int = 2) -> None:
        self.inner, self.tokenizer, self.min_forced = inner, tokenizer, min_forced
        self.forced_steps = self.forced_tokens = self.cut_tokens = 0

    def start(self, input_ids, attention_mask, max_len, *, verifier=None, hidden=None) -> None:
        self.forced_steps = self.forced_tokens = self.cut_tokens = 0
        super().start(input_ids, attention_mask, max_len, verifier=verifier, hidden=hidden)

    def _forced(self, constraint: PrefixConstraint | None, tokens: list[int]) -> list[int]:
        if constraint is None or self.tokenizer is None:
            return []
        text = constraint.forced_text(tokens[constraint.prompt_length:])
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        constraints = [row_constraint(ctx.processors, owner) for owner in rows.owners]
        forced = [self._forced(c, rows.host(b)) for b, c in enumerate(constraints)]
        n = min(map(len, forced))
        if n >= min(self.min_forced, k) > 0:
            self.forced_steps += 1
            self.forced_tokens += min(n, k) * len(rows)
            return DraftChain(upload([f[: min(n, k)] for f in forced], torch.long, rows.device))
        # checked here, not only by the plan: the inner drafter's ids are read below, and it is the one to name
        proposal = checked(self.inner.propose(rows, k, ctx), self.inner, rows, ctx, k, k)
        if proposal.num_tokens == 0:
            return proposal
        if proposal.drafted is None:  # no vocabulary size known: nothing was clamped
            drafts = proposal.tokens.tolist()  # grammars are matched on the host
        else:
            drafts = proposal.drafted.ids.tolist()
            proposal.drafted.check(drafts)
        valid = [len(d) if c is None else _valid_drafts(c, rows.host(b), d)
                 for b, (c, d) in enumerate(zip(constraints, drafts))]
        keep = max(valid)
        self.cut_tokens += (proposal.num_tokens - keep) * len(rows)
        if len(rows) == 1 and keep < k:  # one row: the room left goes to the text forced after its valid drafts
            tail = self._forced(constraints[0], rows.host(0) + drafts[0][:keep])[: k - keep]
            if tail:
                self.forced_tokens += len(tail)
                tokens = upload([drafts[0][:keep] + tail], torch.long, rows.device)
                probs = None if proposal.probs is None else torch.cat(
                    [proposal.probs[:, :keep], one_hot(tokens[:, keep:], proposal.probs.shape[-1], proposal.probs.dtype)], 1)
                return DraftChain(tokens, probs)
        if keep == proposal.num_tokens:
            return proposal
        return DraftChain(proposal.tokens[:, :keep], None if proposal.probs is None else proposal.probs[:, :keep])

    def stats(self) -> dict[str, float]:
        return {"grammar_forced_steps": self.forced_steps, "grammar_forced_tokens": self.forced_tokens,
                "grammar_cut_tokens": self.cut_tokens, **self.inner.stats()}


def _valid_drafts(constraint: PrefixConstraint, row: list[int], drafts: list[int]) -> int:
    """How many of ``drafts`` the grammar accepts after ``row`` (its committed tokens, prompt included)."""
    generated = row[constraint.prompt_length:]
    return constraint.valid_prefix(generated + drafts) - len(generated)


def constrained_drafter(drafter: Drafter, processors: RowProcessors, tokenizer: Any = None) -> Drafter:
    """``drafter`` wrapped in a :class:`GrammarDrafter` when the call's processors hold a grammar constraint."""
    if processors and has_constraint(processors.for_row(0)):
        return GrammarDrafter(drafter, tokenizer)
    return drafter
