"""The Drafter base class, the one drafter-name parser, and that nothing probes drafters any more."""

import ast
import re
from pathlib import Path

import pytest
import torch

import specdec
from specdec.draft_spec import DraftSpecError, parse_draft
from specdec.drafters import CompositeDrafter, Drafter, ModelDrafter, PromptLookupDrafter, register_drafter, resolve_drafter
from tiny_models import make_model, perturbed_copy

ROOT = Path(__file__).resolve().parents[1] / "specdec"


def test_defaults_of_the_base_class():
    class Minimal(Drafter):
        def propose(self, rows, k, ctx):
            raise AssertionError

    d = Minimal()
    assert d.model is None and not d.compilable and d.hidden_layers == () and d.stats() == {}
    with pytest.raises(ValueError, match="no model to compile"):
        d.compile()
    d.prime()  # nothing to do
    assert d.for_call() is not d


def test_per_call_copies_share_weights_not_state():
    model = make_model("llama")
    composite = CompositeDrafter(ModelDrafter(perturbed_copy(model, 0.05)))
    call = composite.for_call()
    assert call.model is composite.model  # weights shared
    assert call.model_drafter is not composite.model_drafter and call.lookup is not composite.lookup
    assert call.model_drafter.runner is composite.model_drafter.runner  # compiled graphs shared too


@pytest.mark.parametrize("spec,kind,arg", [
    ("self:int8", "self", "int8"), ("composite", "composite", "int8"), ("composite:int4:g128", "composite", "int4:g128"),
    ("prompt-lookup", "prompt-lookup", None), ("layer-skip:3", "layer-skip", 3), ("/some/dir", "path", None),
])
def test_parse_draft(spec, kind, arg):
    parsed = parse_draft(spec)
    assert parsed.kind == kind and (parsed.scheme if kind in ("self", "composite") else parsed.layers) == arg
    assert parsed.hf_assistant == (kind in ("self", "path"))


@pytest.mark.parametrize("spec,message", [("layer-skip:0", "layer count >= 1"), ("layer-skip:x", "layer count"),
                                          ("self:", "needs a quantization scheme"), ("", "non-empty")])
def test_parse_draft_errors(spec, message):
    with pytest.raises(DraftSpecError, match=message):
        parse_draft(spec)


def test_registered_drafters_resolve_everywhere():
    model = make_model("llama")
    register_drafter("test-lookup", lambda spec, verifier, tok: PromptLookupDrafter(max_ngram=int(spec.split(":")[1])))
    drafter = resolve_drafter("test-lookup:5", model)
    assert isinstance(drafter, PromptLookupDrafter) and drafter.max_ngram == 5
    assert not parse_draft("test-lookup:5").hf_assistant
    ids = torch.tensor([[4, 5, 6, 4, 5, 6, 4, 5]], device="cpu")
    kwargs = dict(max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert torch.equal(specdec.SpeculativeModel(model, "test-lookup:3").generate(ids, **kwargs), model.generate(ids, **kwargs))
    with pytest.raises(ValueError, match="built-in"):
        register_drafter("self", lambda *a: None)


def _probes(path: Path) -> list[str]:
    """hasattr/getattr calls on a drafter object (``drafter``, ``self.model_drafter``, ``spec.drafter``...)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr"):
            if node.args and re.search(r"(^|\.)\w*drafter$", ast.unparse(node.args[0])):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_probes_drafters_with_hasattr():
    probes = [p for path in sorted(ROOT.rglob("*.py")) for p in _probes(path)]
    assert not probes, "probe the Drafter base class's members instead:\n" + "\n".join(probes)
