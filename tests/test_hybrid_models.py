"""Hybrid models (recurrent / convolutional layers beside attention): chains exact against ``generate``, and the
rollback of recurrent state (the verifier's and a model drafter's) equal to a fresh run over the kept tokens."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from law import ALPHA, chi2, exact_joint, tally
from tiny_hybrids import CONFIGS, make_hybrid
from tiny_models import COMMON, VOCAB, left_padded, perturbed_copy

import specdec
from specdec.runners import CausalLMRunner
from specdec.runners.hf import UnsupportedModelError
from specdec.runners import capture, scans
from specdec.runners.recurrent import PerPosition, RecurrentHistory, RecurrentLayer

# pure recurrent models (no attention at all): Mamba-2, and Mamba-1 (whose scan specdec continues from the state)
RECURRENT = {
    "mamba2": lambda: tf.Mamba2Config(hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, n_groups=1,
                                      state_size=16, expand=2, chunk_size=8, **COMMON),
    "mamba": lambda: tf.MambaConfig(hidden_size=64, num_hidden_layers=2, state_size=8, **COMMON),
    "falcon_mamba": lambda: tf.FalconMambaConfig(hidden_size=64, num_hidden_layers=2, state_size=8, **COMMON),
}
ARCHS = [*CONFIGS, *RECURRENT]


def _model(arch: str, seed: int = 0) -> torch.nn.Module:
    return make_hybrid(arch, seed, config=RECURRENT[arch]() if arch in RECURRENT else None)


@pytest.fixture(scope="module", params=ARCHS)
def hybrid(request):
    model = _model(request.param)
    return request.param, model, perturbed_copy(model, 0.05)


def _prompt(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


# ---- end to end: greedy chains and trees equal generate ---------------------------------------------------------


# the fast twins of each family: a model drafter at k=3 in a chain and a static tree, prompt lookup at k=1; the rest
# of the grid is slow
FAST = {(3, "model", None), (3, "model", "static"), (1, "prompt-lookup", None)}
GRID = [pytest.param(k, d, tree, marks=() if (k, d, tree) in FAST else pytest.mark.slow)
        for k in (1, 3) for d in ("prompt-lookup", "model") for tree in (None, "static", "dynamic")]


@pytest.mark.parametrize("k,drafter,tree", GRID)
def test_greedy_matches_generate(hybrid, k, drafter, tree):
    arch, model, draft = hybrid
    spec = specdec.SpeculativeModel(model, draft if drafter == "model" else drafter, num_draft_tokens=k,
                                    **({"tree": tree} if tree else {}))
    ids = _prompt(7, seed=k)
    kwargs = dict(max_new_tokens=14, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs)), f"{arch} batch 1"
    # a left-padded batch of 3 whose rows finish at different steps (row 0 meets its EOS early)
    ids, mask = left_padded([5, 9, 3], seed=k)
    free = model.generate(ids[:1, -5:], max_new_tokens=6, do_sample=False, eos_token_id=None)
    eos = int(free[0, -2])
    kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0)
    got = spec.generate(ids, **kwargs)
    assert torch.equal(got, model.generate(ids, **kwargs)), f"{arch} ragged"
    if (k, drafter, tree) == (3, "model", None):  # drafts were rejected: the ragged rollback ran (k=1 may accept all)
        assert spec.last_stats.proposed > spec.last_stats.accepted > 0


def test_self_bf16_drafter_adopts_the_prompt_state():
    model = _model("qwen3_next")
    spec = specdec.SpeculativeModel(model, "self:bf16", num_draft_tokens=3)
    ids, mask = left_padded([5, 8, 3], seed=2)
    kwargs = dict(attention_mask=mask, max_new_tokens=15, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.drafter_stats["adopted_prompt"]
    assert spec.last_stats.accepted > 0


# ---- the rollback itself ------------------------------------------------------------------------------------------


def _states(session) -> dict[tuple[int, str, int], torch.Tensor]:
    """Every recurrent layer's conv and recurrent states, keyed by (layer, kind, state index)."""
    out = {}
    for i, layer in session.recurrent.layers.items():
        for kind in ("conv_states", "recurrent_states"):
            for s, value in getattr(layer, kind).items():
                if value is not None:
                    out[(i, kind, s)] = value.clone()
    return out


def _assert_row(got: dict, ref: dict, row: int, ref_row: int | None = None, exact: bool = False) -> None:
    assert got.keys() == ref.keys() and got
    for key in got:
        a, b = got[key][row], ref[key][row if ref_row is None else ref_row]
        if exact:
            assert torch.equal(a, b), key
        else:
            # a later layer's input comes from a wider pass than the fresh run's: float rounding only
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, key=key: f"{key}: {m}")


LENGTHS, SLOTS = [5, 8, 3, 6], 40


@pytest.mark.parametrize("arch", ARCHS)
def test_verify_pass_rollback_equals_a_fresh_run(arch, monkeypatch):
    """One 4-token pass, rows keeping 0..4 of it: each row's state and next logits are those of a fresh run over
    the kept tokens, selected from the states the pass kept per position (no replay, no second model pass)."""
    runner = CausalLMRunner(_model(arch))
    monkeypatch.setattr(RecurrentHistory, "_replay", _no_replay)
    ids, mask = left_padded(LENGTHS, seed=1)
    gen = torch.Generator().manual_seed(2)
    block = torch.randint(3, VOCAB, (4, 4), generator=gen)
    nxt = torch.randint(3, VOCAB, (4, 1), generator=gen)
    kept = [0, 1, 3, 4]
    session, _ = runner.prefill(ids, mask, SLOTS)
    session.forward(block)
    session.keep_recent(4, kept)
    got = _states(session)
    logits = session.forward(nxt).logits[:, -1]
    for b, k in enumerate(kept):
        ref, _ = runner.prefill(ids, mask, SLOTS)
        if k:
            ref.forward(block[:, :k])
        _assert_row(got, _states(ref), b)
        # attention over the row's holes vs none: float rounding only (logits here are tens in size)
        torch.testing.assert_close(logits[b], ref.forward(nxt).logits[b, -1], rtol=1e-4, atol=1e-4)
    assert not session.recurrent.passes[:-1]  # the history restarted at the commit


# a tree over three forwards, as a model drafter grows one: slot -> parent (-1: the root's, the cache before it)
TREE_PARENTS = [-1, 0, 0, 1, 2, 3]
TREE_FORWARDS = [(0, 3), (3, 5), (5, 6)]  # slots [start, end) of each forward; the last is a single node
TREE_PATHS = [[0, 1, 3, 5], [0, 2, 4], [0, 2], []]  # what each row keeps


def _tree_path(slot: int) -> list[int]:
    return [] if slot < 0 else _tree_path(TREE_PARENTS[slot]) + [slot]


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_nodes_and_kept_paths_equal_a_fresh_run(arch, monkeypatch):
    """Tree nodes written over three forwards (one of a single node), each computed from its parent's state: every
    node's state is a fresh run's over its path, and the path a row keeps leaves that state and the next logits."""
    runner = CausalLMRunner(_model(arch))
    monkeypatch.setattr(RecurrentHistory, "_replay", _no_replay)
    ids, mask = left_padded(LENGTHS, seed=11)
    tokens = torch.randint(3, VOCAB, (4, len(TREE_PARENTS)), generator=torch.Generator().manual_seed(12))
    nxt = torch.randint(3, VOCAB, (4, 1), generator=torch.Generator().manual_seed(13))
    paths = [_tree_path(j) for j in range(len(TREE_PARENTS))]
    session, _ = runner.prefill(ids, mask, SLOTS)
    before = session.counts.clone()
    for start, end in TREE_FORWARDS:
        visible = torch.tensor([[i in paths[j] for i in range(end)] for j in range(start, end)]).expand(4, -1, -1)
        depth = torch.tensor([len(paths[j]) - 1 for j in range(start, end)])
        session.forward(tokens[:, start:end], position_ids=before.unsqueeze(1) + depth, tree_mask=visible)
    nodes = {}
    for p in session.recurrent.passes[-len(TREE_FORWARDS) :]:  # each node's states, from the forward that wrote it
        for j in range(p.width):
            nodes[len(nodes)] = {(i, kind, s): v for i, kept in p.at.items()
                                 for kind, states in zip(("conv_states", "recurrent_states"), kept.at(j, torch.arange(4)))
                                 for s, v in states.items()}
    for j, path in enumerate(paths):
        ref, _ = runner.prefill(ids, mask, SLOTS)
        ref.forward(tokens[:, path])
        _assert_row(nodes[j], _states(ref), 0)
    session.keep_slots(TREE_PATHS, len(TREE_PARENTS))
    got = _states(session)
    logits = session.forward(nxt).logits[:, -1]
    for b, path in enumerate(TREE_PATHS):
        ref, _ = runner.prefill(ids, mask, SLOTS)
        if path:
            ref.forward(tokens[:, path])
        _assert_row(got, _states(ref), b)
        torch.testing.assert_close(logits[b], ref.forward(nxt).logits[b, -1], rtol=1e-4, atol=1e-4)


def _no_replay(*args, **kwargs):
    raise AssertionError("a mixer was replayed: the pass kept no state per position")


def _three_drafter_steps(model, seed: int):
    """Three one-token forwards after a ragged prefill, as a model drafter takes them: the states after 0..3 steps
    of a reference session, and a second session that took the same steps (to be rolled back)."""
    runner = CausalLMRunner(model)
    ids, mask = left_padded(LENGTHS, seed=seed)
    steps = torch.randint(3, VOCAB, (4, 3), generator=torch.Generator().manual_seed(seed + 1))
    ref, _ = runner.prefill(ids, mask, SLOTS)
    after = [_states(ref)]
    for j in range(3):
        ref.forward(steps[:, j : j + 1])
        after.append(_states(ref))
    session, _ = runner.prefill(ids, mask, SLOTS)
    for j in range(3):
        session.forward(steps[:, j : j + 1])
    return after, session


@pytest.mark.parametrize("arch", ["qwen3_next", "nemotron_h", "falcon_h1", "lfm2"])
def test_drafter_steps_roll_back_to_their_checkpoints_exactly(arch):
    """A model drafter's one-token forwards land on checkpoints: rollback restores, bit for bit."""
    after, session = _three_drafter_steps(_model(arch), seed=3)
    kept = [2, 0, 3, 1]
    session.keep_recent(3, kept)
    got = _states(session)
    for b, k in enumerate(kept):
        _assert_row(got, after[k], b, exact=True)


@pytest.mark.parametrize("arch", ["qwen3_next", "nemotron_h"])
def test_catch_up_filler_leaves_the_state_of_the_real_tokens(arch):
    """A drafter's catch-up block is left-aligned with filler: the filler must not advance a row's state."""
    runner = CausalLMRunner(_model(arch))
    ids, mask = left_padded(LENGTHS, seed=5)
    block = torch.randint(3, VOCAB, (4, 3), generator=torch.Generator().manual_seed(6))
    real = [1, 3, 2, 1]
    valid = torch.arange(3).unsqueeze(0) >= (3 - torch.tensor(real)).unsqueeze(1)
    session, _ = runner.prefill(ids, mask, SLOTS)
    last = session.forward(block, valid).logits[:, -1]
    got = _states(session)
    for b, r in enumerate(real):
        ref, _ = runner.prefill(ids, mask, SLOTS)
        expected = ref.forward(block[:, 3 - r :]).logits[b, -1]
        _assert_row(got, _states(ref), b)
        torch.testing.assert_close(last[b], expected, rtol=1e-4, atol=1e-4)  # the drafter's next draft too


def test_retired_rows_leave_the_history_too():
    after, session = _three_drafter_steps(_model("qwen3_next"), seed=7)
    session.keep_rows([3, 1])
    session.keep_recent(3, [2, 0])
    got = _states(session)
    _assert_row(got, after[2], 0, ref_row=3, exact=True)
    _assert_row(got, after[0], 1, ref_row=1, exact=True)


def test_a_derived_drafter_adopts_the_verifier_states():
    model = _model("qwen3_next")
    verifier, drafter = CausalLMRunner(model), CausalLMRunner(perturbed_copy(model, 0.05), role="drafter")
    ids, mask = left_padded(LENGTHS, seed=9)
    session, _ = verifier.prefill(ids, mask, SLOTS)
    adopted = drafter.adopt(session, SLOTS)
    assert isinstance(adopted.cache.layers[0], RecurrentLayer)
    mine, theirs = _states(adopted), _states(session)
    for b in range(len(LENGTHS)):
        _assert_row(mine, theirs, b, exact=True)
    adopted.forward(torch.ones(4, 2, dtype=torch.long))  # a drafter's own steps write its own copy
    assert not torch.equal(_states(adopted)[(0, "recurrent_states", 0)], theirs[(0, "recurrent_states", 0)])
    assert torch.equal(_states(session)[(0, "recurrent_states", 0)], theirs[(0, "recurrent_states", 0)])


# ---- sampling: the law holds, and a broken rollback is caught -----------------------------------------------------


def _tiny_vocab_hybrid(seed: int) -> torch.nn.Module:
    config = tf.Qwen3NextConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_conv_kernel_dim=4,
                                linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                                linear_num_value_heads=4, num_experts=0, initializer_range=0.4,
                                layer_types=["linear_attention", "full_attention"], bos_token_id=None,
                                eos_token_id=None, pad_token_id=0)
    return make_hybrid("qwen3_next", seed, config=config)


PROMPT, SAMPLING = torch.tensor([[3, 1, 4]]), dict(temperature=1.0, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def tiny_law():
    """A tiny-vocabulary hybrid, a perturbed drafter of it, and its exact law over 3 new tokens (computed once)."""
    verifier = _tiny_vocab_hybrid(0)
    return verifier, perturbed_copy(verifier, 0.5), exact_joint(verifier, PROMPT, 3, **SAMPLING)


def _sampled_pvalue(tiny_law, tree: str | None = None) -> float:
    verifier, draft, exact = tiny_law
    spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=2, **({"tree": tree} if tree else {}))
    out = spec.generate(PROMPT.expand(2000, -1), max_new_tokens=3, do_sample=True,
                        generator=torch.Generator().manual_seed(42), **SAMPLING)
    assert spec.last_stats.proposed > spec.last_stats.accepted > 0  # rows rejected drafts: rollbacks ran
    return chi2(tally(out[:, 3:].tolist()), exact, out.shape[0])


@pytest.mark.parametrize("tree", [None, "static"])
def test_sampling_follows_the_verifier(tiny_law, tree):
    assert _sampled_pvalue(tiny_law, tree) > ALPHA


@pytest.mark.parametrize("tree", [None, "static"])
def test_sampling_check_catches_a_state_selected_one_token_late(tiny_law, monkeypatch, tree):
    """Negative control: rows that rejected a draft get the state after the next token of the forward (a tree's
    last node: the one before) instead of their last kept one's."""
    at = PerPosition.at
    late = lambda self, slot, index: at(self, slot + 1 if slot + 1 < len(self.recurrent[0]) else slot - 1, index)
    monkeypatch.setattr(PerPosition, "at", late)
    assert _sampled_pvalue(tiny_law, tree) < ALPHA


def test_sampling_check_catches_a_stale_recurrent_state(tiny_law, monkeypatch):
    """Negative control: with the recurrent rollback disabled (states keep the rejected drafts), the same check fails."""
    monkeypatch.setattr(RecurrentHistory, "keep_recent", lambda self, n, kept, rows=None: self.passes.clear())
    assert _sampled_pvalue(tiny_law) < ALPHA


# ---- refusals -----------------------------------------------------------------------------------------------------


# dynamo's eager backend over the static passes (padded as for CUDA graphs), and raw graphs' stand-in with every pass
# traced as one graph (capture.PROVE: no graph break, no guard that changes between passes)
COMPILED = {"dynamo": {"backend": "eager"}, "graphs": "graphs"}
COMPILED_FAST = {("qwen3_next", "dynamo"), ("nemotron_h", "graphs"), ("mamba", "graphs")}  # Gated DeltaNet, Mamba-2, -1


@pytest.mark.parametrize("arch,how", [pytest.param(a, h, marks=() if (a, h) in COMPILED_FAST else pytest.mark.slow)
                                      for a in ARCHS for h in COMPILED])
def test_compiled_verifier_matches_generate(arch, how, monkeypatch):
    """Static passes over recurrent layers: states in place, each state per position in fixed buffers, the commit
    selecting from them (filler past a pass's tokens included), at batch 1 and ragged with retirements."""
    monkeypatch.setattr(capture, "PROVE", True)
    model, drafts = _model(arch), perturbed_copy(_model(arch), 0.05)
    for draft in ("prompt-lookup", drafts):
        spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=3, compile_verifier=COMPILED[how])
        spec.verifier.static.pads = True  # a chain's passes padded to one width, as CUDA graphs take them
        ids = _prompt(7, seed=2)
        kwargs = dict(max_new_tokens=14, do_sample=False, eos_token_id=None)
        assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs)), f"{arch} batch 1"
        ids, mask = left_padded([5, 9, 3], seed=3)
        eos = int(model.generate(ids[:1, -5:], max_new_tokens=6, do_sample=False, eos_token_id=None)[0, -2])
        kwargs = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0)
        assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs)), f"{arch} ragged"
        assert spec.verifier.static.failed is None and spec.verifier.static.passes > 0


def test_trees_under_a_compiled_verifier_are_refused_in_one_line():
    with pytest.raises(UnsupportedModelError, match="recurrent layers.*compile_verifier") as err:
        specdec.SpeculativeModel(_model("lfm2"), "prompt-lookup", compile_verifier=True, tree="static")
    assert "\n" not in str(err.value)


def test_a_compiled_hybrid_drafter_runs_eagerly_with_a_warning():
    runner = CausalLMRunner(_model("lfm2"), role="drafter")
    with pytest.warns(UserWarning, match="recurrent layers"):
        runner.compile()
    assert runner._compiled is None


def test_a_model_whose_mamba1_scan_cannot_be_routed_is_refused(monkeypatch):
    """Where transformers' Mamba-1 scan (no initial state) cannot be replaced by specdec's, a verify pass would
    restart from zero: refused in one line."""
    monkeypatch.setattr(scans, "install", lambda mixer: set())
    with pytest.raises(UnsupportedModelError, match="zero state") as err:
        specdec.SpeculativeModel(_model("mamba", seed=1), "prompt-lookup")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["qwen3_next", "mamba"])
def test_a_transformers_without_per_layer_cache_classes_refuses_hybrids_naming_the_version(arch, monkeypatch):
    """transformers 5.17-5.22 (the GPU machine had 5.17) declare no DummyLayer nor per-layer kwargs: hybrids are
    refused in one line that names the release they need, not with a layer-type riddle."""
    from specdec.runners import recurrent_layout

    model = _model(arch)
    for name, value in (("HYBRIDS_SUPPORTED", False), ("get_layer_types_and_kwargs", None),
                        ("DYNAMIC_LAYER_TYPE_MAPPING", {})):
        monkeypatch.setattr(recurrent_layout, name, value)
    with pytest.raises(UnsupportedModelError, match=r"transformers >= 5\.23 \(installed: ") as err:
        specdec.SpeculativeModel(model, "prompt-lookup")
    assert "\n" not in str(err.value)

# ---- memory: the planner counts the state ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_state_size_matches_what_the_layers_hold(arch):
    from specdec.sizing.state import state_bytes_per_row

    model = _model(arch)
    session, _ = CausalLMRunner(model).prefill(torch.ones(3, 4, dtype=torch.long), None, 16)
    held = sum(s.numel() * s.element_size() for layer in session.recurrent.layers.values()
               for states in (layer.conv_states, layer.recurrent_states) for s in states.values() if s is not None)
    assert held == 3 * state_bytes_per_row(model.config, "float32", checkpoints=0, tokens=0) > 0


def test_plan_counts_the_state_and_its_checkpoints():
    from specdec.sizing import plan
    from specdec.sizing.state import state_bytes_per_row

    config = CONFIGS["qwen3_next"]()
    got = plan(config, context=64, batch=2, draft_len=3, dtype="float32")
    kv_only = got.cache_len * got.kv_bytes_per_token * 2
    assert got.verifier_cache_bytes - kv_only == 2 * state_bytes_per_row(config, "float32", checkpoints=1, tokens=4)
    assert state_bytes_per_row(tf.Qwen3Config(**COMMON), "float32") == 0  # attention-only: nothing added
