"""The draft vocabulary train-head keeps: response targets by frequency first, prompt tokens only in the slots the
responses leave empty."""

from __future__ import annotations

import torch

from specdec.training.train import draft_vocabulary


class _Features:
    """What draft_vocabulary reads of a FeatureSet: token ids, greedy targets and the prompt length per sample."""

    def __init__(self, rows: list[tuple[list[int], list[int], int]]) -> None:
        self.rows = [{"input_ids": torch.tensor(ids), "top": torch.tensor(top), "prompt_length": p} for ids, top, p in rows]

    def small(self, i: int) -> dict:
        return self.rows[i]


# prompt 3 tokens (ids 20, 21, 22), response 4 tokens; targets: top[p - 1:] = the 4 response tokens
_ROWS = [([20, 21, 22, 5, 5, 6, 7], [30, 31, 5, 5, 6, 7, 2], 3),
         ([20, 23, 22, 5, 8, 8, 8], [30, 32, 5, 8, 8, 8, 2], 3)]


def test_response_targets_rank_first():
    keep, coverage = draft_vocabulary(_Features(_ROWS), [0, 1], size=3, vocab=40)
    # target counts: 5 x3, 8 x3, 2 x2, 6 x1, 7 x1; prompt tokens must not displace any of them
    assert sorted(keep.tolist()) == [2, 5, 8]
    assert abs(coverage - 8 / 10) < 1e-6


def test_prompt_tokens_fill_what_responses_leave():
    keep, coverage = draft_vocabulary(_Features(_ROWS), [0, 1], size=8, vocab=40)
    kept = set(keep.tolist())
    assert {2, 5, 6, 7, 8} <= kept  # every response target
    # the 3 remaining slots go to prompt tokens: 30 (greedy twice at prompt positions) and 20, 22 (twice in text)
    assert kept - {2, 5, 6, 7, 8} == {20, 22, 30}
    assert coverage == 1.0
    assert keep.tolist() == sorted(keep.tolist())


def test_only_listed_samples_count():
    keep, _ = draft_vocabulary(_Features(_ROWS), [0], size=4, vocab=40)
    assert 8 not in keep.tolist()

