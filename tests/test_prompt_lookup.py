"""Prompt-lookup drafting: the n-gram search, and exactness of generation with it."""

import pytest
import torch

import specdec
from specdec.drafters import PromptLookupDrafter
from specdec.drafters.base import DraftContext, Rows
from specdec.drafters.prompt_lookup import lookup
from tiny_models import make_model


def test_lookup_prefers_longest_then_most_recent_match():
    row = [1, 2, 3, 9, 9, 1, 2, 4, 7, 1, 2]
    assert lookup(row, 3, 1, 3) == [4, 7, 1]  # "1 2" last seen before position 7 -> 4 7 1
    assert lookup([5, 6, 7, 8, 5, 6, 7], 2, 1, 3) == [8, 5]  # trigram "5 6 7"
    assert lookup([1, 2, 3], 4, 1, 3) == []  # nothing repeats
    assert lookup([4, 4], 3, 1, 2) == [4]


def test_batch_proposals_are_padded_and_skip_left_padding():
    drafter = PromptLookupDrafter(max_ngram=2)
    ids = torch.tensor([[0, 0, 3, 4, 5, 3, 4], [6, 7, 8, 6, 7, 9, 1]])
    drafter.start(ids, torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7]), 32)
    proposal = drafter.propose(Rows(ids, [7, 7]), 4, DraftContext(None, False))
    # row 0: "3 4" -> 5 3 4 (the left padding is not searched); row 1 has no match: filler tokens
    assert proposal.tokens.tolist() == [[5, 3, 4], [1, 1, 1]]
    assert proposal.probs is None


def test_no_match_anywhere_means_a_plain_step():
    drafter = PromptLookupDrafter()
    ids = torch.tensor([[1, 2, 3]])
    drafter.start(ids, None, 8)
    assert drafter.propose(Rows(ids, [3]), 4, DraftContext(None, False)).tokens.shape == (1, 0)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "mistral"])
def test_greedy_exact_with_prompt_lookup(arch):
    model = make_model(arch)
    # a repetitive prompt so lookups find matches
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]])
    kwargs = dict(max_new_tokens=30, do_sample=False, eos_token_id=None)
    spec = specdec.SpeculativeModel(model, "prompt-lookup", num_draft_tokens=5)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.proposed > 0


def test_bad_ngram_range():
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter(min_ngram=3, max_ngram=2)


# --- composite, layer-skip and adaptive draft length -------------------------------------------------
