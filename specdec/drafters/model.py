"""A drafter backed by any Hugging Face causal LM that shares the verifier's vocabulary."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from transformers import PreTrainedModel

from specdec.acceptance import draft_distribution
from specdec.drafters.base import Drafter
from specdec.errors import SpecdecError
from specdec.drafters.scores import extended, processed_scores
from specdec.protocol import Commit, DraftContext, DraftChain, Rows
from specdec.processing import RowContext
from specdec.trees.build import TreeShape, grow_tree
from specdec.trees.tree import DraftTree
from specdec.runners.hf import CausalLMRunner, lm_head_rows, shares_kv_layout
from specdec.runners.session import CacheSession
from specdec.slots import static_slots

# Vocabulary sizes may differ by embedding padding (rounded up to a multiple of 64/128...);
# a larger gap means a different tokenizer.
_MAX_VOCAB_PADDING = 1024
#: compile_graphs(): slots a static drafter cache keeps free past its rows' own for a padded pass (k + 1 <= this)
_STATIC_ROOM = 64
_TREE_WIDTHS = (1, 2, 4, 8, 16, 32, 64)  # compile_graphs(): a tree's passes, padded to the next of these


class VocabularyMismatchError(SpecdecError, ValueError):
    """The drafter and the verifier do not speak the same token ids."""


def check_vocab_compat(
    verifier: PreTrainedModel,
    drafter: PreTrainedModel,
    verifier_tokenizer: Any = None,
    drafter_tokenizer: Any = None,
) -> None:
    """Raise :class:`VocabularyMismatchError` if token ids of the two models do not mean the same thing.

    With both tokenizers, the token-to-id maps must agree on every id the verifier knows. Without
    them, the special token ids must agree and the head sizes may differ only by padding.
    """
    v_size, d_size = lm_head_rows(verifier), lm_head_rows(drafter)
    if d_size < v_size:  # it could never propose (nor give a probability to) the verifier's last ids
        raise VocabularyMismatchError(
            f"the drafter's vocabulary is smaller than the verifier's: drafter head {d_size} rows, verifier "
            f"{v_size}. A drafter must score every token id the verifier can emit."
        )
    if verifier_tokenizer is not None and drafter_tokenizer is not None:
        v_vocab, d_vocab = verifier_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
        if v_vocab != d_vocab:
            differ = [t for t in v_vocab if d_vocab.get(t) != v_vocab[t]][:5]
            raise VocabularyMismatchError(
                f"the drafter's tokenizer differs from the verifier's ({len(d_vocab)} vs {len(v_vocab)} tokens; "
                f"e.g. {differ} map to different ids). Speculative decoding needs one shared vocabulary."
            )
        return
    for name in ("eos_token_id", "bos_token_id"):
        v_id, d_id = getattr(verifier.config, name, None), getattr(drafter.config, name, None)
        if v_id is not None and d_id is not None and v_id != d_id:
            raise VocabularyMismatchError(
                f"{name} differs: verifier {v_id}, drafter {d_id}. The models use different tokenizers; "
                "pick a drafter from the verifier's model family."
            )
    if abs(v_size - d_size) > _MAX_VOCAB_PADDING:
        raise VocabularyMismatchError(
            f"vocabulary sizes differ too much to be padding: verifier {v_size}, drafter {d_size}. "
            "The models use different tokenizers; pick a drafter from the verifier's model family."
        )
    if v_size != d_size:
        warnings.warn(
            f"drafter head has {d_size} rows, verifier {v_size}: assuming embedding padding. "
            "Pass both tokenizers to specdec to check the vocabularies exactly.",
            stacklevel=3,
        )


class ModelDrafter(Drafter):
    """Drafts autoregressively with a (usually smaller or quantized) causal LM over its own managed cache.

    Its cache holds a prefix of each committed row (its *fed* tokens). After each verification the
    engine says how many drafts each row accepted; the fed prefix shrinks to what was committed, and
    the rest (the verifier's own token) is fed at the start of the next proposal.

    Trees (:meth:`propose_tree`): each depth's frontier runs in one batched pass over the cache, every node
    attending to the committed tokens and its own ancestors; at the commit the accepted path's fed nodes
    are gathered into place (``keep_slots``) and the rest of the tree is dropped.
    """

    supports_tree = True

    def __init__(
        self, model: PreTrainedModel, confidence_threshold: float | None = None, reuse_verifier_prompt: bool = False
    ) -> None:
        """``confidence_threshold``: stop drafting early once the drafter's top probability drops below it.
        ``reuse_verifier_prompt``: for drafters derived from the verifier (same key/value layout), start
        from the verifier's cached prompt instead of a prefill of its own."""
        if confidence_threshold is not None and not 0 <= confidence_threshold < 1:
            raise ValueError(f"confidence_threshold must be in [0, 1), got {confidence_threshold}")
        self.confidence_threshold = confidence_threshold
        self._model = model.eval()
        self.runner = CausalLMRunner(model, role="drafter")
        self.reuse_verifier_prompt = reuse_verifier_prompt
        self._session: CacheSession | None = None
        self._fed: list[int] = []  # per row: tokens (left padding included) whose keys are cached
        self._drafts_fed: int | None = None  # drafts fed at our last proposal, None once committed (or not ours)
        self._adopted = False
        self._tree_fed: list[list[int]] | None = None  # per row: feed position of each tree node (-1: not fed)
        self._tree_block = 0  # tree slots written by the last proposal
        self._static_widths: tuple[int, ...] = ()  # compile_graphs(): the static session's room at start

    @property
    def model(self) -> PreTrainedModel:
        return self._model

    def compile(self) -> None:
        """Run the drafter's forwards through ``torch.compile`` (see :meth:`CausalLMRunner.compile`)."""
        self.runner.compile()

    @property
    def captures_graphs(self) -> bool:
        return True

    def compile_graphs(self) -> None:
        """Run every forward after the prefill as a static pass (:mod:`specdec.runners.static`) replayed from a raw
        CUDA graph per shape (:mod:`specdec.runners.capture`): a chain's catch-up padded to ``k + 1`` and its draft
        steps at width 1, so a call meets two graphs per batch size. On a CPU the same static passes run eagerly.

        Raises :class:`~specdec.runners.UnsupportedModelError` for a model whose attention ignores custom masks
        (flash, flex) or that has recurrent layers, as ``compile_verifier`` does."""
        self.runner.compile_static({"backend": "graphs"})
        self._static_widths = (1, _STATIC_ROOM)

    def prime(self) -> None:
        """Compile now rather than in the first calls (see :meth:`CausalLMRunner.prime`)."""
        self.runner.prime()

    def check_tree_masks(self) -> None:
        self.runner.check_tree_masks()  # a tree feeds this model tree masks, as it feeds the verifier

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: CacheSession | None = None, hidden: torch.Tensor | None = None) -> None:
        adopt = (self.reuse_verifier_prompt and verifier is not None and verifier.length == input_ids.shape[1]
                 and shares_kv_layout(verifier.runner.model.config, self.model.config)
                 # static passes write in place, in the dtype the drafter computes in: known after its first forward
                 and not (self._static_widths and self.runner._kv_dtype is None))
        self._adopted = bool(adopt)
        widths = self._static_widths
        if widths:  # static passes: a cache rounded up as the verifier's is (calls of similar lengths share graphs)
            max_len = static_slots(max_len, widths)
        if adopt:
            self._session, self.forwards = self.runner.adopt(verifier, max_len, widths=widths), 0
        else:
            self._session, _ = self.runner.prefill(input_ids, attention_mask, max_len, widths=widths)
            self.forwards = 1
        self._fed = [input_ids.shape[1]] * input_ids.shape[0]
        self._drafts_fed = None

    def _scores(self, logits: torch.Tensor, contexts: list[RowContext], ctx: DraftContext) -> torch.Tensor:
        return processed_scores(logits, contexts, ctx)

    def _catch_up(self, rows: Rows) -> torch.Tensor:
        """Feed what each row committed since our last forward (left-aligned with filler); last logits."""
        pending = [rows[b][fed:] for b, fed in enumerate(self._fed)]
        sizes = [rows.length(b) - fed for b, fed in enumerate(self._fed)]
        width = max(sizes)
        self.forwards += 1
        if min(sizes) == width:  # every row feeds as many: no filler, no mask (and no device read for one)
            block = pending[0].unsqueeze(0) if len(rows) == 1 else torch.stack(pending)
            return self._session.forward(block, **self._extra()).logits[:, -1]
        block = torch.zeros(len(rows), width, dtype=torch.long, device=rows.device)
        real = torch.zeros(len(rows), width, dtype=torch.bool, device=rows.device)
        for b, p in enumerate(pending):
            block[b, width - len(p) :], real[b, width - len(p) :] = p, True
        return self._session.forward(block, real, **self._extra()).logits[:, -1]

    def _extra(self) -> dict:
        return {"logits_to_keep": 1} if self.runner.keep_logits else {}

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        if k <= 0:
            return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device), None)
        static = self._session.static is not None
        if static:  # the catch-up always padded to k + 1, then one-token steps: two graphs, the same every pass
            self._session.widths = (k + 1,)
        logits = self._catch_up(rows)
        if static:
            self._session.widths = (1,)
        ids, tokens, probs, fed = rows.contexts(), [], [], 0
        for i in range(k):
            scores = self._scores(logits, ids, ctx)
            p = draft_distribution(scores) if ctx.do_sample or self.confidence_threshold else None
            if ctx.do_sample:
                token = torch.multinomial(p, 1, generator=ctx.generator).squeeze(-1)
                probs.append(p)
            else:
                token = scores.argmax(dim=-1)
            tokens.append(token)
            if ctx.processors:  # processors read the context: extend each row by its draft
                ids = extended(ids, token)
            # An unsure drafter is likely wrong: stop and let the verifier speak (keep >= 1 draft).
            if self.confidence_threshold and bool((p.max(dim=-1).values < self.confidence_threshold).all()):
                break
            if i < k - 1:
                logits = self._session.forward(token.unsqueeze(-1), **self._extra()).logits[:, -1]
                self.forwards += 1
                fed += 1
        self._drafts_fed = fed
        self._fed = [rows.length(b) + fed for b in range(len(rows))]
        return DraftChain(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        if self._session.static is not None:  # frontiers of any size: a handful of padded widths
            self._session.widths = _TREE_WIDTHS
        root = self._catch_up(rows)
        before, written = self._session.counts.clone(), [0]

        def expand(tokens, depth, parent_pos, visible):
            self.forwards += 1
            written[0] += tokens.shape[1]
            positions = before.unsqueeze(1) + depth - 1
            return self._session.forward(tokens, position_ids=positions, tree_mask=visible).logits

        grown = grow_tree(root, expand, shape, rows, ctx, lambda logits, contexts: self._scores(logits, contexts, ctx))
        self._fed = [rows.length(b) for b in range(len(rows))]
        self._tree_fed, self._tree_block = (grown.fed, written[0]) if written[0] else (None, 0)  # host ints
        self._drafts_fed = None
        return grown.tree

    def _commit_tree(self, update: Commit) -> None:
        """Keep the accepted path's fed nodes (a prefix of the path, never the newest committed token), from host
        ints alone: the feed positions the tree was grown with and the path the engine read."""
        fed, self._tree_fed, block = self._tree_fed, None, self._tree_block
        path, accepted, added = update.path_lists(), update.accepted_host, update.added_host
        keep: list[list[int]] = []
        for b, row in enumerate(fed):
            kept = []
            for node in path[b][: min(accepted[b], added[b] - 1)]:
                pos = row[node] if node < len(row) else -1  # composite: lookup nodes were never fed
                if pos < 0:
                    break
                kept.append(pos)  # ascending: an ancestor was fed before its descendants
            keep.append(kept)
            self._fed[b] += len(kept)
        self._session.keep_slots(keep, block)

    def commit(self, update: Commit) -> None:
        if self._tree_fed is not None:
            return self._commit_tree(update)
        if self._drafts_fed is None:  # another drafter proposed this step (composite): our fed prefix is still committed
            return
        accepted, added = update.accepted_host, update.added_host
        # fed drafts that were accepted stay; always leave >= 1 committed token to feed next time
        fed = self._drafts_fed
        kept = [min(a, fed, n - 1) for a, n in zip(accepted, added)]
        self._fed = [f - fed + k for f, k in zip(self._fed, kept)]
        self._drafts_fed = None
        # the fed drafts are the session's newest slots; on the device kept = min(accepted, fed) unless a stop cut a row
        self._session.keep_recent(fed, kept, update.accepted.clamp(max=fed) if update.steady else None)

    def stats(self) -> dict[str, float]:
        return {"adopted_prompt": self._adopted}  # started from the verifier's prompt cache (no prefill)

    def keep_rows(self, indices: torch.Tensor) -> None:
        self._session.keep_rows(indices)
        index = indices.tolist()
        self._fed = [self._fed[i] for i in index]

    def finish(self) -> None:
        if self._session is not None:
            self._session.release()
        self._session, self._fed, self._drafts_fed, self._tree_fed = None, [], None, None


def _derived_from(draft: torch.nn.Module, verifier: torch.nn.Module) -> bool:
    """Whether ``draft`` is built from ``verifier`` (a specdec.quant copy shares its embedding table)."""
    try:
        mine, theirs = draft.get_input_embeddings().weight, verifier.get_input_embeddings().weight
    except AttributeError:
        return False
    return draft is verifier or mine.data_ptr() == theirs.data_ptr()


def from_module(draft: torch.nn.Module, verifier: torch.nn.Module, verifier_tokenizer: Any, draft_tokenizer: Any) -> Drafter:
    """A :class:`ModelDrafter` for the causal LM ``draft`` (its vocabulary checked against the verifier's); one built
    from the verifier (a specdec.quant copy) adopts the verifier's cached prompt."""
    if verifier_tokenizer is not None and draft_tokenizer is not None \
            and verifier_tokenizer.get_vocab() != draft_tokenizer.get_vocab():  # another vocabulary: drafts go by text
        from specdec.drafters.cross_vocab import CrossVocabDrafter

        return CrossVocabDrafter(draft, draft_tokenizer, verifier_tokenizer)
    try:
        check_vocab_compat(verifier, draft, verifier_tokenizer, draft_tokenizer)
    except VocabularyMismatchError as err:
        raise VocabularyMismatchError(f"{err} (to draft across vocabularies, pass both tokenizers: tokenizer= and "
                                      "draft_tokenizer=)") from None
    return ModelDrafter(draft, reuse_verifier_prompt=_derived_from(draft, verifier))
