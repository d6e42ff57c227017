"""A drafter with another tokenizer than the verifier's (Timor et al., ICML 2025; transformers'
``AssistedCandidateGeneratorDifferentTokenizers`` and ``UniversalSpeculativeDecodingGenerator``, both batch 1).

Each pass, every row's committed text is tokenized again in the draft vocabulary. The draft model keeps one managed
cache for the whole batch: each row is cropped to the longest prefix of draft tokens it shares with what was fed
(a token boundary that moved, the rejected drafts), the rest is fed in one ragged forward, and the batch drafts
``k`` tokens together. What the drafts become:

- greedy, string-level exact match (SLEM): the drafted text, tokenized again in the verifier's vocabulary after the
  context's last few verifier tokens (``lookbehind``, so that a merge across the boundary shows: where those tokens
  do not come back unchanged, the row proposes nothing this pass). The drafts are deterministic (one-hot ``q``).
- sampling, token-level intersection (TLI): each draft is sampled from the drafter's distribution restricted to the
  tokens both vocabularies share (:mod:`specdec.drafters.shared_vocab`), through the call's logits processors, and
  is that shared token's verifier id; its probabilities are ``q`` for rejection sampling. A pair that shares too
  little is refused (:class:`~specdec.drafters.shared_vocab.SharedVocabularyError`).

Trees (:meth:`CrossVocabDrafter.propose_tree`) are drafted under TLI, greedy or sampled: every node is a shared
token, fed to the drafter by its draft id under the tree's mask, its children the drafter's top-ranked shared tokens
(or drawn ones in a ``static`` tree under sampling: :func:`specdec.trees.build.grow_tree`).

Either way the verifier decides, so the output is the verifier's; what the tokenizers disagree on costs acceptance.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.drafters.base import Drafter
from specdec.drafters.scores import draw, extended, processed_scores
from specdec.drafters.prompt_lookup import chain_of
from specdec.drafters.shared_vocab import SAMPLE, SharedVocab
from specdec.protocol import DraftChain, DraftContext, Rows
from specdec.trees.build import TreeShape, grow_tree
from specdec.trees.tree import DraftTree
from specdec.runners.hf import CausalLMRunner
from specdec.runners.session import CacheSession
from specdec.transfer import upload

LOOKBEHIND = 8  # verifier tokens before the drafts that are tokenized again with them
_ROOM = 64  # draft-cache slots past the expected need (a compaction, then a new cache, when they run out)


class CrossVocabDrafter(Drafter):
    """``model`` (any causal LM) drafting for a verifier whose tokenizer differs from its own, ``draft_tokenizer``."""

    supports_tree = True

    def __init__(self, model: torch.nn.Module, draft_tokenizer: Any, verifier_tokenizer: Any,
                 lookbehind: int = LOOKBEHIND, sample: str = SAMPLE) -> None:
        """``sample``: the text on which the share of verifier tokens the vocabularies share is measured."""
        self.sample = sample
        self._model, self.dtok, self.vtok, self.lookbehind = model.eval(), draft_tokenizer, verifier_tokenizer, lookbehind
        self.runner = CausalLMRunner(model, role="drafter")
        self._shared: dict[str, SharedVocab] = {}  # per device, built at the first sampled call, shared by every copy
        self._session: CacheSession | None = None
        self._fed: list[list[int]] = []  # per row: the draft tokens its cache holds, in order
        self._budget = 0
        self.forwards = 0

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    @property
    def draft_tokenizer(self) -> Any:
        return self.dtok

    def shared_vocab(self, device: torch.device | str = "cpu") -> SharedVocab:
        """The tokens the two vocabularies share, on ``device`` (built once; :meth:`SharedVocab.check` not applied)."""
        if "cpu" not in self._shared:
            self._shared["cpu"] = SharedVocab.of(self.dtok, self.vtok, self.sample)
        key = str(device)
        if key not in self._shared:
            self._shared[key] = self._shared["cpu"].to(device)
        return self._shared[key]

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, **_: Any) -> None:
        self._session, self._fed, self.forwards = None, [[] for _ in range(input_ids.shape[0])], 0
        self._budget = 2 * (max_len - input_ids.shape[1]) + _ROOM  # draft tokens past the prompt's, roughly

    @torch.no_grad()
    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        if k <= 0:
            return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device))
        contexts = [rows.host(b)[rows.pads[b]:] for b in range(len(rows))]
        ids = [self._draft_ids(c) for c in contexts]
        logits = self._catch_up(ids, k, rows.device)
        if ctx.do_sample:
            return self._sample(rows, ids, logits, k, ctx)
        drafted = []
        for i in range(k):
            drafted.append(logits.argmax(dim=-1))
            if i < k - 1:
                logits = self._step(drafted[-1])
        new = torch.stack(drafted, dim=1).tolist()  # the pass's one read of the drafts
        self._fed = [row + d[: k - 1] for row, d in zip(ids, new)]
        eos = self.dtok.eos_token_id
        new = [d[: d.index(eos) + 1] if eos in d else d for d in new]
        return chain_of([self._verifier_tokens(c, i, n, k) for c, i, n in zip(contexts, ids, new)], rows, ctx)

    def _sample(self, rows: Rows, ids: list[list[int]], logits: torch.Tensor, k: int, ctx: DraftContext) -> DraftChain:
        """TLI: ``k`` verifier tokens per row, each sampled from the drafter's distribution over the shared tokens."""
        shared = self.shared_vocab(logits.device)
        shared.check()
        vocab = ctx.vocab_size or shared.verifier_size
        contexts, tokens, probs = rows.contexts(), [], []
        for i in range(k):
            token, p = draw(processed_scores(shared.verifier_scores(logits, vocab), contexts, ctx), ctx)
            tokens.append(token)
            probs.append(p)
            if ctx.processors:
                contexts = extended(contexts, token)
            if i < k - 1:
                logits = self._step(shared.to_draft[token].clamp_min(0))  # -1: a processor left no shared token
        tokens_ = torch.stack(tokens, dim=1)
        fed = shared.to_draft[tokens_[:, : k - 1]].clamp_min(0).tolist()
        self._fed = [row + f for row, f in zip(ids, fed)]
        return DraftChain(tokens_, torch.stack(probs, dim=1))

    @torch.no_grad()
    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        """A tree of shared tokens per row (TLI, greedy or sampled); a pair sharing too little is refused
        (:class:`~specdec.drafters.shared_vocab.SharedVocabularyError`). The nodes fed to the drafter are dropped at
        the next pass's catch-up, which feeds the committed text again from where it parts from the cache."""
        ids = [self._draft_ids(rows.host(b)[rows.pads[b]:]) for b in range(len(rows))]
        root = self._catch_up(ids, shape.config.max_fed + 1, rows.device)
        shared = self.shared_vocab(root.device)
        shared.check(trees=True)
        vocab = ctx.vocab_size or shared.verifier_size
        before = self._session.counts.clone()

        def expand(tokens, depth, parent_pos, visible):
            self.forwards += 1
            logits = self._session.forward(shared.to_draft[tokens].clamp_min(0), position_ids=before.unsqueeze(1) + depth - 1,
                                           tree_mask=visible).logits
            return shared.verifier_scores(logits.flatten(0, 1), vocab).view(*tokens.shape, vocab)

        grown = grow_tree(shared.verifier_scores(root, vocab), expand, shape, rows, ctx,
                          lambda logits, contexts: processed_scores(logits, contexts, ctx))
        self._fed = ids
        return grown.tree

    def _draft_ids(self, context: list[int]) -> list[int]:
        """The draft tokens of a row's text (verifier ids ``context``); never empty."""
        ids = self.dtok(self.vtok.decode(context, skip_special_tokens=True)).input_ids
        if ids:
            return ids
        start = self.dtok.bos_token_id if self.dtok.bos_token_id is not None else self.dtok.eos_token_id
        return [start if start is not None else 0]

    def _catch_up(self, ids: list[list[int]], k: int, device: torch.device) -> torch.Tensor:
        """Crop each row's cache to the prefix it shares with ``ids`` (at least one token left to feed), feed the
        rest in one ragged forward; the last logits ``[B, V_draft]``."""
        shared = []
        for row, fed in zip(ids, self._fed):
            n, top = 0, min(len(fed), len(row) - 1)
            while n < top and fed[n] == row[n]:
                n += 1
            shared.append(n)
        pending = [row[n:] for row, n in zip(ids, shared)]
        width = max(map(len, pending))
        self.forwards += 1
        session = self._session
        if session is not None:
            session.keep(shared)
            if session.length + width + k > session.cache.max_cache_len:  # the holes of ragged rollbacks
                session.compact()
            if session.length + width + k > session.cache.max_cache_len:
                session = None
        if session is None:
            return self._prefill(ids, device)
        return session.forward(*_right_aligned(pending, device), **self._extra()).logits[:, -1]

    def _prefill(self, ids: list[list[int]], device: torch.device) -> torch.Tensor:
        """A new cache holding ``ids`` (left padded): the first pass, or one whose rows outgrew the last."""
        if self._session is not None:
            self._session.release()
        block, real = _right_aligned(ids, device)
        self._session, out = self.runner.prefill(block, real, block.shape[1] + self._budget)
        return out.logits

    def _step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one draft token per row (``[B]``); the next logits."""
        self.forwards += 1
        return self._session.forward(tokens.unsqueeze(1), **self._extra()).logits[:, -1]

    def _extra(self) -> dict:
        return {"logits_to_keep": 1} if self.runner.keep_logits else {}

    def _verifier_tokens(self, context: list[int], ids: list[int], new: list[int], k: int) -> list[int]:
        """The verifier tokens of the text ``new`` adds to ``ids`` (draft ids), continuing ``context``; none where
        the draft text does not extend the context's text, or the boundary with it merges."""
        full, base = self.dtok.decode(ids + new, skip_special_tokens=True), self.dtok.decode(ids, skip_special_tokens=True)
        if not full.startswith(base) or len(full) == len(base):
            return []
        tail = context[-self.lookbehind:]
        again = self.vtok(self.vtok.decode(tail) + full[len(base):], add_special_tokens=False).input_ids
        if again[: len(tail)] != tail:
            return []
        return again[len(tail): len(tail) + k]

    def keep_rows(self, indices: torch.Tensor) -> None:
        index = indices.tolist()
        self._fed = [self._fed[i] for i in index]
        if self._session is not None:
            self._session.keep_rows(indices)

    def finish(self) -> None:
        if self._session is not None:
            self._session.release()
        self._session, self._fed = None, []

    def stats(self) -> dict[str, float]:
        return {"draft_forwards": float(self.forwards)}


def _right_aligned(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` of any lengths as ``(tokens, real)`` ``[B, longest]``, filler first: every forward ends with a real
    column (a prefill's left padding, a catch-up's ragged feed)."""
    width = max(map(len, rows))
    tokens = upload([[0] * (width - len(r)) + r for r in rows], torch.long, device)
    return tokens, upload([[False] * (width - len(r)) + [True] * len(r) for r in rows], torch.bool, device)
