"""specdec.acceptance on hand-made numbers: which drafts are kept and which token follows them.

The sampling law itself (chi-square against ``model.generate``, with negative controls) is in test_sampling.py.
"""

import pytest
import torch

from specdec.acceptance import draft_distribution, greedy_accept, rejection_accept

V = 5


def _scores(*argmaxes: int) -> torch.Tensor:
    """``[1, len, V]`` scores whose argmax at each position is the given token."""
    out = torch.zeros(1, len(argmaxes), V)
    for j, t in enumerate(argmaxes):
        out[0, j, t] = 1.0
    return out


def _one_hot(*tokens: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor([tokens]), V).float()


@pytest.mark.parametrize("drafts, targets, n", [
    ((1, 2, 3), (1, 2, 3, 4), 3),  # all accepted: the last position gives the bonus token
    ((1, 2, 3), (1, 0, 3, 4), 1),  # first mismatch at position 1: a later match does not count
    ((1, 2, 3), (0, 2, 3, 4), 0),
])
def test_greedy_keeps_the_longest_agreeing_prefix_then_the_verifiers_token(drafts, targets, n):
    accepted, tokens = greedy_accept(torch.tensor([drafts]), _scores(*targets))
    assert accepted.tolist() == [n]
    assert tokens[0, : n + 1].tolist() == list(targets[: n + 1])


def test_greedy_rows_are_independent():
    drafts = torch.tensor([[1, 2], [1, 2]])
    scores = torch.cat([_scores(1, 2, 4), _scores(3, 2, 4)])
    accepted, tokens = greedy_accept(drafts, scores)
    assert accepted.tolist() == [2, 0] and tokens[:, 0].tolist() == [1, 3]


def test_rejection_with_a_certain_verifier_keeps_what_it_would_say():
    """One-hot ``p``: a draft equal to it is always accepted, any other always rejected and replaced by it."""
    p = _one_hot(1, 2, 3)
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        accepted, tokens = rejection_accept(torch.tensor([[1, 4]]), _one_hot(1, 4), p, g)
        assert accepted.tolist() == [1] and tokens[0, :2].tolist() == [1, 2]


def test_rejection_accepts_everything_when_q_equals_p():
    p = torch.softmax(torch.randn(1, 4, V, generator=torch.Generator().manual_seed(0)), dim=-1)
    drafts = torch.tensor([[0, 1, 2]])
    accepted, _ = rejection_accept(drafts, p[:, :3], p, torch.Generator().manual_seed(1))
    assert accepted.tolist() == [3]


def test_rejection_refuses_a_q_that_is_no_distribution_and_draws_from_p():
    p = _one_hot(3, 3)
    q = torch.full((1, 1, V), float("nan"))
    accepted, tokens = rejection_accept(torch.tensor([[3]]), q, p, torch.Generator().manual_seed(0))
    assert accepted.tolist() == [0] and tokens[0, 0].item() == 3  # the draft was right, still refused: q is garbage


def test_rejection_checks_shapes():
    with pytest.raises(ValueError, match="shape mismatch"):
        rejection_accept(torch.tensor([[1, 2]]), _one_hot(1, 2), _one_hot(1, 2))  # p needs k + 1 positions


def test_draft_distribution_is_always_a_distribution():
    scores = torch.tensor([[0.0, 1.0, 2.0, 0.0, 0.0], [float("nan")] * V, [1.0, float("inf"), 0.0, 5.0, 0.0]])
    q = draft_distribution(scores)
    assert torch.allclose(q.sum(-1), torch.ones(3))
    assert torch.allclose(q[0], torch.softmax(scores[0], -1))
    assert q[1].tolist() == [1.0, 0, 0, 0, 0]  # nothing finite: token 0
    assert q[2].argmax().item() == 3  # one-hot on the best finite score
