"""The façade and the strategy below it (issue 46): one plan per call, its cache sizes counted once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import specdec
import specdec.strategy
from specdec.drafters import CompositeDrafter, ModelDrafter, PromptLookupDrafter
from specdec.runners.hf import CausalLMRunner, UnsupportedModelError
from specdec.slots import STATIC_LENGTH_STEP
from tiny_models import make_model, perturbed_copy

EAGER = {"backend": "eager"}


def test_speculative_model_is_a_facade_under_150_lines():
    tree = ast.parse((Path(specdec.__file__).parent / "api.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeModel")
    assert cls.end_lineno - cls.lineno + 1 < 150


@pytest.mark.parametrize("compiled", [False, True])
def test_the_memory_check_and_both_caches_read_one_count(monkeypatch, compiled):
    """What the memory check counted is what the verifier's cache allocates and what the drafter is told."""
    model = make_model("llama")
    seen: dict[str, list[int]] = {"check": [], "verifier": [], "drafter": []}
    check = specdec.strategy.check_fits
    monkeypatch.setattr(specdec.strategy, "check_fits", lambda *a, **k: seen["check"].append(k["max_len"]) or check(*a, **k))
    prefill = CausalLMRunner.prefill

    def recording_prefill(self, ids, mask, max_len, **kw):
        if self.role == "verifier":
            seen["verifier"].append(max_len)
        return prefill(self, ids, mask, max_len, **kw)

    monkeypatch.setattr(CausalLMRunner, "prefill", recording_prefill)
    start = ModelDrafter.start
    monkeypatch.setattr(ModelDrafter, "start", lambda self, ids, mask, max_len, **kw:
                        seen["drafter"].append(max_len) or start(self, ids, mask, max_len, **kw))
    spec = specdec.SpeculativeModel(model, ModelDrafter(perturbed_copy(model, 0.05)), num_draft_tokens=3,
                                    compile_verifier=EAGER if compiled else False)
    ids = torch.tensor([[5, 9, 14, 3, 7], [0, 0, 4, 8, 2]])
    call = spec.strategy.for_call(3, None, 2, 5, 17)
    spec.generate(ids, attention_mask=(ids != 0).long(), max_new_tokens=12, do_sample=False, eos_token_id=None,
                  pad_token_id=0)
    assert seen["check"][-1] == seen["verifier"][-1] == call.slots.verifier
    assert seen["drafter"][-1] == call.slots.rows
    assert (call.slots.verifier % STATIC_LENGTH_STEP == 0) == compiled
    assert call.slots.verifier >= call.slots.rows


def test_drafters_answer_for_their_own_models():
    model = make_model("llama")
    flash = perturbed_copy(model, 0.05)
    flash.config._attn_implementation = "flash_attention_2"
    composite = CompositeDrafter(ModelDrafter(flash))
    with pytest.raises(UnsupportedModelError):
        composite.check_tree_masks()  # the composite asks its model drafter, which asks its runner
    with pytest.raises(UnsupportedModelError):
        specdec.SpeculativeModel(model, composite, tree="dynamic")
    PromptLookupDrafter().check_tree_masks()  # no model: nothing to refuse
    assert PromptLookupDrafter().cost_ratio(model) == 0.02
    assert 0.02 <= ModelDrafter(perturbed_copy(model, 0.05)).cost_ratio(model) <= 1.0
    assert composite.cost_ratio(model) == ModelDrafter(flash).cost_ratio(model)


def test_draft_name_and_compiled_graphs_are_public():
    model = make_model("llama")
    assert specdec.SpeculativeModel(model, "prompt-lookup").draft_name == "prompt-lookup"
    assert specdec.SpeculativeModel(model, PromptLookupDrafter()).draft_name == "PromptLookupDrafter"
    assert specdec.SpeculativeModel(model, "prompt-lookup").compiled_graphs is None
    assert specdec.SpeculativeModel(model, "prompt-lookup", compile_verifier=EAGER).compiled_graphs >= 0
