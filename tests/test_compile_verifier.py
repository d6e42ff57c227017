"""compile_verifier: static verify passes through torch.compile; output stays model.generate's.

Most cases compile with dynamo's ``eager`` backend: it traces exactly what inductor would get (the static
layout, the guards that decide recompiles) in a fraction of the time. Inductor itself runs on the tiny Llama
and on the real model. ``pads`` is forced on for some cases: that is the CUDA-graph layout (passes padded to
fixed widths), which CPU inductor does not need.
"""

import pytest
import torch

import specdec
from specdec.drafters import CompositeDrafter, ModelDrafter, PromptLookupDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.slots import STATIC_LENGTH_STEP, pass_widths, static_slots
from specdec.runners import UnsupportedModelError
from test_eagle import _batch, _random_head
from tiny_models import CONFIGS, make_model, perturbed_copy

ARCHS = sorted(CONFIGS)  # mistral's sliding window (16) cuts: prompts plus output pass it (test_sliding_window.py: more)
EAGER = {"backend": "eager"}


def draft_of(kind: str, model):
    """A fresh drafter of ``kind`` (``eagle3``, ``lookup``, ``composite``, ``layer-skip``, ``model``) for ``model``."""
    return {"eagle3": lambda: EagleDrafter(_random_head(model, "eagle3"), model),
            "lookup": lambda: PromptLookupDrafter(),
            "composite": lambda: CompositeDrafter(ModelDrafter(perturbed_copy(model, 0.05))),
            "layer-skip": lambda: "layer-skip:1",
            "model": lambda: perturbed_copy(model, 0.05)}[kind]()


def _spec(model, draft, pads=False, options=EAGER, **kwargs):
    spec = specdec.SpeculativeModel(model, draft, compile_verifier=options, **kwargs)
    spec.verifier.static.pads = pads
    return spec


def _identical(spec, model, batch, new=24, eos=None, **kwargs):
    ids, mask = _batch(rows=batch)
    gen = dict(attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=eos, **kwargs)
    ref = model.generate(ids, **gen)
    out = spec.generate(ids, **gen)
    assert torch.equal(out, ref)
    assert spec.verifier.static.failed is None and spec.verifier.static.passes > 0  # it really ran compiled
    return spec.last_stats


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_greedy_identity_every_architecture(arch, batch, tree):
    model = make_model(arch)
    for pads in (False, True):
        stats = _identical(_spec(model, perturbed_copy(model, 0.05), pads, num_draft_tokens=3, tree=tree), model, batch)
        assert stats.accepted > 0


@pytest.mark.parametrize("tree", [None, "static", "dynamic", "auto"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("drafter", ["eagle3", "lookup", "composite", "layer-skip", "model"])
def test_greedy_identity_every_drafter_kind_with_padded_passes(tree, batch, drafter):
    model = make_model("llama")
    draft = draft_of(drafter, model)
    cost = specdec.trees.auto.VerifyCost((1, 64), (0.010, 0.330)) if tree == "auto" else None
    _identical(_spec(model, draft, pads=True, num_draft_tokens=4, tree=tree, tree_cost=cost), model, batch)


@pytest.mark.parametrize("pads", [False, True])
def test_rows_that_finish_early_stay_as_masked_dummies(pads):
    """An EOS that ends some rows early: they stay in the static buffers (the batch keeps its shape) while the
    others go on, and every row still equals generate's."""
    model = make_model("gpt2")
    ids, mask = _batch(rows=3)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0)
    eos = next(int(t) for t in ref[0, ids.shape[1]:] if (ref[1:, ids.shape[1]:] != t).any())  # ends some rows only
    for tree in (None, "dynamic"):
        spec = _spec(model, perturbed_copy(model, 0.05), pads, num_draft_tokens=3, tree=tree)
        _identical(spec, model, 3, new=30, eos=eos)
        assert len({row.verifier_passes for row in spec.last_stats.rows}) > 1  # rows ended at different passes


def test_seeded_sampling_draws_what_eager_specdec_draws():
    """Same logits up to float rounding and the same random stream: the same samples as without compiling."""
    model = make_model("llama")
    draft = perturbed_copy(model, 0.1)
    ids, mask = _batch(rows=3)
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=True, temperature=0.9, top_k=20, pad_token_id=0)
    for tree in (None, "dynamic"):
        eager = specdec.SpeculativeModel(model, draft, num_draft_tokens=3, tree=tree)
        static = _spec(model, draft, True, num_draft_tokens=3, tree=tree)
        a = eager.generate(ids, generator=torch.Generator().manual_seed(7), **kwargs)
        b = static.generate(ids, generator=torch.Generator().manual_seed(7), **kwargs)
        assert torch.equal(a, b)


def test_auto_sampling_switching_chains_and_trees_draws_what_eager_specdec_draws(monkeypatch):
    """``tree="auto"`` under sampling drafts sampled chains between trees (:mod:`specdec.trees.arms`; forced in turn
    here): compiled passes padded to the tree's widths take the chains too, and draw what eager specdec draws."""
    from test_trees import _force_arms

    _force_arms(monkeypatch, ["chain", "tree"])
    model = make_model("llama")
    draft = perturbed_copy(model, 0.1)
    ids, mask = _batch(rows=3)
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=True, temperature=0.9, top_k=20, pad_token_id=0)
    auto = dict(num_draft_tokens=3, tree="auto", tree_cost=specdec.trees.auto.VerifyCost((1, 64), (0.010, 0.011)),
                tree_draft_step=0.001)
    eager = specdec.SpeculativeModel(model, draft, **auto)
    static = _spec(model, draft, True, **auto)
    a = eager.generate(ids, generator=torch.Generator().manual_seed(7), **kwargs)
    b = static.generate(ids, generator=torch.Generator().manual_seed(7), **kwargs)
    assert torch.equal(a, b)
    passes = static.last_stats.tree["chain_or_tree"]["passes"]
    assert passes["chain"] >= 2 and passes["tree"] >= 2 and static.verifier.static.passes > 0, passes


def test_inductor_on_the_tiny_llama_compiles_only_when_primed():
    """Real inductor graphs: exact output, and after prime_verifier no call of the primed shapes compiles."""
    from torch._dynamo.utils import counters

    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3, compile_verifier=True)
    prompts = [torch.tensor([[5, 9, 14, 3, 7]]), torch.tensor([[8, 1, 4, 4, 6, 2, 9, 11]])]
    seen = []
    seconds = spec.prime_verifier(20, [p.shape[1] for p in prompts], progress=lambda done, total: seen.append((done, total)))
    assert seconds > 0 and seen[-1] == (3, 3)  # one length bucket x widths 1, 2 and k + 1 (the rest reuse 2's graph)
    graphs = counters["stats"]["unique_graphs"]
    kwargs = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    for ids in prompts:
        assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.verifier.static.failed is None
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled inside a call


def test_caches_are_pooled_between_calls():
    """CUDA graphs replay fixed addresses: a second call of the same shape reuses the first call's buffers."""
    model = make_model("llama")
    spec = _spec(model, "prompt-lookup", num_draft_tokens=3)
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    pointers = []
    original = spec.verifier.static.give_back

    def record(cache):
        pointers.append(cache.layers[0].keys.data_ptr())
        original(cache)

    spec.verifier.static.give_back = record
    for _ in range(2):
        spec.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert len(pointers) == 2 and pointers[0] == pointers[1]
    spec.verifier.static.clear()
    assert not spec.verifier.static._free


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("drafter", ["lookup", "model"])
def test_a_padded_chain_call_compiles_one_graph(drafter, batch):
    """CUDA graphs' layout on a CPU: every verify pass of a chain call, whatever it drafted (prompt lookup's
    passes without a match carry one token), runs at width k + 1 with static shapes, so dynamo compiles once."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    model = make_model("llama")
    draft = PromptLookupDrafter() if drafter == "lookup" else perturbed_copy(model, 0.05)
    spec = _spec(model, draft, pads=True, options={"backend": counter, "dynamic": False}, num_draft_tokens=4)
    stats = _identical(spec, model, batch, new=40)
    assert spec.verifier.static.passes > 3 and counter.frame_count == 1, (spec.verifier.static.passes, counter.frame_count)
    assert stats.new_tokens > 0


def test_padded_passes_compile_static_shapes():
    """With CUDA graphs (padded passes) dynamo's shapes are static unless the caller says otherwise."""
    from specdec.runners.static import StaticVerifier

    model = make_model("llama")
    assert StaticVerifier(model, {"backend": "cudagraphs"}).options["dynamic"] is False
    assert StaticVerifier(model, {"backend": "cudagraphs", "dynamic": True}).options["dynamic"] is True
    assert "dynamic" not in StaticVerifier(model, {"backend": "eager"}).options


def test_static_lengths_and_widths():
    assert pass_widths(4) == (5,)  # a chain: every pass padded to k + 1, one graph
    assert pass_widths(4, max_nodes=12) == (1, 2, 4, 8, 13)
    assert pass_widths(4, max_nodes=64) == (1, 2, 4, 8, 16, 32, 64, 65)
    assert static_slots(100, (1, 5)) == STATIC_LENGTH_STEP
    assert static_slots(STATIC_LENGTH_STEP - 5, (1, 5)) == STATIC_LENGTH_STEP
    assert static_slots(STATIC_LENGTH_STEP - 4, (1, 5)) == 2 * STATIC_LENGTH_STEP


def test_memory_check_counts_the_longer_static_cache(monkeypatch):
    model = make_model("llama")
    budgets = []
    import specdec.strategy as strategy

    monkeypatch.setattr(strategy, "check_fits", lambda *a, **kw: budgets.append(kw["max_len"]))
    ids = torch.tensor([[5, 9, 14, 3, 7]])
    for options in (False, EAGER):
        specdec.SpeculativeModel(model, "prompt-lookup", num_draft_tokens=3, compile_verifier=options).generate(
            ids, max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert budgets[0] < budgets[1] == STATIC_LENGTH_STEP


def test_refusals():
    model = make_model("llama")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UnsupportedModelError, match="ignores custom 4-D masks: a compiled verifier"):
        specdec.SpeculativeModel(model, "prompt-lookup", compile_verifier=True)
    with pytest.raises(ValueError, match="compile_verifier must be a bool, 'graphs' or a dict"):
        specdec.SpeculativeModel(make_model("llama"), "prompt-lookup", compile_verifier="yes")


@pytest.mark.slow
@pytest.mark.parametrize("tree", [None, "auto"])
def test_real_model_greedy_identity_batch_1_and_ragged_3(smollm2, tree):
    """Inductor graphs of the real model: token-identical to generate, chains and auto trees, one row and a
    ragged batch of three (rows of very different lengths)."""
    from specdec.eval.side_by_side import BUILTIN_PROMPTS, encode_prompt

    model, tokenizer = smollm2
    spec = specdec.SpeculativeModel(model, "prompt-lookup", num_draft_tokens=4, tokenizer=tokenizer, tree=tree,
                                    compile_verifier=True)
    prompts = [encode_prompt(tokenizer, item["prompt"])[0] for item in BUILTIN_PROMPTS[:3]]
    kwargs = dict(max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    ids = prompts[0].unsqueeze(0)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    width = max(len(p) for p in prompts)
    batch = torch.full((3, width), tokenizer.eos_token_id, dtype=torch.long)
    mask = torch.zeros_like(batch)
    for r, p in enumerate(prompts):
        batch[r, width - len(p):], mask[r, width - len(p):] = p, 1
    got = spec.generate(batch, attention_mask=mask, **kwargs)
    for r, p in enumerate(prompts):
        alone = model.generate(p.unsqueeze(0), **kwargs)[0, len(p):]
        assert torch.equal(got[r, width: width + len(alone)], alone), f"row {r}"
    # graphs may come from earlier tests (dynamo caches per model class): what counts is that passes ran compiled
    assert spec.verifier.static.failed is None and spec.verifier.static.passes > 0
