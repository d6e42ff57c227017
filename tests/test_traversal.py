"""Traversal verification (``verify="traversal"``, :mod:`specdec.trees.traversal`): exact, and it keeps more of a
sampled tree than per-node rejection sampling.

The rule's law is checked on a context-dependent toy tree (two levels, siblings drawn without replacement, or
top-ranked), where the second committed token must follow the verifier given the first; then inside the loop for every
drafter kind that drafts trees, each with a negative control the same test rejects.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from law import ALPHA, chi2, sampled_law
from specdec.acceptance import block_accept
from specdec.trees import build
from specdec.trees.accept import tree_rejection_accept
from specdec.trees.traversal import traversal_accept
from specdec.trees.tree import DraftTree
from tiny_models import perturbed_copy

V, N = 5, 60_000
SHAPE = [-1, -1, 0, 0, 1]  # the root's children c0, c1; c0's children d0, d1; c1's child e0


def _dist(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.softmax(torch.randn(*shape, V, generator=g, device="cpu") * 1.5, dim=-1)


def _without_replacement(q: torch.Tensor, count: int, g: torch.Generator) -> tuple[list, list]:
    """``count`` draws without replacement per row of ``q [N, V]``: the tokens and the law each was drawn from."""
    tokens, laws = [], []
    for _ in range(count):
        law = q / q.sum(dim=-1, keepdim=True)
        tokens.append(torch.multinomial(law, 1, generator=g)[:, 0])
        laws.append(law)
        q = q.scatter(1, tokens[-1][:, None], 0.0)
    return tokens, laws


def _toy(sampled: bool, seed: int = 0):
    """N trees of shape :data:`SHAPE` and the verifier's distributions at their positions; P after the root, after
    a first token (``p1[a]``) and after two (``p2[a, b]``) are fixed per seed, as are the drafter's ``q``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    p0, q0, p1, q1, p2 = _dist(g), _dist(g), _dist(g, V), _dist(g, V), _dist(g, V, V)
    if sampled:
        (c0, c1), (l0, l1) = _without_replacement(q0.expand(N, V), 2, g)
        (d0, d1), (m0, m1) = _without_replacement(q1[c0], 2, g)
        (e0,), (n0,) = _without_replacement(q1[c1], 1, g)
        probs = torch.stack([l0, l1, m0, m1, n0], dim=1)
    else:  # top-ranked children
        top0, top1 = q0.topk(2).indices, q1.topk(2, dim=-1).indices
        c0, c1 = top0[0].expand(N), top0[1].expand(N)
        d0, d1, e0, probs = top1[c0, 0], top1[c0, 1], top1[c1, 0], None
    tree = DraftTree(torch.stack([c0, c1, d0, d1, e0], dim=1), probs, parents=torch.tensor([SHAPE]).expand(N, -1),
                     host_parents=[SHAPE] * N)
    target = torch.stack([p0.expand(N, V), p1[c0], p1[c1], p2[c0, d0], p2[c0, d1], p2[c1, e0]], dim=1)
    return tree, target, p0, p1


def _law_p_values(accepted: torch.Tensor, tokens: torch.Tensor, p0: torch.Tensor, p1: torch.Tensor) -> list[float]:
    first, second = tokens[:, 0], tokens[:, 1]
    out = [chi2({t: int((first == t).sum()) for t in range(V)}, dict(enumerate(p0.tolist())), N)]
    for a in range(V):  # given an accepted first token a, the next committed token must follow P(. | a)
        rows = (first == a) & (accepted >= 1)
        if int(rows.sum()) > 300:
            out.append(chi2({t: int((second[rows] == t).sum()) for t in range(V)}, dict(enumerate(p1[a].tolist())),
                            int(rows.sum())))
    return out


@pytest.mark.parametrize("sampled", [True, False], ids=["drawn-without-replacement", "top-ranked"])
def test_traversal_keeps_the_verifier_law_and_a_wrong_last_token_does_not(sampled):
    tree, target, p0, p1 = _toy(sampled)
    gen = torch.Generator(device="cpu").manual_seed(1)
    accepted, tokens, path = traversal_accept(tree, target, gen)
    assert min(_law_p_values(accepted, tokens, p0, p1)) > ALPHA
    # the path is the committed drafts: node tokens along it, -1 past the accepted count
    assert torch.equal((path >= 0).sum(dim=1), accepted)
    assert ((path < 0) | (tree.tokens.gather(1, path.clamp_min(0)) == tokens[:, : path.shape[1]])).all()
    # negative control: the same walks, the token after them drawn from the verifier's P there, not the residual
    end = torch.where(accepted > 0, path.gather(1, (accepted - 1).clamp_min(0).unsqueeze(1)).squeeze(1) + 1, 0)
    wrong = tokens.clone()
    rows = torch.arange(N)
    wrong[rows, accepted] = torch.multinomial(target[rows, end], 1, generator=torch.Generator().manual_seed(2))[:, 0]
    assert min(_law_p_values(accepted, wrong, p0, p1)) < ALPHA


def test_traversal_keeps_more_of_a_sampled_tree_and_as_much_of_a_top_ranked_one():
    means = {}
    for sampled in (True, False):
        tree, target, _, _ = _toy(sampled, seed=3)
        for name, rule in (("traversal", traversal_accept), ("token", tree_rejection_accept)):
            accepted, _, _ = rule(tree, target, torch.Generator(device="cpu").manual_seed(4))
            means[sampled, name] = accepted.float().mean().item()
    assert means[True, "traversal"] > means[True, "token"] * 1.03  # measured: 0.362 against 0.333 (seed 3: see below)
    assert abs(means[False, "traversal"] - means[False, "token"]) < 0.01  # one-hot laws: both keep sum P of the path


def test_traversal_on_a_chain_is_block_verification():
    """A tree that is a chain: traversal keeps what block verification keeps (in expectation; the paper's Theorem)."""
    g = torch.Generator(device="cpu").manual_seed(5)
    p1, q1, p2, q2, p3 = _dist(g), _dist(g), _dist(g, V), _dist(g, V), _dist(g, V, V)
    d1 = torch.multinomial(q1.expand(N, V), 1, generator=g)[:, 0]
    d2 = torch.multinomial(q2[d1], 1, generator=g)[:, 0]
    drafts, q = torch.stack([d1, d2], dim=1), torch.stack([q1.expand(N, V), q2[d1]], dim=1)
    p = torch.stack([p1.expand(N, V), p2[d1], p3[d1, d2]], dim=1)
    block, _ = block_accept(drafts, q, p, torch.Generator(device="cpu").manual_seed(6))
    chain = DraftTree(drafts, q, parents=torch.tensor([[-1, 0]]).expand(N, -1), host_parents=[[-1, 0]] * N)
    traversal, _, _ = traversal_accept(chain, p, torch.Generator(device="cpu").manual_seed(7))
    assert abs(block.float().mean() - traversal.float().mean()) < 0.015


def test_children_drawn_without_replacement_carry_their_laws():
    """Gumbel top-k draws without replacement: distinct children, each law ``q`` without the earlier ones."""
    logprobs = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.5, -1.0, -9.0]]), dim=-1)
    firsts = torch.zeros(5)
    for seed in range(4000):
        v, t, laws = build._children(logprobs, 3, True, torch.Generator(device="cpu").manual_seed(seed))
        assert len(set(t[0].tolist())) == 3 and torch.allclose(v, logprobs.gather(1, t))
        q = logprobs.exp()[0]
        assert torch.allclose(laws[0, 0], q)
        assert torch.allclose(laws[0, 1], q.scatter(0, t[0, :1], 0.0) / (1 - q[t[0, 0]]))
        firsts[t[0, 0]] += 1
    assert chi2(dict(enumerate(firsts.tolist())), dict(enumerate(logprobs.exp()[0].tolist())), 4000) > ALPHA
    v, t, laws = build._children(logprobs, 2, False, None)
    assert laws is None and t.tolist() == [[0, 1]]


# --------------------------------------------------------------------------------------------
# the rule inside the loop: every drafter kind that drafts trees, and wrong rules caught by the same test
# --------------------------------------------------------------------------------------------

TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]


def _verifier():
    from test_sampling import _tiny_vocab_model

    return _tiny_vocab_model(4)


def _sampled_law(verifier, draft, tree=TREE, rule: str = "traversal") -> tuple[float, specdec.SpeculativeModel]:
    p_value, spec = sampled_law(verifier, draft, tree=tree, verify=rule)
    assert spec.last_stats.verify == rule
    return p_value, spec


@pytest.mark.parametrize("kind", ["model", "self:int8", "prompt-lookup", "composite:int8", "eagle3"])
def test_traversal_keeps_the_verifier_law_for_every_tree_drafter(kind):
    verifier = _verifier()
    if kind == "eagle3":
        from test_eagle import _random_head
        from specdec.drafters.eagle import EagleDrafter

        draft = EagleDrafter(_random_head(verifier, "eagle3", seed=1, draft_vocab=6), verifier)
    else:
        draft = perturbed_copy(verifier, 0.5) if kind == "model" else kind
    p_value, spec = _sampled_law(verifier, draft)
    assert p_value > ALPHA and spec.last_stats.accepted > 0
    assert kind == "prompt-lookup" or spec.last_stats.mean_tree_tokens > 1.5  # trees, not chains of one


def test_traversal_on_dynamic_and_auto_trees_keeps_the_law():
    verifier = _verifier()
    for tree in ({"mode": "dynamic", "top_k": 3, "depth": 2, "total_tokens": 6}, "auto"):
        assert _sampled_law(verifier, perturbed_copy(verifier, 0.5), tree=tree)[0] > ALPHA


def test_a_wrong_traversal_rule_fails_the_same_law_test(monkeypatch):
    """Negative control: the token after the accepted path drawn from the verifier's P, not the residual left there."""
    from specdec import verification

    def wrong(tree, p, generator=None):
        accepted, tokens, path = traversal_accept(tree, p, generator)
        rows = torch.arange(p.shape[0])
        end = torch.where(accepted > 0, path.gather(1, (accepted - 1).clamp_min(0).unsqueeze(1)).squeeze(1) + 1, 0)
        tokens[rows, accepted] = torch.multinomial(p[rows, end], 1, generator=generator)[:, 0]
        return accepted, tokens, path

    monkeypatch.setitem(verification.TREE_RULES, "traversal", wrong)
    verifier = _verifier()
    assert _sampled_law(verifier, perturbed_copy(verifier, 0.5))[0] < ALPHA


@pytest.mark.parametrize("rule, kind", [("token", "model"), ("traversal", "model"), ("traversal", "composite:int8")])
def test_a_drafter_misreporting_its_children_laws_fails_the_law_test(monkeypatch, rule, kind):
    """Negative control on the drafter's side: sampled children reported with a flat law over q's support. Under
    sampling a static tree draws its children under either rule, and both read the laws; a composite carries its
    model's laws through the merge with the lookup's branch."""
    real = build._children

    def flat(logprobs, width, sample, generator):
        v, t, laws = real(logprobs, width, sample, generator)
        if laws is not None:
            laws = (laws > 0).float()
            laws = laws / laws.sum(dim=-1, keepdim=True)
        return v, t, laws

    verifier = _verifier()
    draft = perturbed_copy(verifier, 0.5) if kind == "model" else kind
    assert _sampled_law(verifier, draft, rule=rule)[0] > ALPHA  # the same seed passes with the true laws
    monkeypatch.setattr(build, "_children", flat)
    assert _sampled_law(verifier, draft, rule=rule)[0] < ALPHA


def test_traversal_is_checked_and_greedy_is_unchanged_batched_and_ragged():
    verifier = _verifier()
    with pytest.raises(ValueError, match="verify='traversal' verifies trees"):
        specdec.SpeculativeModel(verifier, "prompt-lookup", verify="traversal")
    with pytest.raises(ValueError, match="verify='block' verifies chains.*'traversal'"):
        specdec.SpeculativeModel(verifier, "prompt-lookup", verify="block", tree="static")
    with pytest.raises(ValueError, match="choose one of 'token', 'block', 'traversal'"):
        specdec.SpeculativeModel(verifier, "prompt-lookup", verify="walk")
    ids = torch.tensor([[0, 0, 3, 1, 4], [3, 1, 4, 3, 1], [0, 2, 5, 2, 5]])
    mask = (torch.arange(5) >= torch.tensor([[2], [0], [1]])).long()
    expected = verifier.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    for tree in ("static", TREE, "dynamic"):
        spec = specdec.SpeculativeModel(verifier, perturbed_copy(verifier, 0.5), tree=tree, verify="traversal")
        out = spec.generate(ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0)
        assert torch.equal(out, expected), tree
        assert spec.last_stats.verify == "traversal"


def test_the_rules_named_are_the_rules_the_loop_has():
    """The torch-free table (``specdec eval --verify``'s choices) names only rules the loop runs, for what they apply to."""
    from specdec.acceptance import CHAIN_RULES
    from specdec.eval.methods import VERIFY_RULES
    from specdec.rules import RULES, applies, chain_rule
    from specdec.verification import TREE_RULES

    assert VERIFY_RULES == tuple(RULES)
    for rule in RULES:
        assert chain_rule(rule) in CHAIN_RULES  # tree="auto" may draft a chain under any tree rule
        assert applies(rule, True) == (rule in TREE_RULES)
        assert applies(rule, False) == (rule in CHAIN_RULES)


def test_a_composite_merge_keeps_the_models_laws_and_gives_the_lookups_nodes_one_hot_ones():
    from specdec.drafters.composite import _merged_laws
    from specdec.trees.tree import RowTree, pack

    laws = torch.softmax(torch.randn(2, 3, V, generator=torch.Generator().manual_seed(0)), dim=-1)
    model_tree = DraftTree.from_host(torch.tensor([[1, 2, 3], [4, 0, 2]]), [[-1, -1, 0], [-1, 0, 0]])
    merged, sizes = [], []
    for b, branch in enumerate([[1, 4], [3]]):  # row 0: merges into node 0, then a new child 4; row 1: a new root child
        row = RowTree.from_tree(model_tree, b, values=False)
        sizes.append(len(row))
        row.add_path(branch)
        merged.append(row)
    out = pack(merged, torch.device("cpu"))
    own = torch.arange(4, device="cpu") < torch.tensor(sizes, device="cpu").unsqueeze(1)
    got = _merged_laws(laws, out, own)
    assert out.tokens.tolist() == [[1, 2, 3, 4], [4, 0, 2, 3]] and out.parents.tolist() == [[-1, -1, 0, 0], [-1, 0, 0, -1]]
    assert torch.equal(got[:, :3], laws)
    assert torch.equal(got[:, 3], torch.nn.functional.one_hot(torch.tensor([4, 3]), V).float())
    assert _merged_laws(None, out, own) is None
