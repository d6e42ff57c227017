"""The composite drafter (prompt lookup where the text repeats, else a model drafter): exact, and uses both.

Trees with it: test_trees.py; with a head inside: test_composite_head.py."""

import pytest
import torch

import specdec
from tiny_models import make_model


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
