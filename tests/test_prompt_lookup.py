"""Prompt-lookup drafting: the n-gram search, and exactness of generation with it."""

import pytest
import torch

import specdec
from specdec.drafters import PromptLookupDrafter
from specdec.drafters.base import DraftContext
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
    proposal = drafter.propose(ids, 4, DraftContext(None, False))
    # row 0: "3 4" -> 5 3 4 (the left padding is not searched); row 1 has no match: filler tokens
    assert proposal.tokens.tolist() == [[5, 3, 4], [1, 1, 1]]
    assert proposal.probs is None


def test_no_match_anywhere_means_a_plain_step():
    drafter = PromptLookupDrafter()
    ids = torch.tensor([[1, 2, 3]])
    drafter.start(ids, None, 8)
    assert drafter.propose(ids, 4, DraftContext(None, False)).tokens.shape == (1, 0)


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


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_composite_is_exact_and_uses_both(arch):
    from specdec.drafters import CompositeDrafter, ModelDrafter
    from tiny_models import perturbed_copy

    model = make_model(arch)
    drafter = CompositeDrafter(ModelDrafter(perturbed_copy(model, 0.05)))
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 30, 31, 32]])
    kwargs = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.drafter_stats["model_steps"] > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox", "qwen3"])
def test_layer_skip_shares_weights_and_is_exact(arch):
    model = make_model(arch)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    spec = specdec.SpeculativeModel(model, "layer-skip:1", num_draft_tokens=3)
    draft_model = spec.drafter.model
    assert draft_model.config.num_hidden_layers == 1 and model.config.num_hidden_layers == 2
    shared = {p.data_ptr() for p in model.parameters()}
    assert all(p.data_ptr() in shared for p in draft_model.parameters())
    ids = torch.tensor([[4, 9, 13, 2, 77]])
    kwargs = dict(max_new_tokens=25, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_layer_skip_bad_counts():
    model = make_model("llama")
    for spec in ("layer-skip:0", "layer-skip:2", "layer-skip:x"):
        with pytest.raises(ValueError, match="layer"):
            specdec.SpeculativeModel(model, spec)


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


def test_confidence_threshold_stops_drafting_early():
    from specdec.drafters import ModelDrafter
    from tiny_models import perturbed_copy

    model = make_model("llama")
    with pytest.raises(ValueError, match="confidence_threshold"):
        ModelDrafter(model, confidence_threshold=1.5)
    drafter = ModelDrafter(perturbed_copy(model, 0.05), confidence_threshold=0.99)
    ids = torch.tensor([[4, 9, 13, 2, 77, 5]])
    kwargs = dict(max_new_tokens=30, do_sample=False, eos_token_id=None)
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=8)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.proposed < 8 * spec.last_stats.verifier_forwards


@pytest.mark.parametrize("batch", [1, 3])
def test_derived_drafter_adopts_the_verifier_prompt_cache(batch):
    from specdec.drafters import ModelDrafter
    from tiny_models import perturbed_copy

    model = make_model("llama")
    drafter = ModelDrafter(perturbed_copy(model, 0.05), reuse_verifier_prompt=True)
    prompts = [torch.randint(3, 90, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 11, 8)[:batch]]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    # no drafter prefill: every drafter forward was a drafting step
    assert spec.last_stats.drafter_forwards <= 4 * spec.last_stats.verifier_forwards
    assert spec.last_stats.drafter_stats["adopted_prompt"] is True


def test_other_layouts_do_not_adopt():
    from specdec.drafters import ModelDrafter
    from specdec.verifiers.hf import shares_kv_layout

    llama, gpt2 = make_model("llama"), make_model("gpt2")
    assert not shares_kv_layout(llama.config, gpt2.config)
    drafter = ModelDrafter(gpt2, reuse_verifier_prompt=True)
    spec = specdec.SpeculativeModel(llama, drafter, num_draft_tokens=3)
    ids = torch.tensor([[4, 9, 13, 2, 77]])
    kwargs = dict(max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **kwargs), llama.generate(ids, **kwargs))
    assert spec.last_stats.drafter_stats["adopted_prompt"] is False
