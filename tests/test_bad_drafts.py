"""A drafter's garbage (NaN / inf scores, a q that is no distribution) costs acceptance, never the call."""

from __future__ import annotations

import copy

import pytest
import torch

import specdec
from specdec.acceptance import draft_distribution, rejection_accept
from specdec.drafters import Drafter
from specdec.drafters.base import DraftChain
from tiny_models import VOCAB, make_model


def _nan_copy(model: torch.nn.Module, everywhere: bool) -> torch.nn.Module:
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if everywhere or "layers.1.mlp" in name:
                p.fill_(float("nan"))
    return draft


def _prompt(batch: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, 6), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("tree", [None, "static", "dynamic", "auto"])
@pytest.mark.parametrize("everywhere", [True, False], ids=["all-nan", "some-nan"])
def test_nan_draft_model_samples_without_crashing(tree, everywhere):
    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, _nan_copy(model, everywhere), num_draft_tokens=4, tree=tree)
    ids = _prompt(batch=2)
    gen = torch.Generator().manual_seed(0)
    out = spec.generate(ids, max_new_tokens=16, do_sample=True, temperature=0.8, top_k=20, eos_token_id=None,
                        generator=gen)
    assert out.shape == (2, ids.shape[1] + 16)
    assert ((out >= 0) & (out < VOCAB)).all()


@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_nan_draft_model_greedy_stays_identical(tree):
    model = make_model("llama")
    ids = _prompt()
    kwargs = dict(max_new_tokens=16, do_sample=False, eos_token_id=None, repetition_penalty=1.2)
    got = specdec.SpeculativeModel(model, _nan_copy(model, True), num_draft_tokens=4, tree=tree).generate(ids, **kwargs)
    assert torch.equal(got, model.generate(ids, **kwargs))


def test_draft_distribution_repairs_rows_that_are_no_distribution():
    scores = torch.tensor([[0.0, 1.0, 2.0], [float("nan"), 1.0, 0.0], [float("-inf")] * 3, [0.0, float("inf"), 1.0]])
    q = draft_distribution(scores)
    assert torch.isfinite(q).all() and torch.allclose(q.sum(-1), torch.ones(4))
    assert torch.allclose(q[0], torch.softmax(scores[0], -1))
    assert q[1].tolist() == [0.0, 1.0, 0.0]  # the best finite score
    assert q[2].tolist() == [1.0, 0.0, 0.0]  # nothing finite: token 0
    assert q[3].tolist() == [0.0, 0.0, 1.0]


def test_rejection_with_a_broken_q_rejects_and_draws_from_p():
    """A q with NaN at a position rejects its draft there; the token comes from p, whose law is exact."""
    p = torch.tensor([[[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]])
    q = torch.tensor([[[float("nan"), 0.5, 0.5]]])
    counts = torch.zeros(3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4000):
        accepted, tokens = rejection_accept(torch.tensor([[1]]), q, p, gen)
        assert int(accepted) == 0
        counts[int(tokens[0, 0])] += 1
    assert torch.allclose(counts / counts.sum(), p[0, 0], atol=0.03)


class _NanProbs(Drafter):
    """A custom drafter that proposes real tokens with a q full of NaN."""

    def propose(self, rows, k, ctx):
        tokens = torch.full((len(rows), k), 5, dtype=torch.long, device=rows.device)
        probs = torch.full((len(rows), k, ctx.vocab_size), float("nan"), device=rows.device) if ctx.do_sample else None
        return DraftChain(tokens, probs)


def test_custom_drafter_with_nan_probs_does_not_crash():
    model = make_model("llama")
    out = specdec.SpeculativeModel(model, _NanProbs(), num_draft_tokens=3).generate(
        _prompt(2), max_new_tokens=12, do_sample=True, eos_token_id=None, generator=torch.Generator().manual_seed(1))
    assert out.shape[1] == 6 + 12
