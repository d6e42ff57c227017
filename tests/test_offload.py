"""A verifier dispatched by accelerate with some layers offloaded to disk (issue 59 item 5), as users load a model
larger than their memory: every drafter kind is exact, or refused in one line before anything runs."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.draft_registry import DraftSpecError
from specdec.drafters.eagle import EagleDrafter
from specdec.quant import OffloadedModelError
from test_eagle import _batch, _random_head
from tiny_models import make_model, perturbed_copy

accelerate = pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def dispatched(tmp_path_factory):
    """A tiny Llama with its second layer offloaded to disk (its weights on the meta device, loaded by hooks), the
    reference output of the model before dispatching, and a separate draft model."""
    model = make_model("llama")
    draft = perturbed_copy(model, 0.05)
    ids, mask = _batch(rows=2)
    gen = dict(attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None)
    ref = model.generate(ids, **gen)
    device_map = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
                  "model.rotary_emb": "cpu", "lm_head": "cpu"}
    model = accelerate.dispatch_model(model, device_map=device_map, offload_dir=str(tmp_path_factory.mktemp("offload")))
    assert any(p.device.type == "meta" for p in model.parameters())
    assert torch.equal(model.generate(ids, **gen), ref)  # the dispatched model itself is the reference
    return model, draft, ids, gen, ref


@pytest.mark.parametrize("tree", [None, "dynamic"])
@pytest.mark.parametrize("kind", ["prompt-lookup", "suffix", "model", "eagle3"])
def test_drafters_that_need_no_copy_are_exact(dispatched, kind, tree):
    model, draft, ids, gen, ref = dispatched
    drafter = {"model": lambda: draft, "eagle3": lambda: EagleDrafter(_random_head(model, "eagle3"), model)}.get(
        kind, lambda: kind)()
    if kind == "suffix" and tree:
        pytest.skip("suffix drafts chains")
    out = specdec.SpeculativeModel(model, drafter, num_draft_tokens=3, tree=tree).generate(ids, **gen)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("kind, error, message", [
    ("self:bf16", OffloadedModelError, "cannot make a 'bf16' copy of a model whose weights accelerate offloaded"),
    ("self:int4", OffloadedModelError, "cannot make a 'int4:g32' copy"),
    ("composite:int4", OffloadedModelError, "cannot make a 'int4:g32' copy"),
    ("layer-skip:1", DraftSpecError, "cannot draft with the first layers of a model that accelerate dispatched"),
])
def test_drafters_built_from_its_weights_are_refused_in_one_line(dispatched, kind, error, message):
    model = dispatched[0]
    with pytest.raises(error, match=message) as caught:
        specdec.SpeculativeModel(model, kind, num_draft_tokens=3)
    assert "\n" not in str(caught.value)
