"""The eval harness's numbers hold: adaptive k really adapts, the compiled HF baseline, resumes that refuse to
mix results, and ``--out`` errors before the model loads.

Tiny random models and a stub tokenizer; no assertion depends on timings.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from specdec.eval import EvalConfig, OutputDirError, ResumeError, load_prompts, load_records, plan_methods, run_eval
from specdec.eval.__main__ import main as eval_main
from tiny_models import VOCAB, make_model

EOS = 2
WEAK = "layer-skip:1"  # one layer of two on a random model: about 1 draft in 20 is accepted


class StubTokenizer:
    """Bytes of the text folded into the tiny vocabulary; no chat template."""

    chat_template = None
    eos_token_id = EOS
    pad_token_id = 0

    def __call__(self, text, return_tensors="pt"):
        return {"input_ids": torch.tensor([[3 + b % (VOCAB - 3) for b in text.encode()[:24]]], device="cpu")}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def tiny():
    return make_model("llama"), StubTokenizer()


def _quiet(**kwargs):
    return dict(progress=False, plots=False, **kwargs)


# --------------------------------------------------------------------------------------------
# 1. adaptive draft length, visible as mean_draft_length
# --------------------------------------------------------------------------------------------


def test_adaptive_method_drafts_fewer_than_k_with_a_weak_drafter(tiny, tmp_path):
    model, tok = tiny
    tokens = 64
    config = EvalConfig(out_dir=tmp_path, draft=WEAK, num_draft_tokens=8, baselines=["hf"], adaptive=True,
                        max_new_tokens=tokens, **_quiet())
    report = run_eval(model, tok, ["Hello there"], config)
    records = {r["method"]: r for r in load_records(tmp_path)}
    hf = records["hf"]["output_ids"]
    # precondition: the output ends at EOS far from max_length, so no draft of 8 was ever cut short by it
    assert hf[-1] == EOS and len(hf) <= tokens - 9
    fixed, adaptive = f"specdec[{WEAK},k=8]", f"specdec[{WEAK},k=8,adaptive]"
    assert report.method(fixed)["mean_draft_length"] == 8.0
    assert records[fixed]["mean_draft_length"] == 8.0
    assert report.method(adaptive)["mean_draft_length"] < 4  # adaptive k backs off a drafter that is rarely right
    assert records[adaptive]["mean_draft_length"] == records[adaptive]["proposed"] / records[adaptive]["verifier_passes"]
    assert report.method(adaptive)["identical"] == 1 and report.method(fixed)["identical"] == 1
    assert report.method(adaptive)["groups"]["prompts"]["mean_draft_length"] < 4
    md = (tmp_path / "report.md").read_text()
    assert "draft len" in md and "| 8.00 |" in md


# --------------------------------------------------------------------------------------------
# 2. hf-compiled
# --------------------------------------------------------------------------------------------


def test_hf_compiled_is_a_baseline():
    assert [m.name for m in plan_methods(["hf", "hf-compiled"], ["self:int8"], [2])] == [
        "hf", "hf-compiled", "specdec[self:int8,k=2]"]
    assert plan_methods(["hf-compiled"], ["self:int8"], [2])[1].speculative is False


def test_hf_compiled_compiles_before_timing_and_leaves_the_model_eager(tiny, tmp_path):
    model, tok = tiny
    torch._dynamo.reset()  # a graph another test compiled in this worker would make the compile free (0.0 s)
    prompts = ["Hello there", "Why is the sky blue? Tell me.", "Count."]  # three prompt lengths, one graph
    methods = ["hf", "hf-compiled", f"specdec[{WEAK},k=2]"]
    # no warm-up: hf-compiled still compiles untimed
    report = run_eval(model, tok, prompts, EvalConfig(methods=methods, out_dir=tmp_path, max_new_tokens=10,
                                                      warmup=False, **_quiet()))
    compiled = report.method("hf-compiled")
    assert compiled["compile_seconds"] > 0 and compiled["compiled_graphs"] == 0  # nothing compiled inside a timed call
    assert compiled["identical"] == 3 and compiled["acceptance_rate"] is None  # compared with hf; drafts nothing
    spec = report.method(f"specdec[{WEAK},k=2]")
    assert spec["speedup_vs_hf_compiled"] == spec["speedup_vs"]["hf-compiled"] > 0 and spec["identical"] == 3
    assert report.method("hf")["speedup_vs_hf_compiled"] > 0
    records = [r for r in load_records(tmp_path) if r["method"] == "hf-compiled"]
    widths = [r["prompt_tokens"] for r in records]
    assert len(set(widths)) == 3 and all(r["max_cache_len"] == max(widths) + 10 for r in records)
    assert all(r["compiled_graphs"] == 0 and round(r["compile_seconds"], 4) == compiled["compile_seconds"] for r in records)
    md = (tmp_path / "report.md").read_text()
    assert "vs hf-compiled" in md and "compiled for" in md
    # the model is left as it was: no compiled call kept, forward never replaced, plain generate eager again
    assert not {"_compiled_call", "_previous_max_cache_length", "forward"} & set(vars(model))
    from torch._dynamo.utils import counters

    before = counters["frames"]["total"]
    ids = torch.tensor([[5, 6, 7]], device="cpu")
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert counters["frames"]["total"] == before

    # batches of 2 and a last batch of 1: both shapes compiled before timing (the same static cache length as
    # above, so only the batch of 2 is a new graph: dynamo keeps the other one)
    batched = run_eval(model, tok, prompts, EvalConfig(methods=["hf", "hf-compiled"], out_dir=tmp_path / "b",
                                                       max_new_tokens=10, batch_size=2, **_quiet()))
    assert batched.method("hf-compiled")["compiled_graphs"] == 0 and batched.method("hf-compiled")["identical"] == 3


# --------------------------------------------------------------------------------------------
# 3. resume safety
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tiny, tmp_path_factory):
    """A finished run of two prompts with hf only."""
    model, tok = tiny
    out = tmp_path_factory.mktemp("resume") / "out"
    run_eval(model, tok, ["Hello there", "Count."], EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4,
                                                               **_quiet()))
    return out


def _copy(recorded, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(recorded, out)
    return out


def test_config_records_every_measurement_setting(recorded):
    config = json.loads((recorded / "eval_config.json").read_text())
    assert config["dtype"] == "float32" and config["device"] == "cpu" and config["num_processes"] == 1
    assert config["compile_drafter"] is False and config["warmup"] is True
    assert all(len(r["prompt_sha256"]) == 16 for r in load_records(recorded))


@pytest.mark.parametrize("key", ["dtype", "compile_drafter", "warmup"])
def test_resume_refuses_other_measurement_settings(tiny, recorded, tmp_path, key):
    model, tok = tiny
    out = _copy(recorded, tmp_path)
    kwargs = dict(max_new_tokens=4, **_quiet())
    if key == "dtype":
        model = make_model("llama").to(torch.bfloat16)
    elif key == "compile_drafter":
        kwargs["compile_drafter"] = True
    else:
        kwargs["warmup"] = False
    with pytest.raises(ResumeError, match=rf"another configuration \({key}: (False|True|'float32') there"):
        run_eval(model, tok, ["Hello there", "Count."], EvalConfig(methods=["hf"], out_dir=out, **kwargs))
    report = run_eval(model, tok, ["Hello there"], EvalConfig(methods=["hf"], out_dir=out, overwrite=True, **kwargs))
    assert report.to_dict()["prompts"] == 1 and len(load_records(out)) == 1


def test_resume_refuses_a_run_recorded_on_another_device(tiny, recorded, tmp_path):
    model, tok = tiny
    out = _copy(recorded, tmp_path)
    config = json.loads((out / "eval_config.json").read_text())
    (out / "eval_config.json").write_text(json.dumps({**config, "device": "cuda:0"}))
    with pytest.raises(ResumeError, match=r"device: 'cuda:0' there, 'cpu' now"):
        run_eval(model, tok, ["Hello there", "Count."], EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4,
                                                                   **_quiet()))


def test_resume_without_the_new_keys_is_refused_naming_them(tiny, recorded, tmp_path):
    model, tok = tiny
    out = _copy(recorded, tmp_path)
    config = json.loads((out / "eval_config.json").read_text())
    del config["dtype"], config["device"]  # as written before they were recorded
    (out / "eval_config.json").write_text(json.dumps(config))
    with pytest.raises(ResumeError, match=r"dtype: not recorded there, 'float32' now; device: not recorded there"):
        run_eval(model, tok, ["Hello there", "Count."], EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4,
                                                                   **_quiet()))


def test_resume_can_add_prompt_lookup_and_then_keeps_its_setting(tiny, recorded, tmp_path, monkeypatch):
    model, tok = tiny
    out = _copy(recorded, tmp_path)
    run_eval(model, tok, ["Hello there"], EvalConfig(methods=["hf", "hf-prompt-lookup"], out_dir=out, max_new_tokens=4,
                                                     prompt_lookup_num_tokens=3, **_quiet()))
    assert json.loads((out / "eval_config.json").read_text())["prompt_lookup_num_tokens"] == 3
    # a run without hf-prompt-lookup keeps the recorded setting
    run_eval(model, tok, ["Hello there"], EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4, **_quiet()))
    assert json.loads((out / "eval_config.json").read_text())["prompt_lookup_num_tokens"] == 3
    with pytest.raises(ResumeError, match=r"prompt_lookup_num_tokens: 3 there, 5 now"):
        run_eval(model, tok, ["Hello there"], EvalConfig(methods=["hf", "hf-prompt-lookup"], out_dir=out,
                                                         max_new_tokens=4, prompt_lookup_num_tokens=5, **_quiet()))


def _never(*args, **kwargs):
    raise AssertionError("generated although the resume should have been refused")


def test_resume_refuses_edited_prompt_text(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    data = tmp_path / "q.jsonl"
    data.write_text('{"prompt": "Hello there"}\n{"prompt": "Count."}\n')
    out = tmp_path / "out"
    run_eval(model, tok, load_prompts(data), EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4, **_quiet()))
    data.write_text('{"prompt": "Hello there"}\n{"prompt": "Count to ten."}\n')  # row 1 edited
    monkeypatch.setattr(model, "generate", _never, raising=False)
    with pytest.raises(ResumeError, match=r"other text under prompt id\(s\) 1 \(edited data set"):
        run_eval(model, tok, load_prompts(data), EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4, **_quiet()))
    # the unchanged prompt alone still resumes (nothing to run)
    report = run_eval(model, tok, load_prompts(data)[:1], EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4,
                                                                     **_quiet()))
    assert report.to_dict()["prompts"] == 1


def test_resume_refuses_another_prompt_column(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    data = tmp_path / "q.csv"
    data.write_text("prompt,question\nHello there,Why?\nCount.,How many?\n")
    out = tmp_path / "out"
    run_eval(model, tok, load_prompts(data), EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4, **_quiet()))
    monkeypatch.setattr(model, "generate", _never, raising=False)
    with pytest.raises(ResumeError, match=r"prompt id\(s\) 0, 1 .*another --prompt-column"):
        run_eval(model, tok, load_prompts(data, prompt_column="question"),
                 EvalConfig(methods=["hf"], out_dir=out, max_new_tokens=4, **_quiet()))


# --------------------------------------------------------------------------------------------
# 4. --out that cannot be an output directory
# --------------------------------------------------------------------------------------------


def _unusable_outs(tmp_path: Path) -> list[tuple[Path, str]]:
    file = tmp_path / "results.json"
    file.write_text("{}")
    cases = [(file, "is an existing file"), (file / "sub", "is a file, not a directory")]
    if sys.platform.startswith("linux"):
        cases.append((Path("/proc/specdec-eval-out"), "is not writable"))  # no one can create entries in /proc
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        cases.append((locked / "out", "is not writable"))
    return cases


def test_out_that_is_a_file_or_unwritable_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import specdec.models

    monkeypatch.setattr(specdec.models, "load_model", _never)
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "Hi."}\n')
    for out, message in _unusable_outs(tmp_path):
        with pytest.raises(SystemExit) as exit_:
            eval_main(["--dataset", str(data), "--out", str(out), "--no-progress"])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert "argument --out" in err[-1] and message in err[-1], err
        with pytest.raises(OutputDirError, match=message):  # the Python API too, before touching the model
            run_eval(None, None, ["Hi."], EvalConfig(out_dir=out))

