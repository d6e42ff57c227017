"""The metrics, once: ``specdec.metrics``' functions, and every consumer computing its figures through them.

SpecStats / RowStats, the local ``evaluate`` modules, ``summary.json``'s figures and ``specdec demo``'s
Comparison must give the same pooled number (total over total) for the same counts.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

from specdec import metrics
from specdec.eval.side_by_side import Comparison, PromptResult
from specdec.stats import RowStats, SpecStats

# ------------------------------------------------------------------------------------------------
# the functions
# ------------------------------------------------------------------------------------------------


def test_nothing_to_measure_is_zero():
    assert metrics.acceptance_rate(0, 0) == 0.0
    assert metrics.acceptance_rate([], []) == 0.0
    assert metrics.mean_accepted_length([], []) == 0.0
    assert metrics.mean_draft_length(5, 0) == 0.0
    assert metrics.acceptance_by_position([], []) == []
    assert metrics.pool_positions([], []) == ([], [])
    assert metrics.throughput(10, 0.0) == 0.0
    assert metrics.speedup(10, 1.0, 10, 0.0) == 0.0  # no baseline throughput
    assert metrics.speedup([], [], [], []) == 0.0
    assert metrics.exact_matches([], []) == 0


def test_figures_are_pooled_totals_not_means_of_ratios():
    # two generations: 2 tokens in 1 pass, 30 in 10: pooled 32 / 11, while the mean of ratios would be 2.5
    assert metrics.mean_accepted_length([2, 30], [1, 10]) == pytest.approx(32 / 11)
    assert metrics.mean_accepted_length(32, 11) == metrics.mean_accepted_length([2, 30], [1, 10])
    assert metrics.acceptance_rate([3, 1], [4, 4]) == 0.5
    assert metrics.acceptance_rate([1, 0], [1, 9]) == pytest.approx(0.1)  # not (1.0 + 0.0) / 2
    assert metrics.mean_draft_length([8, 4], [2, 2]) == 3.0
    assert metrics.throughput([10, 30], [1.0, 3.0]) == 10.0
    assert metrics.speedup([10, 30], [1.0, 1.0], [10, 30], [2.0, 2.0]) == 2.0


def test_acceptance_by_position_pools_lists_of_different_lengths():
    accepted = [[2, 1, 0], [1, 0], [1]]
    proposed = [[2, 2, 2], [1, 1], [1]]
    assert metrics.pool_positions(accepted, proposed) == ([4, 1, 0], [4, 3, 2])
    assert metrics.acceptance_by_position(accepted, proposed) == [1.0, pytest.approx(1 / 3), 0.0]
    # the widest list sets the width, whichever generation has it
    assert metrics.pool_positions([[1], [1, 1, 1]], [[1], [2, 2, 2]]) == ([2, 1, 1], [3, 2, 2])
    # one generation's flat counts; a position nobody drafted at is 0.0, not a ZeroDivisionError
    assert metrics.acceptance_by_position([3, 1, 0], [4, 2, 0]) == [0.75, 0.5, 0.0]


def test_exact_matches_compares_token_ids():
    assert metrics.exact_matches([[1, 2], [3], (5, 6)], [[1, 2], [4], [5, 6]]) == 2
    assert metrics.exact_matches([[1, 2]], [[1, 2, 3]]) == 0


def test_the_module_imports_neither_torch_nor_evaluate():
    code = ("import sys, specdec.metrics; bad = {'torch', 'evaluate', 'datasets'} & set(sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------------
# SpecStats / RowStats
# ------------------------------------------------------------------------------------------------

RATES = ["acceptance_rate", "mean_accepted_length", "acceptance_by_position", "mean_draft_length"]
ROW_KEYS = ["proposed", "accepted", "verifier_passes", "committed", "accepted_lengths", "proposed_per_position",
            "accepted_per_position", *RATES]
SPEC_KEYS = ["num_draft_tokens", "batch_size", "new_tokens", "proposed", "accepted", "verifier_forwards",
             "drafted_passes", "drafter_forwards", "drafter_stats", "proposed_per_position", "accepted_per_position",
             "time_to_first_token", "draft_seconds", "total_time", "rows", "tree", "draft_choice", "verify", *RATES,
             "mean_tree_tokens",
             "time_per_output_token", "tokens_per_second"]


def test_empty_stats_are_zero_and_keep_their_keys():
    stats = SpecStats(num_draft_tokens=4, batch_size=2)
    assert [stats.acceptance_rate, stats.mean_accepted_length, stats.mean_draft_length, stats.mean_tree_tokens,
            stats.tokens_per_second, stats.time_per_output_token] == [0.0] * 6
    assert stats.acceptance_by_position == []
    data = stats.to_dict()
    assert list(data) == SPEC_KEYS
    assert [list(row) for row in data["rows"]] == [ROW_KEYS, ROW_KEYS]
    row = RowStats()
    assert [row.acceptance_rate, row.mean_accepted_length, row.mean_draft_length] == [0.0] * 3
    assert row.acceptance_by_position == [] and list(row.to_dict()) == ROW_KEYS


def _two_rows() -> SpecStats:
    """Row 0 runs three passes, row 1 leaves after the first (k = 3 chains)."""
    stats = SpecStats(num_draft_tokens=3, batch_size=2)
    stats.record_step(3, [3, 0], [4, 1])
    stats.record_step(3, [1], [2], row_ids=[0])
    stats.record_step(3, [2], [3], row_ids=[0])
    return stats


def test_rows_and_the_batch_use_the_same_pooled_formulas():
    stats = _two_rows()
    row0, row1 = stats.rows
    assert (row0.proposed, row0.accepted, row0.committed, row0.verifier_passes) == (9, 6, 9, 3)
    assert (row1.proposed, row1.accepted, row1.committed, row1.verifier_passes) == (3, 0, 1, 1)
    assert row0.acceptance_rate == pytest.approx(6 / 9) and row1.acceptance_rate == 0.0
    assert row0.mean_accepted_length == 3.0 and row1.mean_accepted_length == 1.0
    assert row0.mean_draft_length == 3.0
    assert row0.acceptance_by_position == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3)]
    # the batch pools its rows: total over total, not a mean of the rows' figures
    rows = stats.rows
    assert stats.acceptance_rate == metrics.acceptance_rate([r.accepted for r in rows], [r.proposed for r in rows])
    assert stats.acceptance_rate == pytest.approx(6 / 12)
    assert stats.mean_accepted_length == metrics.mean_accepted_length([r.committed for r in rows],
                                                                      [r.verifier_passes for r in rows])
    assert stats.mean_accepted_length == pytest.approx(10 / 4)  # not (3.0 + 1.0) / 2
    assert stats.mean_draft_length == stats.mean_tree_tokens == 3.0
    assert stats.acceptance_by_position == metrics.acceptance_by_position(
        [r.accepted_per_position for r in rows], [r.proposed_per_position for r in rows])
    assert stats.acceptance_by_position == [3 / 4, 2 / 4, 1 / 4]
    data = stats.to_dict()
    for key in RATES:
        assert data[key] == getattr(stats, key)
        assert [r[key] for r in data["rows"]] == [getattr(r, key) for r in rows]


def test_rows_of_different_depths_pool_by_position():
    """Trees: (nodes scored, depth spanned) per row; rows whose positions lists differ in length."""
    stats = SpecStats(num_draft_tokens=4, batch_size=2)
    stats.record_step([(6, 3), (2, 1)], [2, 1], [3, 2])
    stats.record_step([(4, 2)], [0], [1], row_ids=[0])
    row0, row1 = stats.rows
    assert row0.proposed_per_position == [2, 2, 1] and row1.proposed_per_position == [1]
    assert stats.proposed_per_position == [3, 2, 1] and stats.accepted_per_position == [2, 1, 0]
    assert stats.acceptance_by_position == metrics.acceptance_by_position(
        [row0.accepted_per_position, row1.accepted_per_position],
        [row0.proposed_per_position, row1.proposed_per_position])
    assert stats.acceptance_rate == pytest.approx(3 / 12)  # over the nodes scored
    assert stats.mean_draft_length == pytest.approx(12 / 3) and row1.mean_draft_length == 2.0
    assert stats.mean_accepted_length == pytest.approx(6 / 3)


def test_tokens_per_second():
    stats = SpecStats(num_draft_tokens=2, new_tokens=30, total_time=1.5)
    assert stats.tokens_per_second == 20.0


# ------------------------------------------------------------------------------------------------
# evaluate modules: thin wrappers, same numbers
# ------------------------------------------------------------------------------------------------


def test_evaluate_modules_give_the_functions_numbers():
    pytest.importorskip("evaluate")
    from specdec.eval.metrics import compute_metric

    acc = compute_metric("acceptance_rate", accepted=[[2, 1, 0], [1, 0]], proposed=[[2, 2, 2], [1, 1]])
    assert acc == {"acceptance_rate": metrics.acceptance_rate(4, 8), "accepted": 4, "proposed": 8,
                   "acceptance_by_position": metrics.acceptance_by_position([[2, 1, 0], [1, 0]], [[2, 2, 2], [1, 1]])}
    assert compute_metric("acceptance_rate", accepted=[], proposed=[]) == {"acceptance_rate": 0.0, "accepted": 0,
                                                                            "proposed": 0}
    assert compute_metric("mean_accepted_length", committed=[2, 30], verifier_passes=[1, 10]) == {
        "mean_accepted_length": metrics.mean_accepted_length(32, 11)}
    assert compute_metric("mean_accepted_length", committed=[], verifier_passes=[]) == {"mean_accepted_length": 0.0}
    speed = compute_metric("speedup", new_tokens=[10, 30], seconds=[1.0, 1.0], baseline_new_tokens=[10, 30],
                           baseline_seconds=[2.0, 2.0])
    assert speed == {"speedup": 2.0, "tokens_per_s": 20.0, "baseline_tokens_per_s": 10.0}
    assert compute_metric("token_exact_match", predictions=[[1, 2], [3]], references=[[1, 2], [4]]) == {
        "exact_match": 0.5, "matches": 1, "total": 2}


def test_report_figures_are_the_pooled_ones():
    pytest.importorskip("evaluate")
    from specdec.eval.report import _figures

    rows = [dict(prompt_id="a", new_tokens=3, seconds=1.0, time_to_first_token=0.1, time_per_output_token=0.2,
                 output_ids=[1, 2, 3], proposed=None, accepted_per_position=[1, 0], proposed_per_position=[1, 1],
                 committed_tokens=2, verifier_passes=1),
            dict(prompt_id="b", new_tokens=31, seconds=3.0, time_to_first_token=0.1, time_per_output_token=0.2,
                 output_ids=[4], proposed=None, accepted_per_position=[5, 3, 1], proposed_per_position=[10, 10, 10],
                 committed_tokens=30, verifier_passes=10)]
    base = [dict(r, seconds=r["seconds"] * 2) for r in rows]
    fig = _figures(rows, {"hf": base}, speculative=True, greedy=True, reference={"a": [1, 2, 3], "b": [5]})
    assert fig["tokens_per_s"] == round(metrics.throughput([3, 31], [1.0, 3.0]), 3) == 8.5
    assert fig["speedup"] == 2.0 and fig["identical"] == 1
    assert fig["proposed"] == 32 and fig["accepted"] == 10
    assert fig["acceptance_rate"] == round(10 / 32, 4)
    assert fig["acceptance_by_position"] == [round(6 / 11, 4), round(3 / 11, 4), 0.1]
    assert fig["mean_accepted_length"] == round(32 / 11, 4)
    assert fig["mean_draft_length"] == fig["mean_tree_tokens"] == round(32 / 11, 4)
    # trees: the rate is over the nodes scored
    trees = [dict(r, proposed=p) for r, p in zip(rows, (4, 40))]
    fig = _figures(trees, {}, speculative=True, greedy=False, reference={})
    assert fig["acceptance_rate"] == round(10 / 44, 4) and fig["mean_draft_length"] == 4.0


# ------------------------------------------------------------------------------------------------
# Comparison (specdec demo / generate --compare)
# ------------------------------------------------------------------------------------------------

PER_PROMPT_KEYS = ["task", "new_tokens", "plain_seconds", "spec_seconds", "identical", "acceptance_rate",
                   "mean_accepted_length", "proposed", "accepted", "verifier_forwards"]
SUMMARY_KEYS = ["prompts", "identical", "speedup", "acceptance_rate", "mean_accepted_length", "plain_tokens_per_s",
                "spec_tokens_per_s", "new_tokens", "num_draft_tokens", "draft", "tree", "mean_tree_tokens",
                "compile_verifier", "verifier_compile_seconds", "per_prompt"]


def _result(new_tokens: int, passes: int, committed: int | None, proposed: int = 0, accepted: int = 0,
            seconds: tuple[float, float] = (1.0, 1.0)) -> PromptResult:
    return PromptResult(task="t", prompt="p", new_tokens=new_tokens, plain_seconds=seconds[0], spec_seconds=seconds[1],
                        identical=True, acceptance_rate=metrics.acceptance_rate(accepted, proposed),
                        mean_accepted_length=metrics.mean_accepted_length(new_tokens - 1, passes),
                        proposed=proposed, accepted=accepted, verifier_forwards=passes, committed=committed)


def test_comparison_pools_committed_over_passes():
    comp = Comparison(results=[_result(3, 1, 2, proposed=4, accepted=1), _result(31, 10, 30, proposed=40, accepted=20)])
    assert comp.mean_accepted_length == pytest.approx(32 / 11)  # total committed / total passes
    assert comp.mean_accepted_length != pytest.approx(sum(r.mean_accepted_length for r in comp.results) / 2)
    assert comp.mean_accepted_length == metrics.mean_accepted_length([2, 30], [1, 10])
    assert comp.acceptance_rate == pytest.approx(21 / 44)
    assert comp.mean_tree_tokens == pytest.approx(44 / 11)
    # results built without `committed`: every new token but the prefill's first came from a verifier pass
    legacy = Comparison(results=[_result(3, 1, None), _result(31, 10, None)])
    assert legacy.mean_accepted_length == comp.mean_accepted_length


def test_comparison_throughput_and_empty():
    comp = Comparison(results=[_result(10, 5, 9, seconds=(2.0, 1.0)), _result(30, 10, 29, seconds=(2.0, 1.0))])
    assert comp.plain_tokens_per_s == 10.0 and comp.spec_tokens_per_s == 20.0 and comp.speedup == 2.0
    empty = Comparison()
    assert [empty.speedup, empty.acceptance_rate, empty.mean_accepted_length, empty.mean_tree_tokens,
            empty.plain_tokens_per_s, empty.spec_tokens_per_s] == [0.0] * 6
    summary = empty.summary()
    assert list(summary) == SUMMARY_KEYS and summary["per_prompt"] == []


def test_comparison_summary_keys_are_unchanged():
    summary = Comparison(results=[_result(3, 1, 2)]).summary()
    assert list(summary) == SUMMARY_KEYS
    assert list(summary["per_prompt"][0]) == PER_PROMPT_KEYS  # `committed` stays out of the JSON
    assert {f.name for f in fields(PromptResult)} == {*PER_PROMPT_KEYS, "prompt", "text", "committed"}


def test_comparison_formula_equals_the_pooled_one_on_a_real_run():
    """Regression: the demo's old formula (sum(new_tokens - 1) / passes) and the pooled one (total committed /
    total passes, as eval computes it) agree on every run of a batch of one, EOS included."""
    from specdec.api import SpeculativeModel
    from specdec.eval.side_by_side import compare
    from tiny_models import char_tokenizer, make_model, perturbed_copy

    model, tok = make_model("llama"), char_tokenizer()
    spec = SpeculativeModel(model, perturbed_copy(model, 0.3), num_draft_tokens=3)
    prompts = [{"task": "a", "prompt": "Hello there"}, {"task": "b", "prompt": "What is 2+2?"},
               {"task": "c", "prompt": "x"}]
    comp = compare(model, tok, spec, prompts, max_new_tokens=12, chat=False, warmup=False)
    passes = [r.verifier_forwards for r in comp.results]
    committed = [r.committed for r in comp.results]
    assert committed == [r.new_tokens - 1 for r in comp.results]
    assert comp.mean_accepted_length == pytest.approx(sum(committed) / sum(passes))
    assert comp.mean_accepted_length == pytest.approx(
        sum(r.new_tokens - 1 for r in comp.results) / sum(passes))  # the old formula
    for r in comp.results:  # each prompt's own figure is SpecStats', the same formula
        assert r.mean_accepted_length == pytest.approx(metrics.mean_accepted_length(r.committed, r.verifier_forwards))
    summary = comp.summary()
    assert list(summary) == SUMMARY_KEYS and all(list(p) == PER_PROMPT_KEYS for p in summary["per_prompt"])
    assert summary["mean_accepted_length"] == round(metrics.mean_accepted_length(committed, passes), 4)
