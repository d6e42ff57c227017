"""compile_drafter: the drafter runs through torch.compile; output stays the verifier's (compile_verifier: test_compile_verifier.py)."""

import pytest
import torch

import specdec
from specdec.drafters import CompositeDrafter, ModelDrafter
from specdec.drafters.eagle import EagleDrafter
from test_eagle import _batch, _random_head
from tiny_models import make_model, perturbed_copy


def test_compiled_drafter_keeps_output_exact_and_compiles_only_when_primed():
    from torch._dynamo.utils import counters

    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3, compile_drafter=True)
    runner = spec.drafter.runner
    spec.drafter.prime()
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2  # one-token and several-token steps
    kwargs = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    for ids in (torch.tensor([[5, 9, 14, 3, 7]]), torch.tensor([[8, 1, 4, 4, 6, 2, 9, 11]])):
        assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
        assert spec.last_stats.accepted > 0
    batch = torch.tensor([[0, 0, 5, 9, 14], [1, 2, 3, 4, 5]])  # batches run the drafter eagerly
    assert torch.equal(spec.generate(batch, attention_mask=(batch != 0).long(), **kwargs),
                       model.generate(batch, attention_mask=(batch != 0).long(), **kwargs))
    assert runner._compiled is not None  # it really ran compiled (no fallback) ...
    assert counters["stats"]["unique_graphs"] == graphs  # ... and nothing was compiled after priming


@pytest.mark.parametrize("role", ["drafter", "verifier"])
def test_failed_compilation_falls_back_to_eager(monkeypatch, role):
    """No compiler: a warning, then the same output eagerly (compile_verifier: the same static passes, uncompiled)."""
    from torch._dynamo.exc import TorchDynamoException

    def broken(module, **kwargs):
        def call(**inputs):
            raise TorchDynamoException("no compiler here")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3, **{f"compile_{role}": True})
    ids = torch.tensor([[5, 9, 14]])
    with pytest.warns(UserWarning, match=f"torch.compile failed for the {role}"):
        out = spec.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert torch.equal(out, model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None))
    if role == "drafter":
        assert spec.drafter.runner._compiled is None
    else:
        assert "no compiler here" in spec.verifier.static.failed


def test_compile_needs_a_model_drafter():
    model = make_model("llama")
    with pytest.raises(ValueError, match="no model to compile"):
        specdec.SpeculativeModel(model, "prompt-lookup", compile_drafter=True)
    composite = specdec.SpeculativeModel(model, specdec.drafters.CompositeDrafter(ModelDrafter(perturbed_copy(model, 0.1))),
                                         compile_drafter=True)
    assert composite.drafter.model_drafter.runner._compiled is not None


class _Recording(EagleDrafter):
    """Records every proposal (chain tokens, or a tree's tokens) into ``self.seen`` (shared by per-call copies)."""

    def propose(self, rows, k, ctx):
        proposal = super().propose(rows, k, ctx)
        self.seen.append(proposal.tokens.tolist())
        return proposal

    def propose_tree(self, rows, shape, ctx):
        tree = super().propose_tree(rows, shape, ctx)
        self.seen.append(tree.tokens.tolist())
        return tree


def _recording(model, head):
    drafter = _Recording(head, model)
    drafter.seen = []
    return drafter


@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_compiled_head_drafts_what_the_eager_head_drafts(tree):
    """compile_drafter on an EAGLE-3 head (inductor): the same drafts as the eager head, batch 1 and ragged 3, the
    output the verifier's, no fallback, every pass kind compiled by prime() (a pass that hit dynamo's recompile
    limit would run eagerly without a word: here it fails), nothing compiled after it; a second head compiles too."""
    from torch._dynamo import config
    from torch._dynamo.utils import counters

    model = make_model("llama")
    head = _random_head(model, "eagle3")
    eager = specdec.SpeculativeModel(model, _recording(model, head), num_draft_tokens=3, tree=tree)
    compiled = specdec.SpeculativeModel(model, _recording(model, head), num_draft_tokens=3, tree=tree,
                                        compile_drafter=True)
    kwargs = dict(max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
    ids, mask = _batch()
    with config.patch(fail_on_recompile_limit_hit=True):
        frames = counters["frames"]["ok"]
        compiled.drafter.prime()
        assert counters["frames"]["ok"] - frames >= 10  # feed, step, tree and logits, 1 row and several
        compiled.drafter.seen.clear()  # the dummy passes' drafts
        for inputs in (dict(input_ids=ids[:1]), dict(input_ids=ids, attention_mask=mask)):
            expected = model.generate(**inputs, **kwargs)
            assert torch.equal(eager.generate(**inputs, **kwargs), expected)
            with config.patch(error_on_recompile=True):  # primed: any compilation now is an error
                assert torch.equal(compiled.generate(**inputs, **kwargs), expected)
        assert compiled.drafter.seen == eager.drafter.seen and len(eager.drafter.seen) > 8
        assert compiled.drafter._compiled  # it ran compiled (no fallback)
        other = EagleDrafter(_random_head(model, "eagle3", seed=1), model)  # its own graphs, its own budget
        other.compile()
        frames = counters["frames"]["ok"]
        other.prime()
        assert counters["frames"]["ok"] - frames >= 10


def test_a_head_whose_compilation_fails_runs_eagerly(monkeypatch):
    from torch._dynamo.exc import TorchDynamoException

    def broken(fn, **kwargs):
        def call(*args):
            raise TorchDynamoException("no compiler here")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, EagleDrafter(_random_head(model, "eagle3"), model), num_draft_tokens=3,
                                    compile_drafter=True)
    ids = torch.tensor([[5, 9, 14]])
    with pytest.warns(UserWarning, match="torch.compile failed for the drafter"):
        out = spec.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert torch.equal(out, model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None))
    assert spec.drafter._compiled == {}  # emptied: the next calls go eager without trying again


def test_composite_with_a_head_compiles_the_head():
    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, CompositeDrafter(EagleDrafter(_random_head(model, "eagle3"), model)),
                                    compile_drafter=True)
    assert spec.drafter.compilable and spec.drafter.model_drafter._compiled
