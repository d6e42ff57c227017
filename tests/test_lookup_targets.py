"""lookup_drafts: what prompt lookup drafts after every prefix, in one pass, equal to the drafter's own lookup."""

import random

import pytest

from specdec.drafters.prompt_lookup import lookup
from specdec.training.lookup_targets import lookup_drafts


@pytest.mark.parametrize("min_ngram,max_ngram", [(2, 4), (1, 3)])
def test_lookup_drafts_equal_the_drafters_lookup_after_every_prefix(min_ngram, max_ngram):
    rng = random.Random(0)
    for _ in range(200):
        # small vocabularies repeat often (long matches, matches leaving the window); large ones rarely
        vocab, window = rng.choice([3, 5, 40]), rng.choice([6, 30, 1024])
        ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 90))]
        expected = [(lookup(ids[max(0, t - window):t], 1, min_ngram, max_ngram) or [-1])[0] for t in range(len(ids))]
        assert lookup_drafts(ids, min_ngram, max_ngram, window) == expected, (ids, window)


def test_a_repeated_phrase_is_drafted_and_a_fresh_one_is_not():
    ids = [7, 8, 9, 10, 1, 2, 7, 8, 9, 10]
    drafts = lookup_drafts(ids)
    assert drafts[:8] == [-1] * 8  # no earlier bigram before "7 8" comes back
    assert drafts[8:] == [9, 10]  # after "7 8" again: what followed it the first time


def test_collate_adds_each_rows_lookup_drafts_and_pads_with_none():
    import torch

    from specdec.training.train import collate

    rows = [[5, 6, 7, 5, 6, 7, 5], [9, 9, 9]]
    items = [{"input_ids": torch.tensor(r), "top": torch.tensor(r), "hidden": torch.zeros(len(r), 4),
              "final": torch.zeros(len(r), 2), "prompt_length": 2} for r in rows]
    batch = collate(items, [0, 1], torch.device("cpu"), lookup=True)
    assert batch["lookup"].tolist() == [lookup_drafts(rows[0]), lookup_drafts(rows[1]) + [-1] * 4]
    assert batch["lookup"][0, 5:].tolist() == [7, 5]  # "5 6" and "6 7 5" seen before
    assert "lookup" not in collate(items, [0, 1], torch.device("cpu"))
