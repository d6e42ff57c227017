"""Trees at the edges: options past the vocabulary, sliding-window drafters, short-context models, the
``auto`` cost curve under threads and in ``eval``, and cache slots sized by the call (issue 23)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import transformers as tf

import specdec
import specdec.strategy  # the tests patch names in it (the package imports it lazily)
from specdec.drafters import CompositeDrafter, ModelDrafter
from specdec.trees import TreeConfig, parse_tree
from specdec.trees.auto import VerifyCost, measure_verify_cost
from specdec.runners import CausalLMRunner
from tiny_models import COMMON, VOCAB, make_model, perturbed_copy

FLAT = VerifyCost((1, 64), (0.010, 0.011))
IDS = torch.tensor([[1, 5, 6, 7, 8, 9]])


def _greedy(model, spec, new=12, ids=IDS, seed=None, **kwargs):
    gen = None if seed is None else torch.Generator(device="cpu").manual_seed(seed)
    return spec.generate(ids, max_new_tokens=new, do_sample=False, pad_token_id=0, generator=gen, **kwargs)


# ---------------------------------------------------------------- ranks and top_k past the vocabulary


@pytest.mark.parametrize("tree, option", [([[0], [VOCAB]], "rank"),
                                          ({"mode": "dynamic", "top_k": VOCAB + 1, "depth": 2, "total_tokens": 8},
                                           "top_k")])
@pytest.mark.parametrize("drafter", ["model", "composite"])
def test_tree_options_past_the_vocabulary_are_refused_at_construction(tree, option, drafter):
    model = make_model("llama")
    draft = perturbed_copy(model, 0.05)
    draft = draft if drafter == "model" else CompositeDrafter(ModelDrafter(draft))
    with pytest.raises(ValueError, match=rf"{option}.*{VOCAB}") as err:
        specdec.SpeculativeModel(model, draft, tree=tree)
    assert "\n" not in str(err.value)


def test_tree_options_at_the_vocabulary_edge_still_work():
    model = make_model("llama")
    draft = perturbed_copy(model, 0.05)
    ref = model.generate(IDS, max_new_tokens=6, do_sample=False, pad_token_id=0)
    for tree in ([[0], [VOCAB - 1]], {"mode": "dynamic", "top_k": VOCAB, "depth": 2, "total_tokens": 8}):
        assert torch.equal(_greedy(model, specdec.SpeculativeModel(model, draft, tree=tree), new=6), ref)


def test_auto_top_k_is_clamped_to_a_tiny_vocabulary():
    """auto's bounds are specdec's defaults, not the user's: a vocabulary below them clamps them instead of failing."""
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=6, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.4,
                            bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = tf.LlamaForCausalLM(config).eval()
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), tree="auto", tree_cost=FLAT)
    assert spec.tree.top_k == 6
    ids = torch.tensor([[1, 2, 3]])
    ref = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(_greedy(model, spec, new=6, ids=ids), ref)


# ---------------------------------------------------------------- sliding-window drafters


@pytest.mark.parametrize("wrap", ["model", "drafter", "composite"])
def test_sliding_window_drafter_drafts_trees(wrap):
    verifier = make_model("llama")
    mistral = make_model("mistral")  # same vocabulary and special ids, sliding window 16 (the output passes it)
    draft = {"model": lambda: mistral, "drafter": lambda: ModelDrafter(mistral),
             "composite": lambda: CompositeDrafter(ModelDrafter(mistral))}[wrap]()
    spec = specdec.SpeculativeModel(verifier, draft, tree="dynamic")
    ref = verifier.generate(IDS, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(_greedy(verifier, spec, new=20), ref)
    assert spec.last_stats.proposed > 0


# ---------------------------------------------------------------- auto on short-context models


def _short_gpt2(positions: int):
    torch.manual_seed(0)
    config = tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=positions, **COMMON)
    return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.mark.parametrize("positions", [128, 40])
def test_auto_cost_curve_fits_a_model_with_few_positions(positions):
    model = _short_gpt2(positions)
    cost = measure_verify_cost(CausalLMRunner(model), repeats=1)
    assert cost.context >= 1 and cost.context + max(cost.sizes) <= positions
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), tree="auto")
    ref = model.generate(IDS, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(_greedy(model, spec, new=8), ref)


# ---------------------------------------------------------------- auto's cost curve: once, under threads


def test_auto_measures_its_cost_curve_once_under_concurrent_calls(monkeypatch):
    model = make_model("llama")
    calls = []

    def slow_measure(runner, *args, **kwargs):
        calls.append(threading.get_ident())
        time.sleep(0.3)  # widens the window in which other threads would start measuring too
        return VerifyCost((1, 64), (0.010, 0.011 + 0.001 * len(calls)))  # each measurement a different curve

    monkeypatch.setattr(specdec.strategy, "measure_verify_cost", slow_measure)
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.2), tree="auto")
    outputs = [None] * 4

    def call(i):
        gen = torch.Generator(device="cpu").manual_seed(7)
        outputs[i] = spec.generate(IDS, max_new_tokens=10, do_sample=True, pad_token_id=0, generator=gen)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    later = spec.generate(IDS, max_new_tokens=10, do_sample=True, pad_token_id=0,
                          generator=torch.Generator(device="cpu").manual_seed(7))
    assert all(torch.equal(o, later) for o in outputs)


def test_measure_tree_cost_is_public_and_idempotent(monkeypatch):
    model = make_model("llama")
    calls = []
    monkeypatch.setattr(specdec.strategy, "measure_verify_cost", lambda runner, *a, **k: calls.append(1) or FLAT)
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), tree="auto")
    assert spec.measure_tree_cost() is FLAT and spec.measure_tree_cost() is FLAT and len(calls) == 1
    _greedy(model, spec)
    assert len(calls) == 1
    chains = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05))
    assert chains.measure_tree_cost() is None and len(calls) == 1  # nothing to measure without tree="auto"


# ---------------------------------------------------------------- eval: measured before timing starts


def test_eval_measures_auto_cost_before_the_first_timed_call(monkeypatch, tmp_path):
    from specdec.eval import EvalConfig, run_eval
    from specdec.eval import measure as eval_measure
    from tiny_models import char_tokenizer

    events: list[str] = []
    monkeypatch.setattr(specdec.strategy, "measure_verify_cost", lambda runner, *a, **k: events.append("measure") or FLAT)
    timed = eval_measure.Runner._specdec

    def spy(self, *args, **kwargs):
        events.append(f"timed {self.method.name}")
        return timed(self, *args, **kwargs)

    monkeypatch.setattr(eval_measure.Runner, "_specdec", spy)
    model = make_model("llama")
    config = EvalConfig(out_dir=tmp_path, draft="self:bf16", num_draft_tokens=2, baselines=["hf"], tree=["none", "auto"],
                        max_new_tokens=4, progress=False, plots=False, warmup=False, chat=False)
    run_eval(model, char_tokenizer(), ["Tell me a story.", "Name a fruit."], config)
    assert events.count("measure") == 1
    first_auto = next(i for i, e in enumerate(events) if e.startswith("timed") and "tree=auto" in e)
    assert events.index("measure") < first_auto
    assert events.index("measure") < next(i for i, e in enumerate(events) if e.startswith("timed"))


# ---------------------------------------------------------------- cache slots sized by the call


def test_tree_config_for_a_call_caps_depth_nodes_and_fed():
    deep = TreeConfig(mode="dynamic", top_k=4, depth=10**7, total_tokens=10**7)
    call = deep.for_call(12)
    assert call.depth == 12 and call.max_fed == 4 * 11 and call.max_nodes == 4 + 11 * 16
    assert call.extra_slots < 300 and deep.for_call(10**9) == deep.for_call(10**9)
    small = TreeConfig(mode="dynamic", top_k=2, depth=3, total_tokens=5)
    assert small.for_call(12) == small  # nothing to cap
    static = parse_tree([[0], [0, 0], [0, 0, 0], [1], [1, 0]])
    assert static.for_call(2).choices == ((0,), (0, 0), (1,), (1, 0)) and static.for_call(50) == static
    assert parse_tree("auto").for_call(3).depth == 3


def test_deep_tree_slots_are_sized_by_the_call(monkeypatch):
    """depth=10**7 with 12 new tokens once asked for 76 GiB of cache: it must fit a small budget and stay exact."""
    model = make_model("llama")
    seen = []
    check = specdec.strategy.check_fits
    monkeypatch.setattr(specdec.strategy, "check_fits", lambda *a, **k: seen.append(k["max_len"]) or check(*a, **k))
    tree = {"mode": "dynamic", "top_k": 4, "depth": 10**7, "total_tokens": 10**7}
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), tree=tree, memory_budget="256MiB")
    ref = model.generate(IDS, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(_greedy(model, spec), ref)
    assert seen and seen[0] <= IDS.shape[1] + 12 + 4 + 11 * 16 + 4 * 11 + 1
    assert spec.last_stats.tree["depth"] == 10**7  # the summary reports the configuration asked for


def test_seeded_auto_sizes_with_the_measured_draft_step_and_it_can_be_pinned():
    """Seeded auto calls size trees with the drafter's measured step (once per object), not a weights ratio,
    and two objects given the same curve and step draw the same samples."""
    model = make_model("llama")
    draft = perturbed_copy(model, 0.05)
    ids = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    kwargs = dict(max_new_tokens=24, do_sample=True, eos_token_id=None)
    first = specdec.SpeculativeModel(model, draft, tree="auto")
    out = first.generate(ids, generator=torch.Generator().manual_seed(3), **kwargs)
    step = first.last_stats.tree["draft_step_s"]
    assert step == first.strategy.draft_step > 0  # measured on a short call: a model drafter's pass takes time
    assert first.last_stats.draft_seconds > 0
    pinned = specdec.SpeculativeModel(model, draft, tree="auto", tree_cost=first.tree_cost, tree_draft_step=step)
    assert torch.equal(pinned.generate(ids, generator=torch.Generator().manual_seed(3), **kwargs), out)
    assert pinned.last_stats.tree["draft_step_s"] == step
    with pytest.raises(ValueError, match="tree_draft_step"):
        specdec.SpeculativeModel(model, draft, tree="auto", tree_draft_step=-1.0)
