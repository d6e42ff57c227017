"""Model drafters (specdec.drafters.model): early stop on confidence, and adopting the verifier's prompt cache."""

import pytest
import torch

import specdec
from tiny_models import make_model


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
    from specdec.runners.hf import shares_kv_layout

    llama, gpt2 = make_model("llama"), make_model("gpt2")
    assert not shares_kv_layout(llama.config, gpt2.config)
    drafter = ModelDrafter(gpt2, reuse_verifier_prompt=True)
    spec = specdec.SpeculativeModel(llama, drafter, num_draft_tokens=3)
    ids = torch.tensor([[4, 9, 13, 2, 77]])
    kwargs = dict(max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **kwargs), llama.generate(ids, **kwargs))
    assert spec.last_stats.drafter_stats["adopted_prompt"] is False
