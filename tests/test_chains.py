"""Adaptive draft length (specdec.chains): exact, adapts, reproducible under a seeded generator.

The engine side of draft plans (ChainPlan, TreePlan, a plan of a test's own): test_engine.py."""

import pytest
import torch

import specdec
from tiny_models import make_model


def test_adaptive_draft_length_is_exact_and_adapts():
    from specdec.chains import AdaptiveDraftLength
    from specdec.metrics import expected_tokens
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
    for _ in range(20):  # perfect acceptance, cheap drafts, flat verify cost -> draft the most
        policy.update(4, 4, 0.001, 0.1)
    assert policy.choose(100) == 8
    for _ in range(20):  # nothing accepted, drafts as costly as verification -> do not draft
        policy.update(4, 0, 0.1, 0.1)
    assert policy.choose(100) == 0
    floor = AdaptiveDraftLength(max_k=8, min_k=1)  # min_k >= 1: always draft, at least min_k
    for _ in range(20):
        floor.update(4, 0, 0.1, 0.1)
    assert floor.choose(100) == 1
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
        spec.policy.draft_costs, spec.policy.verify_costs = {1: draft_seconds}, {1: 0.01, 8: 0.01}
        runs.append(spec.generate(ids, generator=torch.Generator(device="cpu").manual_seed(11), **kwargs))
        lengths.append(spec.last_stats.committed_per_step)
    assert torch.equal(runs[0], runs[1])
    assert lengths[0] == lengths[1]


# ------------------------------------------------------------------------------------------------
# k = 0: plain passes where drafting does not pay, probes to find a drafter that pays again
# ------------------------------------------------------------------------------------------------

def _drive(policy, accepts, limit: int = 100) -> list[int]:
    """Run ``policy`` for ``len(accepts)`` passes; pass ``i`` accepts ``accepts[i](k)`` of its ``k`` drafts. The
    clock says a draft costs half a verifier pass (untimed policies ignore it)."""
    choices = []
    for accept in accepts:
        k = policy.choose(limit)
        choices.append(k)
        policy.update(k, accept(k) if k else 0, 0.05 * k, 0.1)
    return choices


def _probes(choices: list[int]) -> list[int]:
    """Indices of the passes that drafted after a plain one."""
    return [i for i in range(1, len(choices)) if choices[i] > 0 and choices[i - 1] == 0]


@pytest.mark.parametrize("timed", [False, True])
def test_adaptive_stops_drafting_when_nothing_is_accepted_and_probes_with_a_growing_back_off(timed):
    from specdec.chains import AdaptiveDraftLength

    policy = AdaptiveDraftLength(max_k=8, timed=timed, draft_cost_ratio=0.3)
    choices = _drive(policy, [lambda k: 0] * 200)
    assert choices[0] > 0 and 0 in choices[:6]  # the prior drafts, a few rejected passes stop it
    assert sum(k > 0 for k in choices) <= 6 + len(choices) // policy.max_backoff  # after that: a probe now and then
    probes = _probes(choices)
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # the back-off doubles up to its cap
    assert len(probes) >= 4 and gaps == sorted(gaps) and gaps[-1] == policy.max_backoff + 1
    assert all(choices[i] == 1 for i in probes)  # a probe drafts what the estimates favour: one token
    if timed:
        assert 0 in policy.verify_costs  # a plain pass's cost is measured, not extrapolated


@pytest.mark.parametrize("timed", [False, True])
def test_adaptive_drafts_again_when_acceptance_recovers(timed):
    from specdec.chains import AdaptiveDraftLength

    policy = AdaptiveDraftLength(max_k=8, timed=timed, draft_cost_ratio=0.3)
    useless, perfect = [lambda k: 0] * 100, [lambda k: k] * 60
    choices = _drive(policy, useless + perfect)
    assert choices[90:100].count(0) >= 8
    back = next(i for i in range(100, 160) if choices[i] > 0)  # the first probe once drafts are good
    assert back <= 100 + policy.max_backoff
    assert all(k > 0 for k in choices[back + 1:])  # found again: it keeps drafting ...
    assert choices[-1] == 8  # ... and grows k to the most
    assert all(k > 0 for k in _drive(policy, [lambda k: min(k, 2)] * 40))  # a good drafter is never stopped


def test_untimed_choices_depend_on_accepted_counts_only():
    """A seeded call's k sequence must not depend on the clock: two untimed policies fed the same accepted
    counts with different timings choose alike."""
    from specdec.chains import AdaptiveDraftLength

    accepts = [(lambda k, i=i: 0 if i < 50 or i % 7 else k) for i in range(150)]  # useless, then now and then good
    runs = []
    for clock in (1e-6, 1.0):
        policy, choices = AdaptiveDraftLength(max_k=6, timed=False, draft_cost_ratio=0.2), []
        for accept in accepts:
            k = policy.choose(100)
            choices.append(k)
            policy.update(k, accept(k) if k else 0, clock * k, clock)
        runs.append(choices)
    assert runs[0] == runs[1] and 0 in runs[0] and max(runs[0]) > 1


def test_pooled_acceptance_is_unbiased():
    """Accepted drafts over trials, pooled: a moving average of each pass's own rate reads ~0.52 at a = 0.7, k = 4
    and so chose too short a k where drafts are good."""
    import random
    from specdec.chains import AdaptiveDraftLength

    rng, policy = random.Random(0), AdaptiveDraftLength(max_k=4, min_k=4, timed=False, decay=0.99)
    for _ in range(2000):
        accepted = 0
        while accepted < 4 and rng.random() < 0.7:
            accepted += 1
        policy.update(4, accepted, 0.0, 0.0)
    assert policy.acceptance == pytest.approx(0.7, abs=0.05)


class _WrongOracle:
    """Builds a drafter that proposes the verifier's greedy continuation off by one token (always rejected) until a
    row holds ``turn`` tokens, and the continuation itself (always accepted) from there."""

    @staticmethod
    def make(expected: torch.Tensor, turn: int | None = None):
        from specdec.drafters.oracle import OracleDrafter
        from specdec.protocol import DraftChain

        class Drafter(OracleDrafter):
            def propose(self, rows, k, ctx):
                proposal = super().propose(rows, k, ctx)
                if turn is not None and min(rows.length(b) for b in range(len(rows))) >= turn:
                    return proposal
                return DraftChain((proposal.tokens + 1) % ctx.vocab_size)

        return Drafter(expected)


@pytest.mark.parametrize("sample", [False, True])
def test_adaptive_with_a_useless_drafter_mostly_decodes_plainly(sample):
    model = make_model("llama")
    ids = torch.tensor([[4, 9, 13, 2, 77, 5]])
    kwargs = dict(max_new_tokens=80, eos_token_id=None)
    expected = model.generate(ids, do_sample=False, **kwargs)
    spec = specdec.SpeculativeModel(model, _WrongOracle.make(expected), num_draft_tokens=6, adaptive=True)
    spec.policy.timed = False  # choices from the accepted counts alone: the test cannot depend on the clock
    if sample:  # a seeded call: the untimed policy, reproducible
        runs = [spec.generate(ids, do_sample=True, generator=torch.Generator().manual_seed(5), **kwargs)
                for _ in range(2)]
        assert torch.equal(runs[0], runs[1])
    else:
        assert torch.equal(spec.generate(ids, do_sample=False, **kwargs), expected)
        assert spec.last_stats.accepted == 0
    stats = spec.last_stats
    assert stats.drafted_passes <= stats.verifier_forwards // 4  # most passes did not draft
    assert stats.to_dict()["drafted_passes"] == stats.drafted_passes
    assert stats.proposed_per_position[0] == stats.drafted_passes  # a chain: every drafting pass proposes position 0


def test_adaptive_finds_a_drafter_that_turns_good():
    model = make_model("qwen2")
    ids = torch.tensor([[4, 9, 13, 2, 77, 5]])
    kwargs = dict(max_new_tokens=120, do_sample=False, eos_token_id=None)
    expected = model.generate(ids, **kwargs)
    spec = specdec.SpeculativeModel(model, _WrongOracle.make(expected, turn=ids.shape[1] + 40), num_draft_tokens=6,
                                    adaptive=True)
    spec.policy.timed = False  # choices from the accepted counts alone: the test cannot depend on the clock
    assert torch.equal(spec.generate(ids, **kwargs), expected)
    stats = spec.last_stats
    # plain passes while the drafts are wrong, then long accepted runs: far fewer passes than tokens
    assert 0 in spec.policy.history and max(list(spec.policy.history)[-5:]) == 6 and stats.accepted >= 30
    # found again within one back-off: at most max_backoff plain passes after the turn, then long accepted runs
    assert stats.verifier_forwards <= 40 + spec.policy.max_backoff + 15


def test_timed_costs_shrug_off_a_call_s_first_pass_and_a_load_spike():
    """One slow pass (a call's one-time work, another process on the CPU) must not lock a good drafter out."""
    from specdec.chains import OUTLIER, AdaptiveDraftLength, ChainPlan
    from specdec.protocol import DraftChain

    policy = AdaptiveDraftLength(max_k=4)
    plan = ChainPlan(policy)
    plan.update(DraftChain(torch.zeros(1, 2, dtype=torch.long)), [2], 0.5, 3.0, 2)  # the call's first pass: not timed
    assert not policy.verify_costs and not policy.draft_costs and policy.acceptance > policy.prior_acceptance
    for _ in range(10):
        policy.update(2, 2, 0.004, 0.05)
    policy.update(2, 2, 0.004, 5.0)  # a spike 100x the usual pass counts as OUTLIER x
    assert policy.verify_costs[2] == pytest.approx(policy.decay * 0.05 + (1 - policy.decay) * OUTLIER * 0.05)
    policy.update(0, 0, 0.0, 0.06)  # a plain pass a little slower than the drafting ones, measured under other load:
    assert policy.choose(100) == 4  # the slope between k = 0 and 2 is shrunk toward the prior, so k = 4 still pays
