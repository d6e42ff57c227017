"""PARD drafters (``pard:DIR``): a draft model whose config names a mask token drafts ``k`` tokens in one forward.

Tiny random checkpoints in PARD's layout (a causal LM with ``pard_token`` in its config): the drafts of one pass are
those of a reference forward written here from the paper (the context, then ``k - 1`` mask tokens, one causal forward
without a cache, the last ``k`` positions' argmax); greedy output is ``generate``'s for chains and trees, batch 1 and
ragged batch 4; one drafter forward per pass whatever ``k``; the sampling law holds, and fails with a wrong ``q``."""

from __future__ import annotations

import pytest
import torch
from law import ALPHA, chi2, exact_joint, flat_q, tally
from tiny_models import char_tokenizer, left_padded, make_model

import specdec
from specdec.drafters.base import DraftContext, Rows
from specdec.draft_registry import DraftSpecError
from specdec.drafters.pard import PardConfigError, PardDrafter

MASK = 95  # the tiny vocabulary's last id, reserved as the mask token


def _pard_model(seed: int = 0, mask: int | list[int] = MASK) -> torch.nn.Module:
    model = make_model("llama", seed=seed)
    model.config.pard_token = mask
    return model


@pytest.fixture(scope="module")
def pard_dir(tmp_path_factory):
    """A PARD checkpoint for the tiny llama verifier: the verifier's own weights (so its first draft is always
    right and the masks' are not), saved with ``pard_token`` in its config."""
    path = tmp_path_factory.mktemp("pard")
    _pard_model().save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return str(path)


def test_one_forward_drafts_what_the_reference_forward_predicts():
    model = _pard_model(seed=3)
    prompt = torch.randint(4, 90, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = model(prompt).logits[:, -1].argmax(-1, keepdim=True)
    rows = Rows(torch.cat([prompt, first], dim=1), [10, 10])
    ctx = DraftContext(None, False, vocab_size=96)
    for k, mask in ((4, MASK), (3, [MASK, 94])):
        model.config.pard_token = mask
        drafter = PardDrafter(model).for_call()
        drafter.start(prompt, None, 64)
        drafts = drafter.propose(rows, k, ctx).tokens
        masks = torch.tensor([[MASK] * (k - 1)] if mask == MASK else [[MASK, 94]]).expand(2, -1)
        with torch.no_grad():  # the paper's description: context, k - 1 masks, one causal forward, the last k positions
            expected = model(torch.cat([rows.tokens, masks], dim=1)).logits[:, -k:].argmax(-1)
        assert torch.equal(drafts, expected)
        assert drafter.forwards == 2  # the prefill, then one forward for all k drafts
        assert drafter._session.length == 10  # the masks left the cache


@pytest.mark.parametrize("tree", [None, "static", "dynamic"])
def test_greedy_is_generate_at_batch_one_and_ragged_four(pard_dir, tree):
    verifier = make_model("llama")
    spec = specdec.SpeculativeModel(verifier, f"pard:{pard_dir}", num_draft_tokens=4, tree=tree)
    ids, mask = left_padded([5, 12, 8, 3], seed=4)
    kwargs = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(spec.generate(ids[1:2, -12:], **kwargs), verifier.generate(ids[1:2, -12:], **kwargs))
    assert torch.equal(spec.generate(ids, attention_mask=mask, **kwargs),
                       verifier.generate(ids, attention_mask=mask, **kwargs))
    assert spec.last_stats.accepted > 0


@pytest.mark.parametrize("k", [2, 6])
def test_one_drafter_forward_a_pass_whatever_k(pard_dir, k):
    verifier = make_model("llama")
    spec = specdec.SpeculativeModel(verifier, f"pard:{pard_dir}", num_draft_tokens=k)
    ids, _ = left_padded([10], seed=2)
    spec.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None)
    stats = spec.last_stats
    assert stats.drafter_forwards == stats.drafted_passes + 1  # + the prefill


def test_adaptive_k_and_an_int8_copy_stay_exact(pard_dir):
    verifier = make_model("llama")
    ids, mask = left_padded([7, 11], seed=5)
    kwargs = dict(max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0, attention_mask=mask)
    expected = verifier.generate(ids, **kwargs)
    for draft, options in ((f"pard:{pard_dir}", {"adaptive": True}), (f"pard:{pard_dir},quant=int8", {})):
        spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=4, **options)
        assert isinstance(spec.drafter, PardDrafter)
        assert torch.equal(spec.generate(ids, **kwargs), expected)


def test_a_model_without_pard_token_is_refused_naming_the_key(tmp_path):
    make_model("llama").save_pretrained(tmp_path)
    char_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(PardConfigError, match="pard_token"):
        specdec.SpeculativeModel(make_model("llama"), f"pard:{tmp_path}")
    with pytest.raises(DraftSpecError, match="quant=SCHEME"):
        specdec.SpeculativeModel(make_model("llama"), f"pard:{tmp_path},int8")


def _sampled_law(draft: torch.nn.Module, rows: int = 2400) -> float:
    from test_sampling import _tiny_vocab_model

    verifier = _tiny_vocab_model(4)
    prompt, steps = torch.tensor([[3, 1, 4, 3, 1]]), 3
    spec = specdec.SpeculativeModel(verifier, PardDrafter(draft), num_draft_tokens=2)
    sampling = dict(temperature=0.9, top_k=6)
    out = spec.generate(prompt.expand(rows, -1), max_new_tokens=steps, do_sample=True,
                        generator=torch.Generator().manual_seed(11), **sampling)
    assert spec.last_stats.accepted > 0
    return chi2(tally(out[:, prompt.shape[1]:].tolist()), exact_joint(verifier, prompt, steps, **sampling), rows)


def _tiny_pard():
    from test_sampling import _tiny_vocab_model
    from tiny_models import perturbed_copy

    draft = perturbed_copy(_tiny_vocab_model(4), 0.3)
    draft.config.pard_token = 7
    return draft


def test_sampled_drafts_keep_the_verifier_law():
    assert _sampled_law(_tiny_pard()) > ALPHA


def test_drafts_judged_by_a_q_they_were_not_drawn_from_fail_the_same_law_test(monkeypatch):
    """The negative control: drafts judged by a flat ``q`` over the same support, not the distribution they were
    drawn from."""
    monkeypatch.setattr(PardDrafter, "propose", flat_q(PardDrafter.propose))
    assert _sampled_law(_tiny_pard()) < ALPHA
