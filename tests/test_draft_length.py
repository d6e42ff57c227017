"""Adaptive draft length (specdec.draft_length): exact, adapts, reproducible under a seeded generator.

The engine side of draft plans (ChainPlan, TreePlan, a plan of a test's own): test_engine.py."""

import pytest
import torch

import specdec
from tiny_models import make_model


def test_adaptive_draft_length_is_exact_and_adapts():
    from specdec.draft_length import AdaptiveDraftLength, expected_tokens
    from tiny_models import perturbed_copy

    model = make_model("qwen2")
    ids = torch.tensor([[4, 9, 13, 2, 77, 5]])
    kwargs = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=8, adaptive=True)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert len(set(spec.policy.history)) > 1
    # the controller's arithmetic
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 5) == 6.0
    policy = AdaptiveDraftLength(max_k=8)
    for _ in range(20):  # perfect acceptance, free drafts, flat verify cost -> draft the most
        policy.update(4, 4, 0.0001, 0.1)
    assert policy.choose(100) == 8
    for _ in range(20):  # nothing accepted, drafts as costly as verification -> draft the least
        policy.update(4, 0, 0.1, 0.1)
    assert policy.choose(100) == 1
    with pytest.raises(ValueError):
        AdaptiveDraftLength(max_k=0)


def test_adaptive_policy_is_kept_when_a_call_names_its_draft_length():
    """``num_draft_tokens`` on an adaptive model bounds the policy for that call; it does not switch it off."""
    from tiny_models import perturbed_copy

    model = make_model("llama")
    ids = torch.tensor([[4, 9, 13, 2, 77, 5]])
    kwargs = dict(max_new_tokens=60, do_sample=False, eos_token_id=None)
    weak = perturbed_copy(model, 1.0)  # agrees with the verifier rarely
    adaptive = specdec.SpeculativeModel(model, weak, num_draft_tokens=8, adaptive=True)
    fixed = specdec.SpeculativeModel(model, weak, num_draft_tokens=8)
    for spec in (adaptive, fixed):
        assert torch.equal(spec.generate(ids, num_draft_tokens=8, **kwargs), model.generate(ids, **kwargs))
    assert adaptive.last_stats.acceptance_rate < 0.5
    assert adaptive.last_stats.mean_draft_length < 8
    assert max(adaptive.policy.history) <= 8
    # fixed k drafts 8 every pass but the last few, where max_length leaves less room
    assert fixed.last_stats.proposed_per_position[7] >= fixed.last_stats.verifier_forwards - 8
    assert fixed.last_stats.mean_draft_length > 7 > 2 * adaptive.last_stats.mean_draft_length
    adaptive.generate(ids, num_draft_tokens=3, **kwargs)
    assert max(list(adaptive.policy.history)[-5:]) <= 3 and adaptive.last_stats.num_draft_tokens == 3


def test_adaptive_sampling_with_a_seeded_generator_is_reproducible():
    """The timed policy carries wall-clock state across calls; with a generator k must not depend on it."""
    from tiny_models import perturbed_copy

    model = make_model("llama")
    ids = torch.tensor([[4, 9, 13, 2, 77, 5]])
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.3), num_draft_tokens=8, adaptive=True)
    kwargs = dict(max_new_tokens=60, do_sample=True, eos_token_id=None)
    runs, lengths = [], []
    for draft_seconds in (1e-6, 1.0):  # what the clock said in earlier calls: drafting free, then costly
        spec.generate(ids, **kwargs)  # an unseeded call that trains the shared, timed estimates
        spec.policy.draft_cost, spec.policy.verify_costs = draft_seconds, {1: 0.01, 8: 0.01}
        runs.append(spec.generate(ids, generator=torch.Generator(device="cpu").manual_seed(11), **kwargs))
        lengths.append(spec.last_stats.committed_per_step)
    assert torch.equal(runs[0], runs[1])
    assert lengths[0] == lengths[1]
