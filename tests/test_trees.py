"""Tree drafts: greedy identity for every tree-capable drafter on every architecture, exact multi-draft
sampling (with a negative control), ``auto`` sizing that follows the measured cost, and clear errors."""

import pytest
import torch
from transformers import LogitsProcessorList

import specdec
from specdec.drafters import CompositeDrafter, ModelDrafter, PromptLookupDrafter
from specdec.drafters.base import DraftContext, Drafter, DraftChain, Rows
from specdec.drafters.eagle import EagleDrafter
from specdec.trees import parse_tree
from specdec.trees import accept as tree_accept
from specdec.trees.build import TreeShape
from specdec.trees.auto import TreeSizer, VerifyCost, measure_verify_cost
from specdec.trees.tree import DraftTree, RowTree, pack
from specdec.runners import CausalLMRunner, UnsupportedModelError
from test_eagle import _batch, _random_head
from test_sampling import ALPHA, _chi2, _exact_joint, _tiny_vocab_model
from tiny_models import CONFIGS, make_model, perturbed_copy

ARCHS = sorted(CONFIGS)  # mistral's sliding window (16) cuts: prompts plus output pass it (test_sliding_window.py: more)
TREES = ["static", "dynamic", {"mode": "dynamic", "top_k": 3, "depth": 6, "total_tokens": 9}]
FLAT = VerifyCost((1, 64), (0.010, 0.011))  # a GPU-like verifier: 64 tokens cost what 1 does
STEEP = VerifyCost((1, 64), (0.010, 0.330))  # a CPU-like one: each token adds half a pass


def _identical(model, draft, batch, tree, new=24, **options):
    ids, mask = _batch(rows=batch)
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tree=tree, **options)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0,
                        generator=torch.Generator(device="cpu").manual_seed(0))
    assert torch.equal(out, ref)
    return spec.last_stats


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("tree", ["static", "dynamic"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_identity_every_architecture(arch, tree, batch):
    model = make_model(arch)
    stats = _identical(model, perturbed_copy(model, 0.05), batch, tree)
    assert stats.accepted > 0 and stats.tree["mode"] == tree
    assert stats.mean_tree_tokens > 4  # more than a chain of 4 was scored per pass
    _identical(model, EagleDrafter(_random_head(model, "eagle3"), model), batch, tree)


@pytest.mark.parametrize("tree", TREES + ["auto"], ids=["static", "dynamic", "dict", "auto"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("drafter", ["eagle", "lookup", "composite", "layer-skip"])
def test_greedy_identity_every_drafter_kind(tree, batch, drafter):
    model = make_model("llama")
    draft = {"eagle": lambda: EagleDrafter(_random_head(model, "eagle"), model),
             "lookup": lambda: PromptLookupDrafter(),
             "composite": lambda: CompositeDrafter(ModelDrafter(perturbed_copy(model, 0.05))),
             "layer-skip": lambda: "layer-skip:1"}[drafter]()
    _identical(model, draft, batch, tree, tree_cost=STEEP)


def test_trees_accept_more_than_chains_from_the_same_drafter():
    model = make_model("gpt2")
    draft = perturbed_copy(model, 0.2)
    chain = _identical(model, draft, 3, None, new=40)
    tree = _identical(model, draft, 3, {"mode": "dynamic", "top_k": 4, "depth": 4, "total_tokens": 24}, new=40)
    assert tree.mean_accepted_length > chain.mean_accepted_length
    assert len(tree.acceptance_by_position) >= 2  # accepted at depth 2 and beyond
    assert tree.mean_tree_tokens > chain.mean_tree_tokens  # scored more drafts per pass than the chain's 3


def test_model_drafter_cache_after_a_tree_equals_a_fresh_prefill():
    """After each commit, the model drafter's cache holds exactly the committed prefix: its next logits
    equal a fresh forward over the row."""
    model = make_model("llama")
    draft = perturbed_copy(model, 0.05)

    class Checked(ModelDrafter):
        checks = 0

        def propose_tree(self, rows, shape, ctx):
            tree = super().propose_tree(rows, shape, ctx)
            return tree

        def _catch_up(self, rows):
            logits = super()._catch_up(rows)
            for b, row in enumerate(rows):
                real = row[rows.pads[b]:].unsqueeze(0)
                ref = self.model(real).logits[0, -1]
                torch.testing.assert_close(logits[b], ref, rtol=1e-4, atol=1e-4)
                Checked.checks += 1
            return logits

    _identical(model, Checked(draft), 3, "dynamic")
    assert Checked.checks > 10


def test_mask_ignoring_models_are_refused():
    llama = make_model("llama")
    llama.config._attn_implementation = "flash_attention_2"
    with pytest.raises(UnsupportedModelError, match="ignores custom 4-D masks"):
        specdec.SpeculativeModel(llama, perturbed_copy(make_model("llama"), 0.05), tree="static")


def test_bad_tree_options_get_clear_errors():
    with pytest.raises(ValueError, match="tree must be one of none.static.dynamic.auto"):
        parse_tree("bushy")
    with pytest.raises(ValueError, match=r"no parent path \[0\]"):
        parse_tree([[1], [0, 0]])
    with pytest.raises(ValueError, match="ranks >= 0"):
        parse_tree([[0], [-1]])
    with pytest.raises(ValueError, match="lists a path twice"):
        parse_tree([[0], [0]])
    with pytest.raises(ValueError, match="unknown tree options"):
        parse_tree({"mode": "dynamic", "width": 3})
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        parse_tree({"mode": "dynamic", "top_k": 0})
    assert parse_tree("none") is None and parse_tree(None) is None
    assert parse_tree([[0], [0, 0]]).max_nodes == 2
    model = make_model("llama")

    class ChainOnly(Drafter):
        def propose(self, rows, k, ctx):
            return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device))

    with pytest.raises(ValueError, match="ChainOnly cannot draft trees"):
        specdec.SpeculativeModel(model, ChainOnly(), tree="static")
    with pytest.raises(ValueError, match="adaptive draft lengths are for chains"):
        specdec.SpeculativeModel(model, PromptLookupDrafter(), tree="dynamic", adaptive=True)


def test_draft_tree_structure_and_trie():
    row = RowTree()
    a = row.add_path([5, 6, 7], [0.9, 0.5, 0.2])
    b = row.add_path([5, 8], [0.9, 0.3])
    assert a[0] == b[0] and len(row) == 4  # the shared first token merged
    best = row.best(3)
    assert best.tokens == [5, 6, 8] and best.parents == [-1, 0, 0]
    tree = pack([row, RowTree()], torch.device("cpu"))
    assert tree.valid.tolist() == [[True] * 4, [False] * 4]
    depth, mask, valid = tree.verify_inputs(torch.device("cpu"))
    assert depth[0].tolist() == [0, 1, 2, 3, 2]
    assert mask[0, 4].tolist() == [True, True, False, False, True]  # node 8 sees root, 5 and itself
    with pytest.raises(ValueError, match="earlier node"):
        DraftTree(torch.zeros(1, 2, dtype=torch.long), None, parents=torch.tensor([[1, -1]]))


def test_greedy_tree_walk_picks_the_matching_sibling():
    row = RowTree()
    row.add_path([4, 9])
    row.add_path([7, 3, 2])
    tree = pack([row], torch.device("cpu"))  # nodes: 4, 9, 7, 3, 2
    scores = torch.zeros(1, 6, 12)
    for position, token in [(0, 7), (3, 3), (4, 2), (5, 11)]:  # root -> 7 -> 3 -> 2, then bonus 11
        scores[0, position, token] = 1.0
    accepted, tokens, path = tree_accept.greedy_tree_accept(tree, scores)
    assert accepted.tolist() == [3] and path.tolist() == [[2, 3, 4]] and tokens.tolist() == [[7, 3, 2, 11]]


def _first_token_counts(tree: DraftTree, p: torch.Tensor, trials: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    tokens = tree.tokens.expand(trials, -1)
    if tree.probs is not None:  # i.i.d. siblings: drawn afresh for every trial
        tokens = torch.multinomial(tree.probs[0, 0], trials * tokens.shape[1], replacement=True, generator=gen)
        tokens = tokens.view(trials, -1)
    batch = DraftTree(tokens, None if tree.probs is None else tree.probs.expand(trials, -1, -1),
                      parents=tree.parents.expand(trials, -1))
    _, tokens, _ = tree_accept.tree_rejection_accept(batch, p.expand(trials, -1, -1), gen)
    values, counts = torch.unique(tokens[:, 0], return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


@pytest.mark.parametrize("drawn", ["deterministic", "iid"])
def test_multi_draft_rejection_sampling_is_exact_and_the_test_has_power(drawn, monkeypatch):
    """Three siblings under the root: the committed first token follows p, whether the siblings are
    top-ranked (deterministic) or drawn i.i.d. from q; without the residual update it does not."""
    vocab, trials = 6, 6000
    p = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.07, 0.03])
    q = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
    if drawn == "deterministic":
        tokens, probs = torch.tensor([[0, 1, 2]]), None
    else:
        tokens, probs = torch.zeros(1, 3, dtype=torch.long), q.expand(1, 3, vocab)  # drawn per trial
    tree = DraftTree(tokens, probs, parents=torch.tensor([[-1, -1, -1]]))
    target = torch.cat([p.unsqueeze(0), torch.full((3, vocab), 1 / vocab)]).unsqueeze(0)  # [1, 4, V]
    expected = dict(enumerate(p.tolist()))
    counts = _first_token_counts(tree, target, trials, seed=2)
    assert _chi2(counts, expected, trials) > ALPHA
    monkeypatch.setattr(tree_accept, "residual", lambda p, q, token: p)  # negative control: no residual
    counts = _first_token_counts(tree, target, trials, seed=2)
    assert _chi2(counts, expected, trials) < ALPHA, "the test must catch a rule that skips the residual"


@pytest.mark.parametrize("tree", ["static", "dynamic", "auto"])
def test_tree_sampling_follows_the_verifier_end_to_end(tree, monkeypatch):
    """``auto`` too: its trees change shape with what it learns (edge calibration, frontier pruning) from pass to
    pass, which must not bias the samples (its tree arm here; sampled chains: the mixing test below)."""
    verifier = _tiny_vocab_model(0)
    prompt = torch.tensor([[3, 1, 4]])
    sampling = dict(temperature=0.8, top_k=0, top_p=1.0)
    exact = _exact_joint(verifier, prompt, 3, **sampling)
    config = {"mode": "dynamic", "top_k": 3, "depth": 2, "total_tokens": 6} if tree == "dynamic" else \
        "auto" if tree == "auto" else [[0], [1], [2], [0, 0], [1, 0]]
    auto = dict(tree_cost=FLAT, tree_draft_step=0.001) if tree == "auto" else {}
    spec = specdec.SpeculativeModel(verifier, perturbed_copy(verifier, 0.3), tree=config, **auto)
    _force_arms(monkeypatch, ["tree"])

    def sample(rounds: int = 2):
        gen, counts = torch.Generator().manual_seed(42), {}
        for _ in range(rounds):
            out = spec.generate(prompt.expand(1500, -1), max_new_tokens=3, do_sample=True, generator=gen, **sampling)
            for r in out[:, 3:].tolist():
                counts[tuple(r)] = counts.get(tuple(r), 0) + 1
        return counts

    counts = sample()
    assert spec.last_stats.accepted > 0 and spec.last_stats.mean_tree_tokens > 1.5  # trees, not chains of one
    assert _chi2(counts, exact, sum(counts.values())) > ALPHA
    if tree == "static":
        return  # one negative control end to end
    monkeypatch.setattr(tree_accept, "residual", lambda p, q, token: p)
    # twice the samples: 3,000 leave the control's power borderline for the dynamic tree (its p-value ranged 1e-4 to
    # 1e-2 over generator seeds, before and after the walk moved to the device and drew its uniforms in another order)
    counts = sample(rounds=4)
    assert _chi2(counts, exact, sum(counts.values())) < ALPHA, "the test must catch a rule that skips the residual"


def _force_arms(monkeypatch, arms: list[str], greedy_too: bool = False) -> None:
    """``auto``'s chain-or-tree choice made to follow ``arms`` in turn (per call's sizer, from the first pass)."""
    from specdec.trees import arms as arms_module
    from specdec.trees.plan import TreePlan

    def pick(self):
        turn = getattr(self, "_turn", 0)
        self._turn = turn + 1
        return arms[turn % len(arms)]

    monkeypatch.setattr(arms_module.ChainOrTree, "pick", pick)
    if greedy_too:
        monkeypatch.setattr(TreePlan, "_weighs_arms", lambda self, ctx: self.sizer is not None)


NEW = 5


def test_composite_tree_sampling_follows_the_verifier_where_the_lookup_drafts(monkeypatch):
    """A composite tree pass where a row's text repeats is the lookup's own tree (deterministic nodes, the model
    drafter rests); elsewhere the model's tree with the lookup's branch merged in. Over five sampled tokens after a
    repeating prompt, both kinds of pass occur and the joint law is the verifier's; skipping the residual is caught."""
    verifier = _tiny_vocab_model(0)
    prompt = torch.tensor([[3, 1, 4, 3, 1]])
    sampling = dict(temperature=0.8, top_k=0, top_p=1.0)
    exact = _exact_joint(verifier, prompt, NEW, **sampling)
    config = {"mode": "dynamic", "top_k": 2, "depth": 2, "total_tokens": 4}
    spec = specdec.SpeculativeModel(verifier, CompositeDrafter(ModelDrafter(perturbed_copy(verifier, 0.3))), tree=config)

    def sample():
        gen, counts, steps = torch.Generator().manual_seed(5), {}, {"lookup_steps": 0, "model_steps": 0}
        for _ in range(4):
            out = spec.generate(prompt.expand(1500, -1), max_new_tokens=NEW, do_sample=True, generator=gen, **sampling)
            for r in out[:, prompt.shape[1]:].tolist():
                counts[tuple(r)] = counts.get(tuple(r), 0) + 1
            for key in steps:
                steps[key] += spec.last_stats.drafter_stats[key]
        return counts, steps

    counts, steps = sample()
    assert steps["lookup_steps"] >= 1 and steps["model_steps"] >= 1, steps
    assert _chi2(counts, exact, sum(counts.values())) > ALPHA
    monkeypatch.setattr(tree_accept, "residual", lambda p, q, token: p)
    counts, _ = sample()
    assert _chi2(counts, exact, sum(counts.values())) < ALPHA, "the test must catch a rule that skips the residual"




def test_auto_sampling_mixing_sampled_chains_and_trees_follows_the_verifier(monkeypatch):
    """Under sampling ``auto`` drafts a sampled chain or a tree per pass (:mod:`specdec.trees.arms`): passes of both,
    in turn, over five new tokens follow the verifier's joint law; a chain rule that
    takes the drafter's ``q`` for the verifier's ``p`` (accepts every draft) is caught."""
    from specdec import verification

    verifier = _tiny_vocab_model(0)
    prompt = torch.tensor([[3, 1, 4]])
    sampling = dict(temperature=0.8, top_k=0, top_p=1.0)
    exact = _exact_joint(verifier, prompt, NEW, **sampling)
    spec = specdec.SpeculativeModel(verifier, perturbed_copy(verifier, 0.3), tree="auto", tree_cost=STEEP,
                                    tree_draft_step=0.001)
    _force_arms(monkeypatch, ["chain", "tree"])

    def sample():
        gen, counts = torch.Generator().manual_seed(7), {}
        for _ in range(4):
            out = spec.generate(prompt.expand(1500, -1), max_new_tokens=NEW, do_sample=True, generator=gen, **sampling)
            for r in out[:, 3:].tolist():
                counts[tuple(r)] = counts.get(tuple(r), 0) + 1
        return counts

    counts = sample()
    arms = spec.last_stats.tree["chain_or_tree"]["passes"]
    assert arms["chain"] >= 1 and arms["tree"] >= 1, arms
    assert _chi2(counts, exact, sum(counts.values())) > ALPHA
    real = verification.CHAIN_RULES["token"]

    def drafters_law(drafts, q, p, gen):  # the verifier's p replaced by q at the drafted positions
        return real(drafts, q, torch.cat([q, p[:, q.shape[1]:]], dim=1), gen)

    monkeypatch.setitem(verification.CHAIN_RULES, "token", drafters_law)
    counts = sample()
    assert _chi2(counts, exact, sum(counts.values())) < ALPHA, "the test must catch a chain rule without the ratio"


@pytest.mark.parametrize("drafter", ["model", "eagle", "lookup", "composite", "layer-skip"])
def test_greedy_identity_when_auto_mixes_chains_and_trees(drafter, monkeypatch):
    """Chain passes between tree passes (what ``auto`` does under sampling, forced here under greedy decoding so that
    the output must equal ``generate``'s): every drafter's caches stay right across the switch, at batch 1 and 3."""
    model = make_model("llama")
    _force_arms(monkeypatch, ["tree", "chain", "chain", "tree"], greedy_too=True)
    for batch in (1, 3):
        draft = {"model": lambda: perturbed_copy(model, 0.05),
                 "eagle": lambda: EagleDrafter(_random_head(model, "eagle3"), model),
                 "lookup": lambda: PromptLookupDrafter(),
                 "composite": lambda: CompositeDrafter(ModelDrafter(perturbed_copy(model, 0.05))),
                 "layer-skip": lambda: "layer-skip:1"}[drafter]()
        stats = _identical(model, draft, batch, "auto", new=32, tree_cost=FLAT, tree_draft_step=0.001)
        arms = stats.tree["chain_or_tree"]["passes"]
        assert arms["chain"] >= 2 and arms["tree"] >= 2, arms


def test_chain_or_tree_takes_the_better_arm_and_explores_the_other():
    from specdec.trees.arms import EXPLORE, ChainOrTree

    arms = ChainOrTree()
    assert [arms.pick(), arms.pick()] == ["chain", "chain"]  # the chain first, until it has a pass
    arms.observe("chain", 5, [5, 4], 0.10)  # 5.5 tokens in 0.1 s
    assert [arms.pick() for _ in range(EXPLORE + 1)] == ["chain"] * EXPLORE + ["tree"]  # the tree: at the first turn
    arms.observe("tree", 0, [2, 3], 0.10)  # 3.5 tokens in 0.1 s
    assert arms.acceptance == pytest.approx(0.8 * 0.7 + 0.2 * 9 / 10)  # 9 accepted in 10 trials (one rejection)
    picks = [arms.pick() for _ in range(EXPLORE + 1)]
    assert picks == ["chain"] * EXPLORE + ["tree"]
    for _ in range(20):  # the tree becomes the better arm
        arms.observe("tree", 0, [8, 8], 0.10)
    assert arms.pick() == "tree"
    assert arms.to_dict()["passes"] == {"chain": 1, "tree": 21}
    sure, unsure = ChainOrTree(), ChainOrTree()
    sure.acceptance, unsure.acceptance = 0.95, 0.2
    assert sure.chain_length(8, STEEP, 0.001) > unsure.chain_length(8, STEEP, 0.001) == 1
    assert sure.chain_length(8, FLAT, 0.001) == 8


def test_auto_follows_the_measured_cost():
    """With the same drafter, a flat cost curve (GPU-like) gets bigger trees than a steep one (CPU-like)."""
    model = make_model("gpt2")
    draft = perturbed_copy(model, 0.2)
    flat = _identical(model, draft, 1, "auto", new=40, tree_cost=FLAT)
    steep = _identical(model, draft, 1, "auto", new=40, tree_cost=STEEP)
    assert flat.mean_tree_tokens > 2 * steep.mean_tree_tokens
    assert flat.tree["mode"] == "auto" and flat.tree["verify_cost"]["sizes"] == [1, 64]


def test_sizer_rules():
    values = [0.9, 0.8, 0.5, 0.3, 0.1, 0.05, 0.01]
    assert TreeSizer(FLAT, draft_step=0.001).select(values, 1) == len(values)
    assert TreeSizer(STEEP, draft_step=0.001).select(values, 1) <= 2
    assert TreeSizer(STEEP, draft_step=0.001).select([0.02, 0.01], 1) == 1  # never none: it must keep learning
    sizer = TreeSizer(STEEP, draft_step=0.001)
    assert sizer.worth_expanding([0.9], [0.9], 1) and not TreeSizer(STEEP, draft_step=1.0).worth_expanding([0.9], [0.01], 1)
    assert FLAT(32) == pytest.approx(0.010 + 31 / 63 * 0.001) and STEEP(128) > STEEP(64)
    with pytest.raises(ValueError, match="ascending"):
        VerifyCost((4, 2), (0.1, 0.2))


def _chain_and_sibling(depth: int, p: float, sibling: float) -> DraftTree:
    """A chain of ``depth`` nodes, each its parent's top child at probability ``p``, and the root's second child."""
    values = [p ** (d + 1) for d in range(depth)] + [sibling]
    return DraftTree(torch.arange(depth + 1)[None], None, parents=torch.tensor([[-1, *range(depth - 1), -1]]),
                     values=torch.tensor([values]))


def test_edge_calibration_learns_what_greedy_accepts_by_rank():
    """A drafter whose top child is always accepted at p 0.4 and whose second never is: one factor for every
    node (the model before) values depth d at ~0.4^d; the edge calibration learns top children ~1, others ~0."""
    from specdec.trees.auto import edges

    tree = _chain_and_sibling(5, 0.4, 0.3)
    parents, values = tree.parents[0].tolist(), tree.values[0].tolist()
    assert edges(parents, values) == ([0, 0, 0, 0, 0, 1], pytest.approx([0.4] * 5 + [0.3]))
    fresh, sizer = TreeSizer(STEEP, draft_step=0.001), TreeSizer(STEEP, draft_step=0.001)
    assert fresh.weights(parents, values) == pytest.approx(values)  # no evidence: the drafter's own estimate
    for _ in range(30):
        sizer.update(tree, torch.tensor([[0, 1, 2, 3, 4]]))
    learnt = sizer.weights(parents, values)
    assert min(learnt[:5]) > 0.9 and learnt[5] < 0.05
    assert all(a >= b for a, b in zip(learnt, learnt[1:5]))  # never more than the parent: ancestor-closed
    assert sizer.calibration == pytest.approx(1.0, abs=0.1)  # accepted drafts over the weights predicted
    cost = VerifyCost((1, 64), (0.010, 0.100))
    assert TreeSizer(cost, draft_step=0.001).select(sorted(values, reverse=True), 5) <= 3  # the sibling among them
    tuned = TreeSizer(cost, draft_step=0.001)
    tuned.edges = sizer.edges
    assert tuned.select(sorted(learnt, reverse=True), 5) == 5  # the chain, not its sibling
    before = float(sizer.edges.predicted.sum())
    sizer.update(tree, torch.tensor([[-1, -1, -1, -1, -1]]))  # nothing accepted: only the root's children are edges
    assert float(sizer.edges.predicted.sum()) == pytest.approx(0.95 * before + 0.4 + 0.3)


def test_auto_grows_deep_trees_for_a_drafter_that_is_always_right():
    """The verifier drafting for itself (top probabilities ~0.3 on the tiny models): ``auto`` learns that its top
    children are accepted and drafts several tokens a pass where a steep cost curve kept the old sizer at ~1."""
    model = make_model("gpt2")
    cost = VerifyCost((1, 64), (0.010, 0.100))
    stats = _identical(model, perturbed_copy(model, 0.0), 1, "auto", new=48, tree_cost=cost, tree_draft_step=0.001)
    assert stats.mean_accepted_length > 3, stats.to_dict()
    factor = stats.tree["edge_calibration"]["factor"]
    assert max(factor[0]) > 2 and max(factor[0]) > 3 * max(factor[1])


def test_measure_verify_cost_times_every_size():
    cost = measure_verify_cost(CausalLMRunner(make_model("llama")), sizes=(1, 4, 16), context=8, repeats=1)
    assert cost.sizes == (1, 4, 16) and all(s > 0 for s in cost.seconds) and cost.device == "cpu"


def test_measure_verify_cost_repeats_short_passes_and_keeps_the_monotone_envelope(monkeypatch):
    """A launch-bound GPU pass is short and jittery: sizes are timed until ``min_seconds`` add up, and a pass is
    never costed above a longer one (the first H100 check measured 16 tokens cheaper than 1)."""
    import types

    import specdec.trees.auto as sizing

    clock = [0.0]
    cost = {1: 0.016, 4: 0.018, 16: 0.013, 32: 0.022}  # 16 dips below 1 and 4
    calls: dict[int, int] = {}

    class Session:
        def forward(self, tokens, **_):
            n = tokens.shape[1]
            calls[n] = calls.get(n, 0) + 1
            clock[0] += cost[n] * (3.0 if calls[n] == 1 else 1.0)  # a slow warm-up pass, not counted

        def rollback(self, _):
            pass

        def release(self):
            pass

    runner = types.SimpleNamespace(model=make_model("llama"), prefill=lambda *a, **k: (Session(), None))
    monkeypatch.setattr(sizing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    got = measure_verify_cost(runner, sizes=(1, 4, 16, 32), context=8, repeats=3, min_seconds=0.1, max_repeats=25)
    assert got.seconds == pytest.approx((0.013, 0.013, 0.013, 0.022))
    assert calls == {1: 8, 4: 7, 16: 9, 32: 6}  # warm-up + enough repeats for 0.1 s (at least 3)
    capped = measure_verify_cost(runner, sizes=(1,), context=8, repeats=3, min_seconds=10.0, max_repeats=5)
    assert capped.seconds == pytest.approx((0.016,)) and calls[1] == 8 + 6


def test_static_tree_has_the_requested_shape():
    model = make_model("llama")
    drafter = EagleDrafter(_random_head(model, "eagle3"), model).for_call()
    ids, mask = _batch(rows=2)
    out = model(ids, attention_mask=mask, output_hidden_states=True)
    drafter.start(ids, mask, 64, hidden=torch.cat([out.hidden_states[i] for i in drafter.hidden_layers], dim=-1))
    rows = Rows(torch.cat([ids, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1), torch.tensor([10, 10]))
    choices = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    ctx = DraftContext(LogitsProcessorList(), False, None, model.config.vocab_size)
    hidden = torch.cat([out.hidden_states[i] for i in drafter.hidden_layers], dim=-1)
    tree = drafter.propose_tree(rows, TreeShape(parse_tree(choices), room=10), ctx)
    assert tree.parents.tolist() == [[-1, -1, 0, 0, 2]] * 2
    assert all(tree.tokens[b, 0] != tree.tokens[b, 1] and tree.tokens[b, 2] != tree.tokens[b, 3] for b in range(2))
    assert drafter.forwards == 1 + 2  # the pending features, then one pass per depth below the root's children
    drafter.start(ids, mask, 64, hidden=hidden)
    shallow = drafter.propose_tree(rows, TreeShape(parse_tree(choices), room=2), ctx)
    assert shallow.tokens.shape[1] == 4  # the room left in the call caps the depth


def test_tree_scores_logits_and_streamer_match_generate():
    """At batch 1 a tree call returns generate's scores and logits per committed token and streams the
    same tokens: the tree pass's rows are gathered along the accepted path."""
    from transformers.generation.streamers import BaseStreamer

    class Collect(BaseStreamer):
        def __init__(self):
            self.tokens = []

        def put(self, value):
            self.tokens += value.flatten().tolist()

        def end(self):
            pass

    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), tree="dynamic")
    ids = torch.tensor([[5, 9, 11, 4, 5, 9]])
    kwargs = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None,
                  return_dict_in_generate=True, output_scores=True, output_logits=True)
    stream = Collect()
    out = spec.generate(ids, streamer=stream, **kwargs)
    ref = model.generate(ids, **kwargs)
    assert torch.equal(out.sequences, ref.sequences) and stream.tokens == ref.sequences[0].tolist()
    assert out.spec_stats.accepted > 0 and len(out.scores) == len(ref.scores) == 20
    for mine, theirs in zip(out.logits, ref.logits):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
