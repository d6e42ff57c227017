"""The tokens two vocabularies share, by their text: what token-level intersection (TLI; Timor et al., ICML 2025)
drafts over when the drafter's tokenizer differs from the verifier's.

A token's text is what it adds when decoded after a plain anchor token (so that a tokenizer that drops a leading
space at the start of a text, as SentencePiece's decoders do, still shows it). Special tokens, empty texts and
partial UTF-8 bytes (decoded as U+FFFD) are left out. Where one text has several ids (a byte-fallback token and the
merged one), the id the tokenizer itself gives that text is kept. The map is one-to-one, so a drafted verifier
token names the draft token that produced it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specdec.errors import SpecdecError

#: under sampling, TLI drafts only shared tokens: below this share of a sample text's verifier tokens it cannot pay
MIN_COVERAGE = 0.5
_ANCHOR_TEXT = "a"
#: the text coverage is measured on: prose, numbers, code and punctuation, as prompts mix them
SAMPLE = ("The quick brown fox jumps over the lazy dog. In 2024, 37% of the 1,250 respondents said they would "
          "rather work from home; the rest preferred the office. def mean(xs):\n    return sum(xs) / len(xs)\n"
          "Please summarize the following article in three sentences, then list two questions it leaves open.")


class SharedVocabularyError(SpecdecError, ValueError):
    """Two vocabularies share too few tokens for token-level intersection (sampled cross-vocabulary drafts)."""


def token_texts(tokenizer: Any) -> dict[str, int]:
    """``text -> id`` for every ordinary token of ``tokenizer`` (see the module docstring)."""
    vocab_size = max(tokenizer.get_vocab().values()) + 1
    anchor = tokenizer(_ANCHOR_TEXT, add_special_tokens=False).input_ids[-1:]
    prefix = tokenizer.decode(anchor)
    texts = tokenizer.batch_decode([anchor + [i] for i in range(vocab_size)], clean_up_tokenization_spaces=False)
    special = set(tokenizer.all_special_ids)
    by_text: dict[str, list[int]] = {}
    for i, text in enumerate(texts):
        if i in special or not text.startswith(prefix):
            continue
        text = text[len(prefix):]
        if text and "\ufffd" not in text:
            by_text.setdefault(text, []).append(i)
    out = {}
    for text, ids in by_text.items():
        if len(ids) > 1:  # the id the tokenizer gives the text, where it is one of them
            own = tokenizer(text, add_special_tokens=False).input_ids
            ids = [own[0]] if len(own) == 1 and own[0] in ids else ids
        out[text] = ids[0]
    return out


@dataclass
class SharedVocab:
    """The one-to-one map between draft and verifier ids of the tokens whose text both vocabularies have."""

    draft_ids: torch.Tensor  # [S] draft ids of the shared tokens
    verifier_ids: torch.Tensor  # [S] their verifier ids, in the same order
    to_draft: torch.Tensor  # [verifier vocab] the draft id of each verifier id (-1: not shared)
    coverage: float  # the share of a sample text's verifier tokens that are shared
    verifier_size: int  # tokens of the verifier's vocabulary (the share's denominator in messages)

    @classmethod
    def of(cls, draft_tokenizer: Any, verifier_tokenizer: Any, sample: str = SAMPLE) -> "SharedVocab":
        """The shared tokens of the two tokenizers; ``coverage`` measured on the text ``sample``."""
        mine, theirs = token_texts(draft_tokenizer), token_texts(verifier_tokenizer)
        pairs = sorted((theirs[t], d) for t, d in mine.items() if t in theirs)
        size = max(verifier_tokenizer.get_vocab().values()) + 1
        to_draft = torch.full((size,), -1, dtype=torch.long, device="cpu")  # .to(device) moves it
        v_ids = torch.tensor([v for v, _ in pairs], dtype=torch.long, device="cpu")
        d_ids = torch.tensor([d for _, d in pairs], dtype=torch.long, device="cpu")
        to_draft[v_ids] = d_ids
        tokens = verifier_tokenizer(sample, add_special_tokens=False).input_ids
        coverage = sum(int(to_draft[t]) >= 0 for t in tokens) / max(len(tokens), 1)
        return cls(d_ids, v_ids, to_draft, coverage, size)

    def check(self, trees: bool = False) -> None:
        """Raise :class:`SharedVocabularyError` if drafts over the shared tokens could never pay: sampled chains', or
        (``trees``) any tree's, whose nodes are all shared tokens."""
        if self.coverage < MIN_COVERAGE:
            instead = "draft chains (tree=None), whose greedy drafts go by text," if trees else \
                "decode greedily (drafts then go by text)"
            raise SharedVocabularyError(
                f"the drafter's vocabulary shares {len(self.verifier_ids)} of the verifier's {self.verifier_size} "
                f"tokens, {self.coverage:.0%} of a sample text's tokens (at least {MIN_COVERAGE:.0%} needed): "
                f"{'trees' if trees else 'sampled drafts'} over them (TLI) cannot pay; {instead} or draft with "
                "a model of the verifier's vocabulary")

    def to(self, device: torch.device) -> "SharedVocab":
        """This map with its tensors on ``device``."""
        return SharedVocab(self.draft_ids.to(device), self.verifier_ids.to(device), self.to_draft.to(device),
                           self.coverage, self.verifier_size)

    def verifier_scores(self, draft_logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """Draft logits ``[B, V_draft]`` as scores over the verifier's ``vocab`` ids: shared tokens carry theirs,
        every other id ``-inf`` (the drafter's distribution restricted to the shared tokens)."""
        out = draft_logits.new_full((draft_logits.shape[0], vocab), float("-inf"), dtype=torch.float32)
        keep = self.verifier_ids < vocab
        out[:, self.verifier_ids[keep]] = draft_logits[:, self.draft_ids[keep]].float()
        return out
