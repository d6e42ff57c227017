"""At most two device reads per tree pass, counted per pass by ``specdec.host_trace.HostTrace`` (issue 43).

A tree pass needs one read: the engine's (accepted counts, committed tokens and the accepted path, in one copy;
the tree walk itself runs on the device). Its masks, acceptance tables and cache trimming are made from the host
structure the drafter holds. What a tree shape adds on top, per drafter:

- ``static``: the shape is known before drafting (only tokens are data), so EAGLE heads, model drafters and prompt
  lookup read once a pass. Composite reads twice: merging the lookup's branch into the model's tree as a trie
  compares the model's tokens on the host (one read of the tree's tokens).
- ``dynamic`` (EAGLE-2): the shape itself is data (which frontier nodes were best), read once when the tree is
  chosen, so twice a pass; prompt lookup builds its trees on the host (once).

Greedy and sampling (with a processor that reads the context, so per-node contexts are built too), one row and a
ragged batch of three, on a prompt that repeats itself (so the lookup finds branches); greedy output identical to
``model.generate``.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.drafters.eagle import EagleDrafter
from specdec.host_trace import HostTrace, sync_report
from test_eagle import _batch, _random_head
from tiny_models import make_model, perturbed_copy

DRAFTERS = ["eagle", "prompt-lookup", "model", "composite:int8"]
#: the most reads a steady pass may make, per (tree, drafter) (the module docstring says why)
BOUNDS = {("static", "composite:int8"): 2, ("dynamic", "eagle"): 2, ("dynamic", "model"): 2,
          ("dynamic", "composite:int8"): 2}


@pytest.fixture(scope="module")
def model():
    return make_model("llama")


def _spec(model, kind: str, tree: str) -> specdec.SpeculativeModel:
    draft = {"eagle": lambda: EagleDrafter(_random_head(model, "eagle3"), model),
             "model": lambda: perturbed_copy(model, 0.05)}.get(kind, lambda: kind)()
    return specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tree=tree)


@pytest.mark.parametrize("tree", ["static", "dynamic"])
@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sample"])
def test_a_tree_pass_reads_the_device_at_most_twice(model, tree, kind, batch, sample):
    ids, mask = _batch(rows=batch)
    ids, mask = torch.cat([ids, ids[:, -6:]], dim=1), torch.cat([mask, mask[:, -6:]], dim=1)  # text that repeats
    gen = dict(max_new_tokens=24, do_sample=sample, pad_token_id=0)
    if sample:  # min_new_tokens reads each context's length: per-node contexts are built, on the device
        gen.update(temperature=0.8, top_k=30, min_new_tokens=16, eos_token_id=[2, 7],
                   generator=torch.Generator(device="cpu").manual_seed(0))
    spec = _spec(model, kind, tree)
    with HostTrace() as trace:
        trace.mark_engine()
        out = spec.generate(ids, attention_mask=mask, **gen)
    steady = trace.steady()
    assert len(steady) >= 3, sync_report(trace)
    assert max(r.sync_count for r in steady) <= BOUNDS.get((tree, kind), 1), sync_report(trace)
    assert spec.last_stats.proposed > 0 and spec.last_stats.tree["mode"] == tree
    if not sample:
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0)
        assert torch.equal(out, ref)


@pytest.mark.parametrize("tree", ["static", "dynamic"])
@pytest.mark.parametrize("kind", ["eagle", "model"])
def test_a_traversal_pass_reads_no_more_than_a_token_pass(model, tree, kind):
    """Traversal verification walks every row on the device from host-built event lists: no read of its own, with
    sampled children (static) or top-ranked ones (dynamic)."""
    ids, mask = _batch(rows=3)
    draft = {"eagle": lambda: EagleDrafter(_random_head(model, "eagle3"), model),
             "model": lambda: perturbed_copy(model, 0.05)}[kind]()
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tree=tree, verify="traversal")
    with HostTrace() as trace:
        trace.mark_engine()
        spec.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=True, temperature=0.8, top_k=30,
                      pad_token_id=0, generator=torch.Generator(device="cpu").manual_seed(0))
    steady = trace.steady()
    assert len(steady) >= 3, sync_report(trace)
    assert max(r.sync_count for r in steady) <= BOUNDS.get((tree, kind), 1), sync_report(trace)
    assert spec.last_stats.proposed > 0 and spec.last_stats.verify == "traversal"
