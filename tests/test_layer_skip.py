"""The layer-skip drafter (the verifier's first N layers and its head): shares weights, exact, bad counts refused."""

import pytest
import torch

import specdec
from tiny_models import make_model


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
