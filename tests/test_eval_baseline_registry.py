"""The baseline registry of ``specdec eval``: a baseline declared in a few lines is planned, run, recorded, reported
and plotted like the built-in ones; bad declarations are refused with a clear error.

Runs on a tiny random model saved as a local directory (the command line loads it); no assertion depends on timings.
"""

from __future__ import annotations

import argparse
import json

import matplotlib.axes
import pytest

import specdec.eval.plots as plots
from specdec.eval import EvalConfig, MethodSpec, load_records, plan_methods, run_eval
from specdec.eval.__main__ import add_eval_arguments, main as eval_main
from specdec.eval.baselines import (
    HF,
    Baseline,
    baseline_names,
    get_baseline,
    register_baseline,
    registered_baseline,
    unregister_baseline,
)
from tiny_models import char_tokenizer, make_model


def _toy_generate(model, input_ids, **kwargs):
    """The toy baseline's one batch: ``generate`` with an option of its own (1.0: the same tokens as ``hf``)."""
    return model.generate(input_ids, repetition_penalty=1.0, **kwargs)


#: a baseline in a few lines: how it generates, its progress label and plot line, one summary figure and a report note
TOY = Baseline("toy", _toy_generate, label="toy", reference_line={"color": "red", "linestyle": "--"},
               summarize=lambda rows: {"toy_rows": len(rows)},
               note=lambda entry: f"toy ran on {entry['toy_rows']} prompts.")


@pytest.fixture
def toy():
    with registered_baseline(TOY) as baseline:
        yield baseline
    assert "toy" not in baseline_names()  # unregistered again


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny model saved as a local directory with a character tokenizer, and three prompts."""
    root = tmp_path_factory.mktemp("models")
    make_model("llama").save_pretrained(root / "model")
    char_tokenizer().save_pretrained(root / "model")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("Tell me a story.", "What is 2 + 2?", "Hi.")))
    return root / "model", data


def test_a_declared_baseline_runs_through_specdec_eval(toy, tiny_dir, tmp_path, capsys, monkeypatch):
    model_dir, data = tiny_dir
    plotted, lines = {}, []
    per_group = plots.plot_speedup_per_group

    def spy(summary, path):  # the plots' input
        plotted.update({m["name"]: m for m in summary["methods"]})
        return per_group(summary, path)

    axhline = matplotlib.axes.Axes.axhline

    def line_spy(self, y=0, *args, **kwargs):
        lines.append(kwargs)
        return axhline(self, y, *args, **kwargs)

    monkeypatch.setattr(plots, "plot_speedup_per_group", spy)
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline", line_spy)
    argv = ["--model", str(model_dir), "--draft", "prompt-lookup", "-k", "2", "--dataset", str(data),
            "--max-new-tokens", "6", "--baselines", "hf,toy", "--out", str(tmp_path), "--no-progress", "--json"]
    assert eval_main(argv) == 0
    stdout = capsys.readouterr().out
    summary = json.loads(stdout.strip().splitlines()[-1])

    assert [m["name"] for m in summary["methods"]] == ["hf", "toy", "specdec[prompt-lookup,k=2]"]
    assert summary["baselines"] == ["hf", "toy"] and summary["config"]["baselines"] == ["hf", "toy"]
    entry = next(m for m in summary["methods"] if m["name"] == "toy")
    # a plain method: compared with hf token for token, no acceptance figures; its declared summary figure
    assert entry["kind"] == "toy" and entry["identical"] == 3 and entry["acceptance_rate"] is None
    assert entry["speedup"] > 0 and entry["toy_rows"] == 3
    assert summary["methods"][2]["speedup_vs"]["toy"] > 0
    assert {r["kind"] for r in load_records(tmp_path)} == {"hf", "toy", "specdec"}
    report = (tmp_path / "report.md").read_text()
    assert "| toy |" in report and "vs toy" in report and "toy ran on 3 prompts." in report
    assert "vs toy" in stdout  # the report printed
    # the plots: its bars in the per-group plot, its declared line in the speedup-against-k plot
    assert "toy" in plotted and (tmp_path / "speedup_per_group.png").is_file()
    assert {"color": "red", "linestyle": "--", "label": "toy"} in lines


def test_prepare_runs_before_timing_and_is_recorded(tmp_path):
    """A prepare step runs once on the batches the method will meet, before any timed call and in place of its
    warm-up; what it returns is in every record of the method."""
    model, tok = make_model("llama"), char_tokenizer()
    calls = []

    def prepare(runner, batches, gen_kwargs, seed):
        calls.append((len(batches), gen_kwargs["max_new_tokens"]))
        runner.extra = {"repetition_penalty": 1.0}  # what its generate calls get from now on
        return {"toy_prepared": len(batches)}

    with registered_baseline(Baseline("toy-prepared", prepare=prepare)):
        config = EvalConfig(out_dir=tmp_path, methods=["hf", "toy-prepared"], max_new_tokens=4, progress=False,
                            plots=False, warmup=True)
        report = run_eval(model, tok, ["Hello there", "Count."], config)
    assert calls == [(2, 4)]  # once, with the batches of both prompts
    records = [r for r in load_records(tmp_path) if r["method"] == "toy-prepared"]
    assert len(records) == 2 and all(r["toy_prepared"] == 2 and r["compiled_graphs"] == 0 for r in records)
    assert report.method("toy-prepared")["identical"] == 2


def test_baselines_with_a_drafter_are_named_and_planned_per_drafter():
    assisted = Baseline("toy-assisted", generate_kwargs=lambda setup: {"assistant_model": setup.assistant},
                        needs_draft=True, drafts=True, batchable=False)
    with registered_baseline(assisted):
        with pytest.warns(UserWarning, match="toy-assisted needs a causal LM"):
            methods = plan_methods(["hf", "toy-assisted"], ["self:int8", "prompt-lookup"], [2])
        names = [m.name for m in methods]
        assert names[:2] == ["hf", "toy-assisted[self:int8]"]
        assert MethodSpec.parse(names[1]) == methods[1] and methods[1].speculative
        with pytest.warns(UserWarning, match="skipping toy-assisted"):  # batchable=False: left out of batched runs
            assert EvalConfig(out_dir=".", methods=names, batch_size=2).plan()[1].name == "specdec[self:int8,k=2]"
        with pytest.raises(ValueError, match="needs a drafter"):
            MethodSpec("toy-assisted")
    with pytest.raises(ValueError, match="unknown method"):  # unregistered: no longer a kind
        MethodSpec.parse("toy-assisted[self:int8]")


def test_bad_declarations_are_refused_with_a_clear_error(toy):
    with pytest.raises(ValueError, match="'toy' is already registered; unregister_baseline"):
        register_baseline(Baseline("toy"))
    with pytest.raises(ValueError, match="'hf' is a built-in baseline"):
        register_baseline(Baseline(HF))
    with pytest.raises(TypeError, match="baseline 'bad': generate must be a function, got str"):
        register_baseline(Baseline("bad", "model.generate"))
    with pytest.raises(TypeError, match="baseline 'bad': prepare must be a function"):
        register_baseline(Baseline("bad", prepare=3))
    with pytest.raises(ValueError, match="typeable in --baselines"):
        register_baseline(Baseline("a,b"))
    with pytest.raises(ValueError, match="not 'specdec'"):
        register_baseline(Baseline("specdec"))
    with pytest.raises(TypeError, match="takes a Baseline"):
        register_baseline({"name": "bad"})
    with pytest.raises(ValueError, match="built-in baseline and cannot be unregistered"):
        unregister_baseline("hf-compiled")
    with pytest.raises(KeyError, match="no baseline 'nope'"):
        unregister_baseline("nope")
    assert "bad" not in baseline_names() and get_baseline("toy") is TOY


def test_unregistered_baselines_are_unknown_again():
    assert get_baseline("toy") is None
    with pytest.raises(SystemExit):
        add_eval_arguments(argparse.ArgumentParser()).parse_args(["--baselines", "hf,toy"])
    with pytest.raises(ValueError, match="unknown method 'toy'"):
        MethodSpec("toy")
    with pytest.raises(ValueError, match="unknown baseline"):
        plan_methods(["toy"])
