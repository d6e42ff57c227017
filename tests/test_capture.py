"""The capture module (``specdec.runners.capture``) proven on a CPU: what a raw CUDA graph of each phase relies on.

On a CPU every phase runs the stand-in: the same function, eagerly, over the same static buffers, its outputs copied
into the first call's. Over whole calls in which every acceptance count occurs (chains and trees, batch 1 and a ragged
3 with a retirement, greedy and sampling), for the verify pass and the head's draft chain:

- each key's function traces as one graph with ``torch.compile(fullgraph=True, dynamic=False)``, recompiles being
  errors (``capture.PROVE``): no graph break, no guard that changes between passes;
- the phase reads nothing back from the device and uploads nothing (HostTrace inside the phase);
- each key's ops and their shapes are the same every replay;
- every tensor it reads from outside (inputs, caches, weights) has the same address every pass, and no long-lived
  buffer moved (``recaptures == 0``);
- output equals ``model.generate``: token for token under greedy, the verifier's law under sampling.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import specdec
from law import ALPHA, chi2, exact_joint, tally
from specdec.drafters import AcceptanceProfile, ModelDrafter, SimulatedDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.host_trace import HostTrace, sync_report
from specdec.runners import capture
from specdec.runners.capture import CaptureError, PhaseGraphs
from test_compile_verifier import draft_of
from test_eagle import _batch, _random_head
from test_sampling import _tiny_vocab_model
from tiny_models import make_model, perturbed_copy

GREEDY = dict(do_sample=False, pad_token_id=0)


@pytest.fixture
def registry(monkeypatch):
    """Every PhaseGraphs made while the test runs."""
    made: list[PhaseGraphs] = []
    init = PhaseGraphs.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(PhaseGraphs, "__init__", record)
    return made


def _head_spec(model, k=4, tree=None, prepare=None, kind="head", **kwargs):
    """A random head (``kind="model"``: a perturbed copy as a model drafter) with every phase captured. ``prepare``
    (chains): ``(ids, mask, new, eos)`` of the call, whose drafts then follow the verifier's greedy tokens with a
    chosen acceptance (the drafter still runs every pass), so that every acceptance count occurs."""
    drafter = EagleDrafter(_random_head(model, "eagle3"), model) if kind == "head" else \
        ModelDrafter(perturbed_copy(model, 0.05))
    if prepare is not None:
        ids, mask, new, eos = prepare
        drafter = SimulatedDrafter(drafter, AcceptanceProfile.for_tokens_per_pass(2.5, k), seed=1)
        drafter.prepare(model, ids, mask, max_new_tokens=new, pad_token_id=0, eos_token_id=eos)
    return specdec.SpeculativeModel(model, drafter, num_draft_tokens=k, tree=tree, compile_verifier="graphs",
                                    compile_drafter="graphs", **kwargs), drafter


def _eos_for_some_rows(model, ids, mask, new):
    """A token that ends some rows of ``generate``'s output early, not all (a retirement mid-call)."""
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=None, **GREEDY)
    return next(int(t) for t in ref[0, ids.shape[1]:] if (ref[1:, ids.shape[1]:] != t).any())


# ---- the mechanism --------------------------------------------------------------------------------------------------


def test_the_stand_in_overwrites_outputs_as_a_replay_does():
    graphs = PhaseGraphs("toy", capture=True)  # on a CPU: the stand-in
    double = lambda x: (x * 2,)  # noqa: E731
    first = graphs.run("k", double, [torch.ones(3)])[0]
    held = first.clone()
    second = graphs.run("k", double, [torch.full((3,), 5.0)])[0]
    assert second is first and torch.equal(first, torch.full((3,), 10.0)) and not torch.equal(held, first)
    assert graphs.graphs == 1 and len(graphs.capture_seconds) == 1
    assert graphs.captured == 0 and graphs.replay_ms() == {}  # no real graph on a CPU: nothing to time


def test_a_keys_shapes_are_fixed_and_phases_take_tensors_only():
    graphs = PhaseGraphs("toy", capture=False)
    graphs.run("k", lambda x: x + 1, [torch.ones(3)])
    with pytest.raises(CaptureError, match="changed shape"):
        graphs.run("k", lambda x: x + 1, [torch.ones(4)])
    with pytest.raises(TypeError, match="tensors only"):
        graphs.run("other", lambda x, n: x + n, [torch.ones(3), 2])


def test_a_moved_buffer_makes_the_key_again():
    graphs = PhaseGraphs("toy", capture=False)
    cache = [torch.zeros(4)]
    write = lambda x: cache[0].add_(x)  # noqa: E731  (reads and writes a long-lived buffer in place)
    graphs.run("k", lambda x: write(x), [torch.ones(4)], cache)
    cache[0] = torch.zeros(4)  # the cache grew: new storage
    graphs.run("k", lambda x: write(x), [torch.ones(4)], cache)
    assert graphs.recaptures == 1 and torch.equal(cache[0], torch.ones(4))


def test_the_proof_fails_a_phase_that_depends_on_host_state(monkeypatch):
    """Negative control of PROVE: a phase whose function reads a host value that changes between passes (a graph
    would freeze it at capture) recompiles, an error."""
    monkeypatch.setattr(capture, "PROVE", True)
    graphs, state = PhaseGraphs("toy", capture=False), {"start": 0}
    shifted = lambda x: x + state["start"]  # noqa: E731
    graphs.run("k", shifted, [torch.ones(3)])
    state["start"] = 5
    with pytest.raises(Exception, match="(?i)recompil"):
        graphs.run("k", shifted, [torch.ones(3)])


def test_the_host_trace_check_sees_a_device_read_inside_a_phase():
    """Negative control of the no-read check: ``.item()`` inside a phase counts in the phase's region."""
    graphs = PhaseGraphs("toy", capture=False)
    with HostTrace() as trace:
        trace.wrap(PhaseGraphs, "_stand_in", region="phase")
        for _ in range(2):
            graphs.run("k", lambda x: x * int(x.sum().item()), [torch.ones(3)])
    assert sum(r.region_syncs["phase"] for r in trace.records) == 1  # the first call is not the stand-in's


def test_bad_compile_arguments_are_refused_early():
    model = make_model("llama")
    with pytest.raises(ValueError, match="compile_verifier must be"):
        specdec.SpeculativeModel(model, "prompt-lookup", compile_verifier="graph")
    with pytest.raises(ValueError, match="compile_drafter must be"):
        specdec.SpeculativeModel(model, "prompt-lookup", compile_drafter="inductor")
    with pytest.raises(ValueError, match="compile_drafter='graphs': PromptLookupDrafter"):
        specdec.SpeculativeModel(model, "prompt-lookup", compile_drafter="graphs")



def test_compile_true_means_fused_raw_graphs_on_cuda_and_torch_compile_elsewhere():
    """The H200 check (benchmarks/results/gpu/2026-11-28-h200-v3) measured raw graphs of fused kernels at 4.1x and
    5.6x hf-compiled, while torch.compile's own graphs did not prime in 75 s: on CUDA ``True`` means those graphs
    (a drafter that captures them included); on a CPU it keeps meaning ``torch.compile``; a dict is torch.compile's."""
    from specdec.api import CUDA_COMPILE, _compile_drafter, _static_options

    assert _static_options(True, False, 4, cuda=True) == CUDA_COMPILE == {"backend": "graphs", "fuse": True}
    assert _static_options(True, False, 4, cuda=False) is None
    assert _static_options({"mode": "reduce-overhead"}, False, 4, cuda=True) == {"mode": "reduce-overhead"}
    assert _static_options("graphs", False, 4, cuda=True) == {"backend": "graphs"}

    class Drafter:
        compilable, calls = True, []

        def __init__(self, graphs):
            self.captures_graphs = graphs

        def compile(self):
            self.calls.append("compile")

        def compile_graphs(self):
            self.calls.append("graphs")

    for graphs, cuda, expected in ((True, True, "graphs"), (True, False, "compile"), (False, True, "compile")):
        drafter = Drafter(graphs)
        drafter.calls = []
        _compile_drafter(drafter, True, cuda)
        assert drafter.calls == [expected], (graphs, cuda)

# ---- proofs over whole calls ----------------------------------------------------------------------------------------


class _PhaseRun(TorchDispatchMode):
    """One run of a phase: its ops with their shapes, in order, and the address of every tensor an op reads that the
    phase did not make itself (inputs, caches, weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: set[int] = set()
        self.read: set[int] = set()
        self.ops: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        flat = tree_flatten((args, kwargs or {}))[0]
        self.ops.append((func._schema.name, *[(tuple(t.shape), t.dtype) for t in flat if isinstance(t, torch.Tensor)]))
        for t in flat:
            if isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() not in self.made:
                self.read.add(t.untyped_storage().data_ptr())
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not func._schema.is_mutable:
                self.made.add(t.untyped_storage().data_ptr())
        return out


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("tree, kind", [(None, "head"), (None, "model"), ("dynamic", "head")])
def test_the_phases_trace_whole_read_nothing_back_and_keep_their_addresses(batch, tree, kind, registry, monkeypatch):
    model = make_model("llama")
    ids, mask = _batch(rows=batch)
    new = 30
    eos = _eos_for_some_rows(model, ids, mask, new) if batch > 1 else None
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=eos, **GREEDY)

    # 1. one graph per key, no recompile: dynamo's fullgraph trace of every key's function
    monkeypatch.setattr(capture, "PROVE", True)
    prepare = None if tree else (ids, mask, new, eos)
    spec, drafter = _head_spec(model, tree=tree, prepare=prepare, kind=kind)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=eos, **GREEDY)
    assert torch.equal(out, ref)
    if tree is None:  # every acceptance count occurred: none (position 0 rejected) to all k
        stats = spec.last_stats
        assert stats.proposed_per_position[0] > stats.accepted_per_position[0] and stats.accepted_per_position[-1] > 0
    monkeypatch.setattr(capture, "PROVE", False)
    spec.verifier.static.clear()  # its pooled caches carry the traced functions: part 2 captures afresh

    # 2. no device read or upload inside a phase; the same ops and shapes every pass; outside tensors stay put
    registry.clear()
    spec, drafter = _head_spec(model, tree=tree, prepare=prepare, kind=kind)
    runs: dict[tuple, list[_PhaseRun]] = {}
    stand_in = PhaseGraphs._stand_in

    def watched(self, entry):
        key = next(k for k, e in self._entries.items() if e is entry)
        with _PhaseRun() as run:
            result = stand_in(self, entry)
        runs.setdefault((self.name, id(self), key), []).append(run)
        return result

    monkeypatch.setattr(PhaseGraphs, "_stand_in", watched)
    with HostTrace(signatures=("phase",)) as trace:
        trace.mark_engine()
        trace.wrap(PhaseGraphs, "_stand_in", region="phase")
        out = spec.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=eos, **GREEDY)
    assert torch.equal(out, ref)
    assert sum(r.region_syncs["phase"] for r in trace.every_pass()) == 0, sync_report(trace)  # no read, no upload
    assert max(r.sync_count for r in trace.steady()) <= (2 if tree else 1), sync_report(trace)
    phases = {"verify", "draft" if kind == "head" else "step"} if tree is None else {"verify"}
    assert {name for name, _, _ in runs} == phases
    for key, per_run in runs.items():  # each graph: the same ops and shapes, the same outside tensors, every replay
        assert len(per_run) >= 2, key
        assert all(r.ops == per_run[0].ops and r.read == per_run[0].read for r in per_run), key
    assert sum(len(r) for r in runs.values()) >= 10
    assert registry and all(g.recaptures == 0 and g.failed is None for g in registry)


@pytest.mark.parametrize("tree", [None, "static", "dynamic"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("drafter", ["eagle3", "lookup", "composite", "layer-skip", "model"])
def test_greedy_identity_every_drafter_kind_with_captured_phases(tree, batch, drafter, registry):
    model = make_model("llama")
    draft = draft_of(drafter, model)
    options = {"compile_drafter": "graphs"} if drafter in ("eagle3", "layer-skip", "model") else {}
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tree=tree, compile_verifier="graphs", **options)
    ids, mask = _batch(rows=batch)
    gen = dict(attention_mask=mask, max_new_tokens=24, eos_token_id=None, **GREEDY)
    assert torch.equal(spec.generate(ids, **gen), model.generate(ids, **gen))
    static = spec.verifier.static
    assert static.raw_graphs and static.failed is None and static.passes > 0 and static.graphs >= 1
    assert all(g.recaptures == 0 for g in registry)


@pytest.mark.parametrize("batch", [1, 3])
def test_fused_kernels_inside_the_graphs_keep_output_exact(batch, registry):
    """``fuse``: the verify pass's function is the model through ``torch.compile(dynamic=False)`` (dynamo's eager
    backend here: the same trace inductor would get), captured as before."""
    model = make_model("llama")
    options = {"backend": "graphs", "fuse": True, "fuse_backend": "eager"}
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3, compile_verifier=options)
    ids, mask = _batch(rows=batch)
    gen = dict(attention_mask=mask, max_new_tokens=24, eos_token_id=None, **GREEDY)
    assert torch.equal(spec.generate(ids, **gen), model.generate(ids, **gen))
    static = spec.verifier.static
    assert static.fuse and static.failed is None and static.graphs >= 1 and spec.last_stats.accepted > 0


def _eos_midway(model, ids, mask, new: int) -> int:
    """A token one row emits as its 5th to 12th token and no other row emits: that row alone leaves mid-call."""
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=new, eos_token_id=None, **GREEDY)
    rows = ref[:, ids.shape[1]:].tolist()
    return next(t for r, row in enumerate(rows) for i, t in enumerate(row[4:12], start=4)
                if t not in row[:i] and all(t not in other for o, other in enumerate(rows) if o != r))


def test_graphs_are_reused_across_calls_and_a_retirement_keeps_every_shape(registry):
    model = make_model("llama")
    ids, mask = _batch(rows=3)
    new = 30
    eos = _eos_midway(model, ids, mask, new)
    spec, drafter = _head_spec(model, k=3, prepare=(ids, mask, new, eos))
    gen = dict(attention_mask=mask, max_new_tokens=new, eos_token_id=eos, **GREEDY)
    ref = model.generate(ids, **gen)
    assert torch.equal(spec.generate(ids, **gen), ref)
    verify_graphs = spec.verifier.static.graphs
    assert len({row.verifier_passes for row in spec.last_stats.rows}) > 1  # rows ended at different passes
    # the head kept the leaving rows as dummies: one draft graph (one head cache, one key) for the whole call
    # (the last passes, whose k the budget cuts, run the eager path on a copy of the live rows; the pooled cache
    # and its graph stay as they were, for the next call)
    captured = lambda: sum(g.graphs for g in registry if g.name == "draft")  # noqa: E731
    assert captured() == 1, [(g.name, list(g._entries)) for g in registry]
    assert torch.equal(spec.generate(ids, **gen), ref)
    assert spec.verifier.static.graphs == verify_graphs  # the pooled cache brought its graphs back
    assert captured() == 1  # and the pooled head cache its graph
    assert all(g.recaptures == 0 for g in registry)


def _sampled_pvalue(verifier, draft, exact, prompt, sampling, **options) -> float:
    spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=2, **options)
    out = spec.generate(prompt.expand(1500, -1), max_new_tokens=3, do_sample=True,
                        generator=torch.Generator().manual_seed(42), **sampling)
    assert spec.last_stats.proposed > spec.last_stats.accepted > 0
    return chi2(tally(out[:, prompt.shape[1]:].tolist()), exact, out.shape[0])


@pytest.fixture(scope="module")
def tiny_law():
    verifier = _tiny_vocab_model(0)
    prompt, sampling = torch.tensor([[3, 1, 4]]), dict(temperature=1.0, top_k=0, top_p=1.0)
    return verifier, perturbed_copy(verifier, 0.5), exact_joint(verifier, prompt, 3, **sampling), prompt, sampling


@pytest.mark.parametrize("drafter_graphs", [False, True], ids=["verifier", "verifier-and-drafter"])
def test_sampling_follows_the_verifier_with_captured_phases(tiny_law, drafter_graphs):
    options = {"compile_drafter": "graphs"} if drafter_graphs else {}
    assert _sampled_pvalue(*tiny_law, compile_verifier="graphs", **options) > ALPHA


def test_the_law_check_catches_a_graph_that_is_not_replayed(tiny_law, monkeypatch):
    """Negative control: a phase that returns its first outputs without running again (a stale graph) fails it."""
    monkeypatch.setattr(PhaseGraphs, "_stand_in", lambda self, entry: entry.outputs)
    assert _sampled_pvalue(*tiny_law, compile_verifier="graphs") < ALPHA
