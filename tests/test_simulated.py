"""Simulated acceptance (specdec.drafters.simulated): a real drafter's cost with a chosen acceptance profile.

The wrapper proposes the verifier's known greedy token with the profile's conditional probability, so greedy
verification must accept exactly the drawn prefix (the measured counts equal the drawn ones), the measured rates
must follow the profile, and the output must stay ``generate``'s.
"""

import math

import pytest
import torch

import specdec
from specdec.drafters import AcceptanceProfile, Drafter, ModelDrafter, PromptLookupDrafter, SimulatedDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.simulated import SHIPPED_HEAD_RATES
from specdec.metrics import expected_tokens
from tiny_models import left_padded, make_model, perturbed_copy

KW = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


def _eagle(model):
    from specdec.heads.config import HeadConfig
    from specdec.heads.modules import EagleHead

    torch.manual_seed(0)
    head = EagleHead(HeadConfig.for_verifier(model.config, "eagle3", draft_vocab_size=None))
    head.attach(model.get_input_embeddings(), model.get_output_embeddings())
    return EagleDrafter(head.eval(), model)


INNER = {"prompt-lookup": lambda model: PromptLookupDrafter(),
         "model": lambda model: ModelDrafter(perturbed_copy(model, 0.05)),
         "eagle": _eagle}


def _run(model, sim, ids, mask, k, new, **kw):
    kwargs = {**KW, **kw}
    ref = sim.prepare(model, ids, mask, max_new_tokens=new, **kwargs)
    spec = specdec.SpeculativeModel(model, sim, num_draft_tokens=k)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=new, **kwargs)
    return spec, out, ref


def test_parametric_profile_solves_for_tokens_per_pass():
    for target, k in ((2.0, 4), (3.0, 4), (4.0, 4), (1.0, 3), (5.0, 4), (2.5, 8)):
        profile = AcceptanceProfile.for_tokens_per_pass(target, k)
        a = profile.rates[0]
        assert math.isclose(expected_tokens(a, k), target, abs_tol=1e-6)
        assert math.isclose(profile.expected_tokens_per_pass(k), target, abs_tol=1e-6)
        assert f"{target:g} tokens/pass" in profile.name
    assert 0.7 < AcceptanceProfile.for_tokens_per_pass(3.0, 4).rates[0] < 0.78  # 1 + a + a^2 + a^3 + a^4 = 3
    for bad in ((0.5, 4), (5.5, 4), (2.0, 0)):
        with pytest.raises(ValueError, match="tokens per pass"):
            AcceptanceProfile.for_tokens_per_pass(*bad)
    with pytest.raises(ValueError, match="probabilities"):
        AcceptanceProfile((0.5, 1.2), "bad")


def test_the_shipped_heads_profile_is_the_measured_one():
    profile = AcceptanceProfile.shipped_head()
    assert profile.rates == SHIPPED_HEAD_RATES and "BENCHMARKS.md section 18" in profile.source
    assert 1.6 < profile.expected_tokens_per_pass(5) < 1.7  # the run measured 1.65 tokens a pass
    assert profile.rate(9) == profile.rates[-1]  # past the list: its last rate
    text = profile.describe(5)
    assert text.startswith("SIMULATED") and "1.66 tokens/pass expected at k=5" in text


def test_label_names_the_profile_and_the_drafter():
    sim = SimulatedDrafter(PromptLookupDrafter(), AcceptanceProfile.for_tokens_per_pass(3.0, 4))
    assert sim.label == "SIMULATED[3 tokens/pass at k=4 (a=0.741)] over PromptLookupDrafter"
    assert sim.describe(4).startswith("SIMULATED acceptance") and "PromptLookupDrafter" in sim.describe(4)
    assert SimulatedDrafter(PromptLookupDrafter(), AcceptanceProfile.constant(0.5), name="lookup").label.endswith(
        "over lookup")
    with pytest.raises(TypeError, match="Drafter instance"):
        SimulatedDrafter("prompt-lookup", AcceptanceProfile.constant(0.5))


@pytest.mark.parametrize("target", [2.0, 3.0, 4.0])
def test_measured_tokens_per_pass_match_the_parametric_profile(target):
    model = make_model("llama")
    ids, mask = left_padded([9, 6, 12, 7], seed=2)
    k = 4
    sim = SimulatedDrafter(PromptLookupDrafter(), AcceptanceProfile.for_tokens_per_pass(target, k), seed=1)
    spec, out, ref = _run(model, sim, ids, mask, k, new=160)
    assert torch.equal(out, ref)
    stats = spec.last_stats
    # greedy verification accepts exactly the drawn prefixes: the reference is the verifier's own output
    assert stats.accepted == stats.drafter_stats["simulated_accepted"] > 0
    assert stats.drafter_stats["simulated_beyond_reference"] == 0
    assert stats.drafter_stats["simulated"] == sim.label
    passes = stats.drafter_stats["simulated_row_passes"]
    planned = stats.drafter_stats["simulated_expected_tokens"] / passes  # the profile at each pass's own k
    assert abs(planned - target) < 0.06  # only passes near max_length draft fewer than k
    spread = math.sqrt(k * k / 4 / passes)  # a pass commits 1..k+1 tokens: its deviation is at most k / 2
    assert abs(stats.mean_accepted_length - planned) < 3 * spread, (stats.mean_accepted_length, planned, passes)


def test_measured_acceptance_by_position_matches_a_per_position_profile():
    model = make_model("llama")
    ids, mask = left_padded([8, 10, 5, 11, 9, 6], seed=4)
    profile = AcceptanceProfile((0.9, 0.7, 0.5, 0.8), "test profile")
    sim = SimulatedDrafter(ModelDrafter(perturbed_copy(model, 0.05)), profile, seed=3)
    spec, out, ref = _run(model, sim, ids, mask, k=5, new=120)
    assert torch.equal(out, ref)
    stats = spec.last_stats
    assert stats.accepted == stats.drafter_stats["simulated_accepted"]
    accepted, proposed = stats.accepted_per_position, stats.proposed_per_position
    for j in range(5):
        reached = proposed[0] if j == 0 else accepted[j - 1]  # rows whose drafts 0..j-1 were all accepted
        rate = accepted[j] / reached
        se = math.sqrt(profile.rate(j) * (1 - profile.rate(j)) / reached)
        assert abs(rate - profile.rate(j)) < 4 * se + 0.01, (j, rate, profile.rate(j), reached)
    expected = profile.expected_tokens_per_pass(5)
    assert abs(stats.mean_accepted_length - expected) < 0.25, (stats.mean_accepted_length, expected)


def test_draws_are_seeded_and_reproducible():
    model = make_model("llama")
    ids, mask = left_padded([9], seed=1)
    profile = AcceptanceProfile.for_tokens_per_pass(2.5, 4)
    runs = []
    for seed in (7, 7, 8):
        sim = SimulatedDrafter(PromptLookupDrafter(), profile, seed=seed)
        spec, out, ref = _run(model, sim, ids, mask, k=4, new=60)
        assert torch.equal(out, ref)
        runs.append(spec.last_stats.committed_per_step)
    assert runs[0] == runs[1] and runs[0] != runs[2]
    # a second call on the same object starts from the seed again
    spec = specdec.SpeculativeModel(model, sim, num_draft_tokens=4)
    spec.generate(ids, attention_mask=mask, max_new_tokens=60, **KW)
    assert spec.last_stats.committed_per_step == runs[2]


@pytest.mark.parametrize("inner", sorted(INNER))
@pytest.mark.parametrize("lengths", [[9], [5, 13, 8]])
def test_greedy_output_is_generates_with_every_inner_drafter(inner, lengths):
    model = make_model("llama")
    ids, mask = left_padded(lengths, seed=len(lengths))
    drafter = INNER[inner](model)
    sim = SimulatedDrafter(drafter, AcceptanceProfile.for_tokens_per_pass(3.0, 4))
    spec, out, ref = _run(model, sim, ids, mask, k=4, new=30)
    assert torch.equal(out, ref)
    stats = spec.last_stats
    assert stats.accepted == stats.drafter_stats["simulated_accepted"]
    assert stats.mean_accepted_length > 1.5
    if inner != "prompt-lookup":  # the real drafter ran every pass: its forwards are counted
        assert stats.drafter_forwards >= stats.verifier_forwards


def test_rows_that_leave_the_batch_keep_their_own_reference():
    """Row 0 stops at an EOS first; row 1's drafts must still come from its own reference (by owner)."""
    model = make_model("llama")
    ids, mask = left_padded([7, 11], seed=5)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=24, **KW)[:, ids.shape[1]:]
    eos = next(int(t) for t in free[0, 2:10] if int(t) not in free[1].tolist())
    sim = SimulatedDrafter(PromptLookupDrafter(), AcceptanceProfile.constant(0.8))
    spec, out, ref = _run(model, sim, ids, mask, k=4, new=24, eos_token_id=eos)
    assert torch.equal(out, ref)
    first, second = spec.last_stats.rows
    assert first.verifier_passes < second.verifier_passes  # row 0 really left first
    assert spec.last_stats.accepted == spec.last_stats.drafter_stats["simulated_accepted"]


def test_a_prompt_prepared_in_another_batch_is_found_by_its_tokens():
    model = make_model("llama")
    ids, mask = left_padded([5, 9], seed=6)
    sim = SimulatedDrafter(PromptLookupDrafter(), AcceptanceProfile.constant(0.7))
    sim.prepare(model, ids, mask, max_new_tokens=20, **KW)
    alone = ids[1:, -9:]  # row 1 alone, no padding
    spec = specdec.SpeculativeModel(model, sim, num_draft_tokens=4)
    out = spec.generate(alone, attention_mask=torch.ones_like(alone), max_new_tokens=20, **KW)
    assert torch.equal(out, model.generate(alone, attention_mask=torch.ones_like(alone), max_new_tokens=20, **KW))
    assert spec.last_stats.accepted == spec.last_stats.drafter_stats["simulated_accepted"] > 0


def test_a_call_longer_than_its_reference_is_still_exact():
    model = make_model("llama")
    ids, mask = left_padded([8], seed=7)
    sim = SimulatedDrafter(PromptLookupDrafter(), AcceptanceProfile.constant(0.9))
    sim.prepare(model, ids, mask, max_new_tokens=10, **KW)
    spec = specdec.SpeculativeModel(model, sim, num_draft_tokens=4)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=30, **KW)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, max_new_tokens=30, **KW))
    assert spec.last_stats.drafter_stats["simulated_beyond_reference"] > 0


def test_an_unprepared_prompt_and_sampling_are_refused():
    model = make_model("llama")
    ids, mask = left_padded([8, 6], seed=8)
    sim = SimulatedDrafter(PromptLookupDrafter(), AcceptanceProfile.constant(0.7))
    spec = specdec.SpeculativeModel(model, sim, num_draft_tokens=4)
    with pytest.raises(ValueError, match="row 0 was not prepared"):
        spec.generate(ids, attention_mask=mask, max_new_tokens=10, **KW)
    sim.prepare(model, ids[:1], mask[:1], max_new_tokens=10, **KW)  # row 0 only
    with pytest.raises(ValueError, match="row 1 was not prepared"):
        spec.generate(ids, attention_mask=mask, max_new_tokens=10, **KW)
    sim.prepare(model, ids, mask, max_new_tokens=10, **KW)
    with pytest.raises(ValueError, match="greedy decoding only"):
        spec.generate(ids, attention_mask=mask, max_new_tokens=10, **{**KW, "do_sample": True})
    with pytest.raises(ValueError, match="greedy decoding only"):
        sim.prepare(model, ids, mask, max_new_tokens=10, do_sample=True)
    with pytest.raises(ValueError, match="cannot draft trees"):
        specdec.SpeculativeModel(model, sim, num_draft_tokens=4, tree="static")


def test_the_wrapper_forwards_the_inner_drafters_interface():
    model = make_model("llama")
    head = _eagle(model)
    sim = SimulatedDrafter(head, AcceptanceProfile.constant(0.5))
    assert isinstance(sim, Drafter) and sim.hidden_layers == head.hidden_layers and sim.compilable
    lookup = SimulatedDrafter(PromptLookupDrafter(), AcceptanceProfile.constant(0.5))
    assert lookup.hidden_layers == () and lookup.model is None and not lookup.compilable
    call = sim.for_call()
    assert call.inner is not head and call._references is sim._references  # per-call state, shared references


@pytest.mark.parametrize("inner", ["prompt-lookup", "eagle"])
def test_the_wrapper_adds_no_device_sync_per_pass(inner):
    """Draws on the host, the reference indexed with host ints, one non-blocking upload: no sync of its own."""
    from specdec.host_trace import HostTrace

    model = make_model("llama")
    ids, mask = left_padded([9, 5], seed=9)
    counts = {}
    for wrapped in (False, True):
        drafter = INNER[inner](model)
        if wrapped:
            drafter = SimulatedDrafter(drafter, AcceptanceProfile.for_tokens_per_pass(3.0, 4))
            drafter.prepare(model, ids, mask, max_new_tokens=20, **KW)
        spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4)
        with HostTrace() as trace:
            trace.mark_engine()
            spec.generate(ids, attention_mask=mask, max_new_tokens=20, **KW)
        sites = trace.sync_sites()
        assert not any("simulated.py" in site for _, site in sites), sites
        counts[wrapped] = max(r.sync_count for r in trace.steady())
    assert counts[True] <= counts[False], counts
