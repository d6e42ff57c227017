"""Block verification (``specdec.acceptance.block_accept``): exact, and it keeps more than the token rule.

The law is checked where a mistake would show: a context-dependent toy of two positions, where the second committed
token must follow the verifier's distribution given the first, with a negative control (the token after the block
drawn from the verifier's distribution instead of the block residual) that the same test rejects.
"""

from __future__ import annotations

import pytest
import torch

from law import ALPHA, chi2
from specdec.acceptance import block_accept, one_hot, rejection_accept

V, N = 4, 60_000


def _dist(seed: int, *shape: int) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.softmax(torch.randn(*shape, V, generator=g, device="cpu") * 1.5, dim=-1)


def _toy(seed: int = 0):
    """N rows of two sampled drafts: P_1, q_1 fixed; P_2, q_2 depend on d_1; P_3 on (d_1, d_2)."""
    g = torch.Generator(device="cpu").manual_seed(seed + 100)
    p1, q1 = _dist(seed, 1)[0], _dist(seed + 1, 1)[0]
    p2, q2 = _dist(seed + 2, V), _dist(seed + 3, V)  # [d1] -> distribution
    p3 = _dist(seed + 4, V, V)  # [d1, d2]
    d1 = torch.multinomial(q1.expand(N, V), 1, generator=g)[:, 0]
    d2 = torch.multinomial(q2[d1], 1, generator=g)[:, 0]
    drafts = torch.stack([d1, d2], dim=1)
    q = torch.stack([q1.expand(N, V), q2[d1]], dim=1)
    p = torch.stack([p1.expand(N, V), p2[d1], p3[d1, d2]], dim=1)
    return drafts, q, p, p1, p2


def _law_p_values(accepted: torch.Tensor, tokens: torch.Tensor, p1: torch.Tensor, p2: torch.Tensor) -> list[float]:
    first, second = tokens[:, 0], tokens[:, 1]
    out = [chi2({t: int((first == t).sum()) for t in range(V)}, dict(enumerate(p1.tolist())), N)]
    for a in range(V):  # given the first committed token a (a kept draft), the second must follow P_2(. | a)
        rows = (first == a) & (accepted >= 1)
        if int(rows.sum()) > 200:
            out.append(chi2({t: int((second[rows] == t).sum()) for t in range(V)}, dict(enumerate(p2[a].tolist())),
                            int(rows.sum())))
    return out


def test_block_verification_keeps_the_verifier_law_and_a_wrong_final_token_does_not():
    drafts, q, p, p1, p2 = _toy()
    accepted, tokens = block_accept(drafts, q, p, torch.Generator(device="cpu").manual_seed(1))
    assert min(_law_p_values(accepted, tokens, p1, p2)) > ALPHA
    # negative control: the same blocks, the token after them drawn from P instead of the block residual
    wrong = tokens.clone()
    rows = torch.arange(N)
    wrong[rows, accepted] = torch.multinomial(p[rows, accepted], 1,
                                              generator=torch.Generator(device="cpu").manual_seed(2))[:, 0]
    assert min(_law_p_values(accepted, wrong, p1, p2)) < ALPHA


def test_block_keeps_more_than_the_token_rule_on_sampled_drafts_and_as_much_on_one_hot_ones():
    # the paper's toy (section 2): P = [1/3, 2/3], q = [2/3, 1/3] at every position, k = 2: E[kept] 10/9 vs 11/9
    rows, k = 40_000, 2
    pt = torch.tensor([1 / 3, 2 / 3, 0.0, 0.0])
    qt = torch.tensor([2 / 3, 1 / 3, 0.0, 0.0])
    g = torch.Generator(device="cpu").manual_seed(3)
    drafts = torch.multinomial(qt.expand(rows * k, V), 1, generator=g).view(rows, k)
    p, q = pt.expand(rows, k + 1, V).contiguous(), qt.expand(rows, k, V).contiguous()
    token, _ = rejection_accept(drafts, q, p, torch.Generator(device="cpu").manual_seed(4))
    block, _ = block_accept(drafts, q, p, torch.Generator(device="cpu").manual_seed(4))
    assert abs(token.float().mean() - 10 / 9) < 0.02 and abs(block.float().mean() - 11 / 9) < 0.02
    # one-hot drafts (a greedy drafter): both rules are optimal, so they keep as much
    greedy = torch.zeros(rows, k, dtype=torch.long)
    q1 = one_hot(greedy, V, p.dtype)
    token, _ = rejection_accept(greedy, q1, p, torch.Generator(device="cpu").manual_seed(5))
    block, _ = block_accept(greedy, q1, p, torch.Generator(device="cpu").manual_seed(6))
    assert abs(token.float().mean() - block.float().mean()) < 0.02


def test_block_rejects_a_broken_draft_distribution_and_handles_no_drafts():
    p = _dist(7, 3, 3)
    drafts = torch.tensor([[1, 2], [0, 0], [3, 1]])
    q = _dist(8, 3, 2).clone()
    q[1, 0, 0] = float("nan")  # row 1's first draft has no distribution: it cannot be kept
    accepted, tokens = block_accept(drafts, q, p, torch.Generator(device="cpu").manual_seed(0))
    assert accepted[1] == 0 and tokens.shape == (3, 3)
    accepted, tokens = block_accept(drafts[:, :0], q[:, :0], p[:, :1], torch.Generator(device="cpu").manual_seed(0))
    assert accepted.tolist() == [0, 0, 0] and tokens.shape == (3, 1)


# --------------------------------------------------------------------------------------------
# the rule inside the loop: every drafter kind, and a wrong rule caught by the same test
# --------------------------------------------------------------------------------------------


def _sampled_law(verifier, draft, monkeypatch=None, rule="block") -> float:
    from law import sampled_law

    p_value, spec = sampled_law(verifier, draft, num_draft_tokens=2, verify=rule)
    assert spec.last_stats.verify == rule
    return p_value


def _verifier():
    from test_sampling import _tiny_vocab_model

    return _tiny_vocab_model(4)


@pytest.mark.parametrize("kind", ["model", "self:int8", "prompt-lookup", "composite:int8"])
def test_block_rule_keeps_the_verifier_law_for_every_drafter_kind(kind):
    from tiny_models import perturbed_copy

    verifier = _verifier()
    draft = perturbed_copy(verifier, 0.5) if kind == "model" else kind
    assert _sampled_law(verifier, draft) > ALPHA


def test_a_wrong_block_rule_fails_the_same_law_test(monkeypatch):
    """The negative control: block acceptance whose final token is drawn from the verifier's P, not the residual."""
    import specdec.acceptance as acceptance
    from tiny_models import perturbed_copy

    def wrong(drafts, q, p, generator=None):
        accepted, tokens = block_accept(drafts, q, p, generator)
        rows = torch.arange(drafts.shape[0])
        tokens[rows, accepted] = torch.multinomial(p[rows, accepted], 1, generator=generator)[:, 0]
        return accepted, tokens

    monkeypatch.setitem(acceptance.CHAIN_RULES, "block", wrong)
    verifier = _verifier()
    assert _sampled_law(verifier, perturbed_copy(verifier, 0.5)) < ALPHA


def test_greedy_is_the_same_under_each_chain_rule():
    """(Which rule verifies what, and the refusals: ``tests/test_traversal.py``.)"""
    import specdec
    from tiny_models import perturbed_copy

    verifier = _verifier()
    prompt = torch.tensor([[3, 1, 4, 3, 1]])
    draft = perturbed_copy(verifier, 0.5)
    outs = [specdec.SpeculativeModel(verifier, draft, num_draft_tokens=3, verify=r).generate(prompt, max_new_tokens=12)
            for r in ("token", "block")]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], verifier.generate(prompt, max_new_tokens=12))
