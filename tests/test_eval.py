"""The evaluation harness: prompt sets, the summary contract, resume, reports, plots, metrics, CLI, processes.

Runs on tiny random models with a stub tokenizer (one eval run shared by most tests), plus a saved tiny
model directory for the command line and ``accelerate launch``; the real SmolLM2 only in a slow test.
No assertion depends on timings.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec.drafters import register_drafter
from specdec.eval import (
    DatasetError,
    EvalConfig,
    EvalReport,
    MethodSpec,
    Prompt,
    load_prompts,
    load_records,
    metric_path,
    plan_methods,
    run_eval,
    select_per_group,
)
from specdec.eval.__main__ import add_eval_arguments, main as eval_main
from specdec.eval.__main__ import run_eval as run_eval_cli
from tiny_models import VOCAB, char_tokenizer, make_model, perturbed_copy

SPEC_BENCH = Path(__file__).resolve().parents[2] / "shared" / "data" / "spec_bench" / "question.jsonl"
DRAFT = "test-perturbed:0.05"
register_drafter("test-perturbed", lambda spec, model, tok: perturbed_copy(model, float(spec.split(":")[1])),
                 hf_assistant=True)


class StubTokenizer:
    """Enough of a tokenizer for the harness: bytes of the text folded into the tiny vocabulary."""

    chat_template = None
    eos_token_id = 2
    pad_token_id = 0

    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[3 + b % (VOCAB - 3) for b in text.encode()[:24]]])}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SPEC_ROWS = [
    {"question_id": 80, "category": "writing", "turns": ["Write a poem about rain.", "Shorter."]},
    {"question_id": 81, "category": "writing", "turns": ["Write a travel blog post about Hawaii.", "Again."]},
    {"question_id": 160, "category": "coding", "turns": ["Write a function that sorts a list."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate 'good morning' into French."],
     "reference": ["Bonjour"]},
    {"question_id": 162, "category": "translation", "turns": ["Translate 'thank you' into German."]},
]


# --------------------------------------------------------------------------------------------
# prompt sets
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason="Spec-Bench questions not present")
def test_spec_bench_groups_and_per_group():
    prompts = load_prompts(SPEC_BENCH)
    assert len(prompts) == 480
    groups = [p.group for p in prompts]
    assert groups.count("mt_bench") == 80
    assert list(dict.fromkeys(groups)) == ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert all(p.group == "mt_bench" for p in prompts if 81 <= int(p.id) <= 160)
    two = load_prompts(SPEC_BENCH, per_group=2)
    assert len(two) == 12 and [p.id for p in two[:2]] == ["81", "82"]
    assert two[0].text.startswith("Compose an engaging travel blog post")  # the first turn


def test_spec_bench_schema_mt_bench_ids(tmp_path):
    prompts = load_prompts(_write_jsonl(tmp_path / "q.jsonl", SPEC_ROWS))
    assert [(p.id, p.group) for p in prompts] == [
        ("80", "writing"), ("81", "mt_bench"), ("160", "mt_bench"), ("161", "translation"), ("162", "translation")]
    assert prompts[1].text == "Write a travel blog post about Hawaii."
    assert prompts[3].reference == "Bonjour" and prompts[0].reference is None
    assert [p.id for p in load_prompts(tmp_path / "q.jsonl", per_group=1)] == ["80", "81", "161"]


def test_plain_prompt_jsonl_csv_tsv_parquet(tmp_path):
    plain = load_prompts(_write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi."}, {"prompt": "Name a fruit."}]))
    assert [(p.id, p.group, p.text) for p in plain] == [("0", "prompts", "Say hi."), ("1", "prompts", "Name a fruit.")]

    (tmp_path / "p.csv").write_text("prompt,task\nSay hi.,chat\nWrite code.,code\nSay bye.,chat\n")
    csv = load_prompts(tmp_path / "p.csv")
    assert [(p.group, p.text) for p in csv] == [("chat", "Say hi."), ("code", "Write code."), ("chat", "Say bye.")]
    assert [p.text for p in load_prompts(tmp_path / "p.csv", per_group=1)] == ["Say hi.", "Write code."]

    (tmp_path / "p.tsv").write_text("question\tkind\nWhy is the sky blue?\tqa\n")
    tsv = load_prompts(tmp_path / "p.tsv", prompt_column="question", group_column="kind")
    assert [(p.group, p.text) for p in tsv] == [("qa", "Why is the sky blue?")]

    import datasets

    datasets.Dataset.from_list([{"prompt": "Hello there.", "category": "chat", "id": "a1"}]).to_parquet(
        str(tmp_path / "p.parquet"))
    assert load_prompts(tmp_path / "p.parquet") == [Prompt(id="a1", group="chat", text="Hello there.")]


def test_select_per_group():
    ps = [Prompt(str(i), g, f"t{i}") for i, g in enumerate("aabbbca")]
    assert [p.id for p in select_per_group(ps, 1)] == ["0", "2", "5"]
    assert [p.id for p in select_per_group(ps, 2)] == ["0", "1", "2", "3", "5"]
    assert select_per_group(ps, None) == ps
    with pytest.raises(ValueError):
        select_per_group(ps, 0)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.jsonl", None, "no such file"),
        ("p.txt", "hello\n", "unknown file type"),
        ("empty.jsonl", "\n", "is empty"),
        ("broken.jsonl", '{"prompt": "a"}\n{not json\n', "could not load"),
        ("noprompt.jsonl", '{"text": "a"}\n', "no 'prompt'"),
        ("blank.jsonl", '{"prompt": "a"}\n{"prompt": "  "}\n', "row 2"),
        ("dupes.jsonl", '{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', "appears twice"),
    ],
)
def test_bad_prompt_files(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError, match=message):
        load_prompts(path)


def test_hub_name_offline_is_a_clear_error(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DatasetError, match="Hugging Face Hub"):
        load_prompts("specdec-tests/no-such-dataset")


# --------------------------------------------------------------------------------------------
# methods
# --------------------------------------------------------------------------------------------


def test_plan_and_parse_methods():
    with pytest.warns(UserWarning, match="hf-assisted needs a causal LM"):
        planned = plan_methods(["hf-assisted", "hf-prompt-lookup"], ["self:int8", "prompt-lookup"], [2, 4])
    names = [m.name for m in planned]
    # hf always first; hf-assisted only for drafters that are causal LMs
    assert names == ["hf", "hf-assisted[self:int8]", "hf-prompt-lookup", "specdec[self:int8,k=2]",
                     "specdec[self:int8,k=4]", "specdec[prompt-lookup,k=2]", "specdec[prompt-lookup,k=4]"]
    for n in names:
        assert MethodSpec.parse(n).name == n
    with pytest.raises(ValueError, match="unknown baseline"):
        plan_methods(["hf-magic"])
    with pytest.raises(ValueError):
        MethodSpec("specdec", "self:int8", 0)


def test_verify_rules_plan_parse_and_reach_the_summary(tiny, tmp_path):
    planned = plan_methods(["hf"], ["prompt-lookup"], [2], trees=[None, "static"], verify=["token", "block"])
    assert [m.name for m in planned] == ["hf", "specdec[prompt-lookup,k=2]", "specdec[prompt-lookup,k=2,verify=block]",
                                         "specdec[prompt-lookup,k=2,tree=static]"]  # trees: the rules that verify trees
    assert all(MethodSpec.parse(m.name) == m for m in planned)
    assert MethodSpec.parse("specdec[suffix,k=3,verify=block,warm]") == MethodSpec("specdec", "suffix", 3, cache="warm",
                                                                                  verify="block")
    with pytest.raises(ValueError, match="verify='block' does not verify specdec trees: .* token, traversal"):
        MethodSpec("specdec", "self:int8", 4, tree="static", verify="block")
    with pytest.raises(ValueError, match="verify='traversal' does not verify specdec chains: .* token, block"):
        MethodSpec("specdec", "self:int8", 4, verify="traversal")
    planned = plan_methods(["hf"], ["self:int8"], [2], trees=[None, "static"], verify=["block", "traversal"])
    assert [m.name for m in planned] == ["hf", "specdec[self:int8,k=2,verify=block]",
                                         "specdec[self:int8,k=2,tree=static,verify=traversal]"]
    assert all(MethodSpec.parse(m.name) == m for m in planned)
    model, tok = tiny
    config = EvalConfig(out_dir=tmp_path, draft=[DRAFT], num_draft_tokens=2, baselines=["hf"], max_new_tokens=6,
                        verify=["token", "block"], do_sample=True, temperature=0.8, progress=False, plots=False)
    summary = run_eval(model, tok, ["Tell me a story."], config).to_dict()
    assert {m["name"]: m.get("verify") for m in summary["methods"]} == {
        "hf": None, f"specdec[{DRAFT},k=2]": "token", f"specdec[{DRAFT},k=2,verify=block]": "block"}


def test_one_drafter_serves_specdec_and_hf_assisted(tiny):
    import specdec.drafters
    import specdec.eval
    from specdec.drafters import Drafter
    from specdec.eval import ResolvedDraft, resolve_draft

    assert specdec.eval.register_drafter is specdec.drafters.register_drafter  # one registry
    model, tok = tiny
    resolved = resolve_draft(DRAFT, model, tok)
    assert isinstance(resolved, ResolvedDraft) and isinstance(resolved.draft, Drafter)
    assert resolved.assistant is resolved.draft.model is not None  # the very module HF assisted generation uses
    lookup = resolve_draft("prompt-lookup", model, tok)
    assert lookup.assistant is None and isinstance(lookup.draft, Drafter)  # not a causal LM: no hf-assisted


# --------------------------------------------------------------------------------------------
# one run on tiny models, shared by the tests below
# --------------------------------------------------------------------------------------------

METHODS = ["hf", f"hf-assisted[{DRAFT}]", "hf-prompt-lookup", f"specdec[{DRAFT},k=2]", f"specdec[{DRAFT},k=3]"]
TOKENS = 10


@pytest.fixture(scope="module")
def tiny():
    return make_model("llama"), StubTokenizer()


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = _write_jsonl(tmp_path_factory.mktemp("data") / "q.jsonl", SPEC_ROWS)
    return load_prompts(path, per_group=1)  # 80 writing, 81 mt_bench, 161 translation


@pytest.fixture(scope="module")
def first_run(tiny, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "out"
    model, tok = tiny
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        report = run_eval(model, tok, prompts, EvalConfig(methods=METHODS, out_dir=out, max_new_tokens=TOKENS,
                                                          progress=True))
    return report, out, err.getvalue()


def test_summary_contract(first_run, prompts):
    report, out, _ = first_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(json.dumps(report.to_dict()))
    assert [m["name"] for m in summary["methods"]] == METHODS
    groups = ["writing", "mt_bench", "translation"]
    assert summary["groups"] == groups and summary["prompts"] == 3
    for m in summary["methods"]:
        for key in ("name", "tokens_per_s", "speedup", "prompts", "groups"):
            assert key in m, key
        assert m["prompts"] == 3 and m["tokens_per_s"] > 0 and m["speedup"] > 0
        assert set(m["groups"]) == set(groups)
        for g in groups:
            assert m["groups"][g]["prompts"] == 1 and m["groups"][g]["speedup"] > 0
        if m["kind"] == "hf":
            assert m["speedup"] == 1.0
            continue
        for key in ("acceptance_rate", "mean_accepted_length", "identical"):
            assert m[key] is not None, (m["name"], key)
            assert m["groups"]["mt_bench"][key] is not None
        assert 0 <= m["acceptance_rate"] <= 1 and m["mean_accepted_length"] >= 1
        assert m["identical"] == 3, m["name"]  # greedy fp32: token for token the plain model's output
        assert set(m["speedup_vs"]) == {b for b in summary["baselines"] if b != m["name"]}
    k3 = report.method(f"specdec[{DRAFT},k=3]")
    assert len(k3["acceptance_by_position"]) == 3 and k3["mean_accepted_length"] <= 4
    assert summary["config"]["max_new_tokens"] == TOKENS and summary["config"]["do_sample"] is False


def test_records_per_prompt_and_order(first_run, prompts):
    _, out, _ = first_run
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == len(prompts) * len(METHODS)
    assert len({(r["prompt_id"], r["method"]) for r in records}) == len(records)
    for r in records:
        for key in ("group", "new_tokens", "seconds", "tokens_per_s", "time_to_first_token", "time_per_output_token",
                    "proposed", "accepted", "acceptance_rate", "mean_accepted_length", "acceptance_by_position",
                    "identical", "output_ids"):
            assert key in r
        assert 0 < r["new_tokens"] <= TOKENS and r["time_to_first_token"] <= r["seconds"]
        if r["kind"] != "hf":
            assert r["identical"] is True and r["proposed"] >= r["accepted"] >= 0
    # the order rotates: prompt i starts with method i (mod the number of methods)
    for i, p in enumerate(prompts):
        first = next(r for r in records if r["prompt_id"] == p.id and r["order"] == 0)
        assert first["method"] == METHODS[i % len(METHODS)]


def test_report_plots_and_progress(first_run):
    report, out, stderr = first_run
    for name in ("report.md", "speedup_per_group.png", "acceptance_by_position.png", "speedup_vs_k.png"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "report.md").read_text()
    assert "## overall" in md and "## mt_bench" in md and "vs hf-prompt-lookup" in md and "3/3" in md
    assert str(report) == report.markdown() and "## translation" in str(report)
    assert "<table" in report._repr_html_()
    assert EvalReport.load(out).to_dict() == json.loads((out / "summary.json").read_text())
    assert "eval" in stderr and "x" in stderr  # tqdm bar with the running speedup


def _explode(*args, **kwargs):
    raise AssertionError("a recorded (prompt, method) pair was computed again")


def test_resume_skips_recorded_pairs(first_run, tiny, prompts, tmp_path, monkeypatch):
    _, first_out, _ = first_run
    out = tmp_path / "out"
    shutil.copytree(first_out, out)
    model, tok = tiny
    before = (out / "records.jsonl").read_text()
    summary = json.loads((out / "summary.json").read_text())

    monkeypatch.setattr(model, "generate", _explode, raising=False)  # the instance, not the class
    # an interrupted write leaves half a line: it is skipped, not an error
    with (out / "records.jsonl").open("a") as f:
        f.write('{"prompt_id": "80", "meth')
    report = run_eval(model, tok, prompts, EvalConfig(methods=METHODS, out_dir=out, max_new_tokens=TOKENS,
                                                      progress=False))
    assert report.to_dict()["methods"] == summary["methods"]
    assert len(load_records(out)) == len(prompts) * len(METHODS)

    # one more draft length: only its pairs are run (specdec never calls model.generate)
    report = run_eval(model, tok, prompts, EvalConfig(methods=[*METHODS, f"specdec[{DRAFT},k=4]"], out_dir=out,
                                                      max_new_tokens=TOKENS, progress=False))
    records = load_records(out)
    assert len(records) == len(prompts) * (len(METHODS) + 1)
    assert (out / "records.jsonl").read_text().startswith(before)
    assert report.method(f"specdec[{DRAFT},k=4]")["identical"] == 3


def test_resume_refuses_another_configuration(first_run, tiny, prompts, tmp_path):
    _, first_out, _ = first_run
    out = tmp_path / "out"
    shutil.copytree(first_out, out)
    model, tok = tiny
    with pytest.raises(ValueError, match="another configuration"):
        run_eval(model, tok, prompts, EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=TOKENS + 1,
                                                 progress=False))
    report = run_eval(model, tok, prompts[:1], EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4, overwrite=True,
                                                          progress=False))
    assert len(load_records(out)) == 1 and report.to_dict()["prompts"] == 1


def test_sampling_and_plain_string_prompts(tiny, tmp_path):
    model, tok = tiny
    # "prompt-lookup" is built by specdec.drafters.resolve_drafter, like every drafter
    config = EvalConfig(out_dir=tmp_path, draft=[DRAFT, "prompt-lookup"], num_draft_tokens=2, baselines=["hf"],
                        max_new_tokens=6, do_sample=True, temperature=0.8, top_p=0.9, seed=1, progress=False,
                        plots=False)
    report = run_eval(model, tok, ["Tell me a story.", "Count to five."], config)
    summary = report.to_dict()
    assert [m["name"] for m in summary["methods"]] == ["hf", f"specdec[{DRAFT},k=2]", "specdec[prompt-lookup,k=2]"]
    spec = summary["methods"][1]
    assert spec["identical"] is None and spec["acceptance_rate"] is not None  # identity is a greedy notion
    assert summary["groups"] == ["prompts"] and not (tmp_path / "speedup_per_group.png").exists()
    with pytest.raises(ValueError, match="batch_size"):
        run_eval(model, tok, ["x"], EvalConfig(methods=["hf"], out_dir=tmp_path, batch_size=0))


def test_hf_heuristic_schedule_baseline_runs_with_its_own_assistant_settings(tiny, tmp_path):
    from specdec.eval.measure import build_runners
    from specdec.eval.methods import HEURISTIC_ASSISTANT

    model, tok = tiny
    methods = plan_methods(["hf", "hf-assisted", "hf-assisted-heuristic"], [DRAFT], [2])
    names = [m.name for m in methods]
    assert names[:3] == ["hf", f"hf-assisted[{DRAFT}]", f"hf-assisted-heuristic[{DRAFT}]"]
    assert MethodSpec.parse(names[2]) == methods[2]
    runners = build_runners(methods, model, tok)
    heuristic = runners[names[2]]
    config = heuristic.extra["assistant_model"].generation_config
    before = (config.num_assistant_tokens_schedule, config.num_assistant_tokens)
    seen = {}
    original = model.generate

    def spy(*args, **kwargs):
        seen["schedule"] = kwargs["assistant_model"].generation_config.num_assistant_tokens_schedule
        return original(*args, **kwargs)

    model.generate = spy
    try:
        [result] = heuristic(torch.tensor([[5, 6, 7]]), {"max_new_tokens": 8, "do_sample": False}, None)
    finally:
        del model.generate
    assert seen["schedule"] == HEURISTIC_ASSISTANT["num_assistant_tokens_schedule"]
    assert (config.num_assistant_tokens_schedule, config.num_assistant_tokens) == before  # restored for hf-assisted
    assert result.verifier_passes and result.proposed_per_position
    config = EvalConfig(methods=methods, out_dir=tmp_path, max_new_tokens=TOKENS, progress=False, plots=False)
    report = run_eval(model, tok, ["Tell me a story."], config)
    assert report.method(names[2])["identical"] == 1


def test_batched_eval_reports_batch_throughput_and_per_row_results(tiny, tmp_path):
    model, tok = tiny
    prompts = ["Hi.", "Tell me a long story about a dragon.", "Why?", "Count from one to ten, please.", "Ok"]
    with pytest.warns(UserWarning, match="one row only"):
        report = run_eval(model, tok, prompts, EvalConfig(
            out_dir=tmp_path, draft=[DRAFT, "prompt-lookup"], num_draft_tokens=3,
            baselines=["hf", "hf-assisted", "hf-prompt-lookup"], max_new_tokens=TOKENS, batch_size=2, progress=False,
            plots=False))
    summary = report.to_dict()
    assert [m["name"] for m in summary["methods"]] == ["hf", f"specdec[{DRAFT},k=3]", "specdec[prompt-lookup,k=3]"]
    assert summary["batch_size"] == 2 and summary["config"]["batch_size"] == 2
    for m in summary["methods"]:  # the contract: batched throughput and its ratio to hf on the same batches
        assert m["batch_size"] == 2 and m["tokens_per_s"] > 0 and m["speedup"] > 0
        if m["kind"] == "specdec":
            assert m["identical"] == len(prompts) and 0 <= m["acceptance_rate"] <= 1
    records = load_records(tmp_path)
    assert len(records) == 3 * len(prompts)
    by_batch: dict = {}
    for r in records:
        by_batch.setdefault((r["method"], r.get("batch_index")), []).append(r)
    for (method, index), rows in by_batch.items():
        if index is None:  # the last prompt ran alone
            assert len(rows) == 1 and rows[0]["prompt_index"] == 4
            continue
        assert len(rows) == 2 and all(r["batch_size"] == 2 for r in rows)
        assert sum(r["seconds"] for r in rows) == pytest.approx(rows[0]["batch_seconds"])
        assert sum(r["new_tokens"] for r in rows) == rows[0]["batch_new_tokens"]
        if method.startswith("specdec"):  # per-row draft statistics, not the batch's
            assert all(r["verifier_passes"] is not None and r["proposed"] is not None for r in rows)
    # a row of a batch is what the model generates for that prompt alone
    alone = run_eval(model, tok, prompts, EvalConfig(methods=["hf"], out_dir=tmp_path / "alone", max_new_tokens=TOKENS,
                                                     progress=False, plots=False))
    single = {r["prompt_id"]: r["output_ids"] for r in load_records(tmp_path / "alone")}
    assert alone.to_dict()["batch_size"] == 1
    assert all(r["output_ids"] == single[r["prompt_id"]] for r in records)
    # a directory of batch-2 results is not resumed at another batch size
    with pytest.raises(ValueError, match="batch_size"):
        run_eval(model, tok, prompts, EvalConfig(methods=["hf"], out_dir=tmp_path, max_new_tokens=TOKENS, batch_size=3,
                                                 progress=False))


# --------------------------------------------------------------------------------------------
# metrics: local evaluate modules, loaded by path, offline
# --------------------------------------------------------------------------------------------


def test_metrics_load_offline_through_evaluate(monkeypatch):
    import evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    acc = evaluate.load(metric_path("acceptance_rate"))
    assert acc.compute(accepted=[3, 1], proposed=[4, 4])["acceptance_rate"] == 0.5
    by_pos = acc.compute(accepted=[[2, 1, 0], [1, 0]], proposed=[[2, 2, 2], [1, 1]])
    assert by_pos["acceptance_by_position"] == [1.0, 1 / 3, 0.0] and by_pos["proposed"] == 8
    mal = evaluate.load(metric_path("mean_accepted_length"))
    assert mal.compute(committed=[30, 10], verifier_passes=[10, 10])["mean_accepted_length"] == 2.0
    speed = evaluate.load(metric_path("speedup"))
    r = speed.compute(new_tokens=[10, 30], seconds=[1.0, 1.0], baseline_new_tokens=[10, 30], baseline_seconds=[2.0, 2.0])
    assert r["speedup"] == 2.0 and r["tokens_per_s"] == 20.0
    em = evaluate.load(metric_path("token_exact_match"))
    assert em.compute(predictions=[[1, 2], [3]], references=[[1, 2], [4]]) == {"exact_match": 0.5, "matches": 1, "total": 2}
    with pytest.raises(ValueError, match="unknown specdec metric"):
        metric_path("bleu")


# --------------------------------------------------------------------------------------------
# command line and processes
# --------------------------------------------------------------------------------------------


def test_cli_defaults_and_errors(tmp_path):
    parser = add_eval_arguments(argparse.ArgumentParser())
    args = parser.parse_args([])
    assert (args.model, args.draft, args.num_draft_tokens, args.max_new_tokens) == ("smollm2", ["self:int8"], [4], 64)
    assert args.baselines == ["hf", "hf-assisted"] and args.batch_size == 1 and args.per_group == "auto"
    args = parser.parse_args(["--per-group", "all", "-k", "2", "4", "--baselines", "hf,hf-prompt-lookup"])
    assert args.per_group is None and args.num_draft_tokens == [2, 4] and args.baselines == ["hf", "hf-prompt-lookup"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--baselines", "hf,hf-magic"])
    assert parser.parse_args(["--batch-size", "4"]).batch_size == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--batch-size", "0"])
    with pytest.raises(SystemExit, match="no such file"):
        run_eval_cli(parser.parse_args(["--dataset", str(tmp_path / "nope.jsonl")]))


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """A tiny model and a perturbed drafter saved as local model directories, with a character tokenizer."""
    root = tmp_path_factory.mktemp("models")
    model, tok = make_model("llama"), char_tokenizer()
    model.save_pretrained(root / "model")
    perturbed_copy(model, 0.05).save_pretrained(root / "draft")
    for d in ("model", "draft"):
        tok.save_pretrained(root / d)
    data = _write_jsonl(root / "prompts.jsonl", [{"prompt": "Tell me a story."}, {"prompt": "What is 2 + 2?"},
                                                 {"prompt": "Name three colours."}])
    return root / "model", root / "draft", data


def test_cli_end_to_end_json(tiny_dirs, tmp_path, capsys):
    model_dir, draft_dir, data = tiny_dirs
    argv = ["--model", str(model_dir), "--draft", str(draft_dir), "self:bf16", "-k", "2", "--dataset", str(data),
            "--max-new-tokens", "6", "--baselines", "hf,hf-assisted", "--out", str(tmp_path), "--no-progress", "--json"]
    assert eval_main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    names = [m["name"] for m in summary["methods"]]
    assert names == ["hf", f"hf-assisted[{draft_dir}]", "hf-assisted[self:bf16]", f"specdec[{draft_dir},k=2]",
                     "specdec[self:bf16,k=2]"]
    assert summary["prompts"] == 3 and summary["config"]["per_group"] == "all"  # a set without groups: every prompt
    assert summary["config"]["command"].startswith("python -m specdec.eval --model")
    for m in summary["methods"][1:]:
        assert m["identical"] is not None and m["acceptance_rate"] is not None


@pytest.mark.slow
def test_accelerate_two_processes_gather_one_report(tiny_dirs, tmp_path):
    """``accelerate launch`` on CPU: --multi_gpu starts the processes (torchrun), each runs on the CPU."""
    model_dir, _, data = tiny_dirs
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "specdec.eval",
           "--model", str(model_dir), "--draft", "self:bf16", "-k", "2", "--dataset", str(data),
           "--max-new-tokens", "5", "--baselines", "hf", "--out", str(out), "--no-progress", "--no-plots"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "records.rank0.jsonl").is_file() and (out / "records.rank1.jsonl").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["num_processes"] == 2 and summary["prompts"] == 3
    ranks = {r["rank"] for r in load_records(out)}
    assert ranks == {0, 1}
    assert summary["methods"][1]["identical"] == 3


@pytest.mark.slow
def test_real_model_smoke(smollm2, tmp_path):
    model, tok = smollm2
    # no warm-up: timings are not under test, and the real model is slow on a shared 2-core machine
    config = EvalConfig(out_dir=tmp_path, draft="self:int8", num_draft_tokens=3, baselines=["hf", "hf-assisted"],
                        max_new_tokens=6, progress=False, plots=False, warmup=False)
    report = run_eval(model, tok, ["Name a fruit."], config)
    summary = report.to_dict()
    assert [m["name"] for m in summary["methods"]] == ["hf", "hf-assisted[self:int8]", "specdec[self:int8,k=3]"]
    assert summary["config"]["chat_template"] is True
    for m in summary["methods"][1:]:
        assert m["identical"] == 1 and m["mean_accepted_length"] >= 1


def test_eval_tree_methods_report_tree_and_tree_tokens(tiny_dirs, tmp_path, capsys):
    """``--tree none dynamic`` runs each specdec method as a chain and as a tree in the same run."""
    model_dir, draft_dir, data = tiny_dirs
    argv = ["--model", str(model_dir), "--draft", str(draft_dir), "-k", "3", "--tree", "none", "dynamic",
            "--dataset", str(data), "--max-new-tokens", "8", "--baselines", "hf", "--out", str(tmp_path),
            "--no-progress", "--json"]
    assert eval_main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    by_name = {m["name"]: m for m in summary["methods"]}
    chain, tree = by_name[f"specdec[{draft_dir},k=3]"], by_name[f"specdec[{draft_dir},k=3,tree=dynamic]"]
    assert chain["tree"] is None and chain["mean_tree_tokens"] == pytest.approx(chain["mean_draft_length"])
    assert tree["tree"]["mode"] == "dynamic" and tree["mean_tree_tokens"] > chain["mean_tree_tokens"]
    assert tree["identical"] == summary["prompts"] and summary["config"]["tree"] == ["none", "dynamic"]
    assert MethodSpec.parse(tree["name"]).tree == "dynamic"
    with pytest.raises(SystemExit):
        eval_main(argv[:6] + ["--tree", "bushy"])


def test_eval_compile_verifier_primes_before_timing_and_reports_it(tiny_dirs, tmp_path, capsys):
    """``--compile-verifier both``: each specdec method eager and compiled in one run; every compiled pass shape
    primed before timing (none inside a timed call), reported apart; chains and trees identical to hf."""
    model_dir, draft_dir, data = tiny_dirs
    argv = ["--model", str(model_dir), "--draft", str(draft_dir), "-k", "3", "--tree", "none", "dynamic",
            "--dataset", str(data), "--max-new-tokens", "8", "--baselines", "hf", "--out", str(tmp_path),
            "--no-progress", "--no-plots", "--json", "--compile-verifier", "both"]
    assert eval_main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["config"]["compile_verifier"] == "both"
    by_name = {m["name"]: m for m in summary["methods"]}
    for tree in ("", ",tree=dynamic"):
        eager, compiled = by_name[f"specdec[{draft_dir},k=3{tree}]"], by_name[f"specdec[{draft_dir},k=3{tree},compiled]"]
        assert eager["compile_verifier"] is False and eager["verifier_compile_seconds"] is None
        assert compiled["compile_verifier"] is True and compiled["verifier_graphs_in_calls"] == 0
        assert compiled["verifier_compile_seconds"] >= 0
        assert eager["identical"] == compiled["identical"] == summary["prompts"]
        assert MethodSpec.parse(compiled["name"]).compiled and not MethodSpec.parse(eager["name"]).compiled
    assert sum(m.get("verifier_compile_seconds") or 0 for m in summary["methods"]) > 0
    assert "priming their graphs took" in (tmp_path / "report.md").read_text()
    with pytest.raises(SystemExit):
        eval_main(argv[:-1] + ["sometimes"])


@pytest.mark.parametrize("seeding", ["generator", "global"])
def test_seeding_passes_a_generator_or_seeds_torch(tiny, tmp_path, monkeypatch, seeding):
    """``seeding="global"`` makes the call users make without a generator (``tree="auto"`` and adaptive ``k`` then
    learn from the clock): no generator, torch's global RNG seeded with the prompt's seed; the default passes a
    seeded generator. The choice is recorded in ``eval_config.json``; an unknown one is refused before any work."""
    import json

    import specdec.api

    model, tok = tiny
    seen = []
    real = specdec.api.SpeculativeModel.generate

    def spy(self, *args, generator=None, **kwargs):
        seen.append((generator, torch.random.get_rng_state().clone()))
        return real(self, *args, generator=generator, **kwargs)

    monkeypatch.setattr(specdec.api.SpeculativeModel, "generate", spy)
    config = EvalConfig(out_dir=tmp_path, draft=[DRAFT], num_draft_tokens=2, baselines=["hf"], max_new_tokens=4,
                        do_sample=True, temperature=0.8, seed=3, seeding=seeding, progress=False, plots=False,
                        warmup=False)
    run_eval(model, tok, ["Tell me a story."], config)
    generator, state = seen[-1]
    if seeding == "global":
        assert generator is None and torch.equal(state, torch.manual_seed(3).get_state())
    else:
        assert isinstance(generator, torch.Generator) and generator.initial_seed() == 3
    assert json.loads((tmp_path / "eval_config.json").read_text())["seeding"] == seeding
    with pytest.raises(ValueError, match="seeding must be one of"):
        run_eval(model, tok, ["x"], EvalConfig(methods=["hf"], out_dir=tmp_path / "bad", seeding="per-call"))


def test_auto_chooses_before_any_timed_call_and_the_summary_says_what(tiny, tmp_path, monkeypatch):
    from specdec.drafters.auto import AutoDrafter
    from specdec.eval.measure import Runner

    model, tok = tiny
    events = []
    choose, call = AutoDrafter.choose, Runner.__call__
    monkeypatch.setattr(AutoDrafter, "choose",
                        lambda self: events.append("measure" if self._chosen is None else "chosen") or choose(self))
    monkeypatch.setattr(Runner, "__call__", lambda self, *a, **k: events.append("call") or call(self, *a, **k))
    config = EvalConfig(out_dir=tmp_path, draft=["auto"], num_draft_tokens=2, baselines=["hf"], max_new_tokens=6,
                        progress=False, plots=False)
    report = run_eval(model, tok, ["Tell me a story.", "Count to five."], config)
    entry = report.method("specdec[auto,k=2]")
    choice = entry["draft_choice"]
    assert events.index("measure") < events.index("call") and events.count("measure") == 1  # untimed, once
    assert choice["chosen"] == choice["ranking"][0]["draft"] and entry["identical"] == 2
    assert f"`specdec[auto,k=2]` chose `{choice['chosen']}`" in report.markdown()
