"""Greedy speculative output must equal model.generate(do_sample=False) token for token."""

import pytest
import torch

import specdec
from tiny_models import CONFIGS, VOCAB, make_model, perturbed_copy

ARCHS = sorted(CONFIGS)


def _prompt(length: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=ARCHS)
def pair(request):
    model = make_model(request.param)
    return request.param, model, perturbed_copy(model, 0.05)


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("length", [1, 7, 23])
def test_matches_generate(pair, k, length):
    arch, model, draft = pair
    ids = _prompt(length, seed=length)
    expected = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None)
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=k)
    got = spec.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None)
    assert torch.equal(got, expected), f"{arch} k={k} len={length}"
    stats = spec.last_stats
    assert stats.new_tokens == 40
    assert stats.proposed >= stats.accepted >= 0
    # every verify pass commits between 1 and k+1 tokens
    assert all(1 <= c <= k + 1 for c in stats.committed_per_step)


def test_drafter_that_always_agrees_accepts_everything(pair):
    arch, model, _ = pair
    ids = _prompt(5)
    spec = specdec.SpeculativeModel(model, model, num_draft_tokens=4)
    got = spec.generate(ids, max_new_tokens=21, do_sample=False, eos_token_id=None)
    assert torch.equal(got, model.generate(ids, max_new_tokens=21, do_sample=False, eos_token_id=None))
    assert spec.last_stats.acceptance_rate == 1.0
    assert spec.last_stats.verifier_forwards == 4  # 1 token from prefill + 4 passes of 5


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 9, 10])
def test_max_new_tokens_inside_a_block(max_new_tokens):
    model = make_model("llama")
    ids = _prompt(6)
    spec = specdec.SpeculativeModel(model, model, num_draft_tokens=8)
    got = spec.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None)
    expected = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None)
    assert got.shape[1] == ids.shape[1] + max_new_tokens
    assert torch.equal(got, expected)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("position", [0, 3, 6, 11])
def test_eos_inside_an_accepted_block(arch, position):
    model = make_model(arch)
    ids = _prompt(4, seed=3)
    free = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None)
    generated = free[0, ids.shape[1]:].tolist()
    eos = generated[position]
    first = generated.index(eos)
    # the drafter is the model itself, so EOS arrives in the middle of a fully accepted block
    spec = specdec.SpeculativeModel(model, model, num_draft_tokens=8)
    got = spec.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    expected = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    assert torch.equal(got, expected)
    assert got.shape[1] == ids.shape[1] + first + 1
    assert got[0, -1].item() == eos


def test_several_eos_ids():
    model = make_model("llama")
    ids = _prompt(4, seed=5)
    generated = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None)[0, 4:].tolist()
    eos = [generated[9], generated[5]]
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=6)
    got = spec.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=eos)
    assert torch.equal(got, model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=eos))


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2"])
def test_left_padded_batch_matches_batched_generate(arch):
    model = make_model(arch)
    draft = perturbed_copy(model, 0.05)
    lengths = [3, 11, 7]
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = _prompt(n, seed=row)[0]
        mask[row, width - n:] = 1
    kwargs = dict(attention_mask=mask, max_new_tokens=25, do_sample=False, eos_token_id=None, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    got = specdec.SpeculativeModel(model, draft, num_draft_tokens=4).generate(ids, **kwargs)
    assert torch.equal(got, expected)


def test_batch_rows_finishing_at_different_steps_are_padded_like_generate():
    model = make_model("llama")
    ids = _prompt(5, seed=9, batch=3)
    free = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None)
    eos = free[1, 5 + 6].item()  # row 1 stops early, the others later or never
    kwargs = dict(max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    got = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=5).generate(ids, **kwargs)
    assert torch.equal(got, expected)


def test_logits_processors_apply_identically_in_greedy():
    model = make_model("qwen2")
    ids = _prompt(6, seed=2)
    kwargs = dict(max_new_tokens=30, do_sample=False, eos_token_id=2, repetition_penalty=1.3, min_new_tokens=12,
                  no_repeat_ngram_size=3, suppress_tokens=[5, 6, 7])
    expected = model.generate(ids, **kwargs)
    got = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=4).generate(ids, **kwargs)
    assert torch.equal(got, expected)


def test_different_drafter_architecture_same_vocab():
    verifier = make_model("llama")
    draft = make_model("gpt2", seed=4)
    ids = _prompt(8)
    got = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=3).generate(
        ids, max_new_tokens=20, do_sample=False, eos_token_id=None)
    assert torch.equal(got, verifier.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=None))
