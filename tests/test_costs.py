"""One model of a pass's cost and yield (``specdec.costs``), shared by adaptive k, tree auto and quant-report."""

from __future__ import annotations

import pytest

from specdec.costs import MAX_ACCEPTANCE, VerifyCost, chain_rate
from specdec.chains import AdaptiveDraftLength
from specdec.metrics import expected_tokens
from specdec.quant_report import estimate_speedup
from specdec.trees.arms import ChainOrTree


def test_chain_rate_is_expected_tokens_over_seconds_with_the_acceptance_clamped():
    assert chain_rate(0.5, 2, 0.5) == pytest.approx(expected_tokens(0.5, 2) / 0.5)
    assert chain_rate(1.5, 3, 1.0) == pytest.approx(expected_tokens(MAX_ACCEPTANCE, 3))
    assert chain_rate(-1.0, 3, 2.0) == pytest.approx(0.5)
    assert chain_rate(0.5, 2, 0.0) > 1e6  # a free pass: finite, not a division by zero


def test_quant_report_estimate_uses_the_verify_curve():
    # measured 1- and 8-token passes: the curve interpolates a k + 1 token pass between them
    cost = VerifyCost((1, 8), (10.0, 17.0))
    assert cost(5) == pytest.approx(14.0)
    for k in (1, 4, 7, 12):
        by_hand = expected_tokens(0.7, k) * 10.0 / (k * 2.0 + 10.0 + k)
        assert estimate_speedup(0.7, 2.0, 10.0, 17.0, k) == pytest.approx(by_hand)
    # a longer pass measured cheaper (noise) never makes a pass cheaper than one token
    assert estimate_speedup(0.7, 2.0, 10.0, 8.0, 4) == pytest.approx(expected_tokens(0.7, 4) * 10.0 / 18.0)


def test_adaptive_k_and_auto_chain_rank_k_by_the_same_rate():
    policy = AdaptiveDraftLength(max_k=8, timed=False, draft_cost_ratio=0.1)
    for k in range(1, 9):
        assert policy.rate(k) == pytest.approx(chain_rate(policy.acceptance, k, policy._pass_cost(k)))
    arms = ChainOrTree()
    cost = VerifyCost((1, 16), (1.0, 1.0))  # flat: every chain length costs one pass plus its drafting
    best = arms.chain_length(8, cost, 0.01)
    assert best == max(range(1, 9), key=lambda k: chain_rate(arms.acceptance, k, 1.0 + 0.01 * k))


def test_the_tree_module_serves_the_same_curve():
    from specdec.trees import auto

    assert auto.VerifyCost is VerifyCost
