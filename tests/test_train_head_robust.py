"""``specdec train-head`` keeps nothing stale, loses nothing and labels nothing wrongly (issue 23): interrupted
checkpoints and half-written files, reruns with other settings, two runs into one ``--out``, bad inputs."""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

import pytest

from tiny_models import make_model, tiny_head_features, train_inputs

_FAST = ["--self-prompts", "0", "--max-new-tokens", "6", "--epochs", "1", "--draft-vocab", "32", "--batch-tokens", "256",
         "--eval-prompts", "1", "--gen-batch", "4", "--heldout", "0.25", "--json"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two tiny verifiers of the same shapes (other seeds) as local model directories, and a prompt file."""
    return train_inputs(tmp_path_factory.mktemp("train_head"), models={"m0": 0, "m1": 1})


def _train(tiny: Path, out: Path, *extra: str, model: str | Path = "m0") -> int:
    """``specdec train-head`` (later flags win over :data:`_FAST`'s); ``model``: a name under ``tiny`` or a path."""
    from specdec.cli import main

    return main(["train-head", "--model", str(tiny / model), "--data", str(tiny / "data.jsonl"), "--out", str(out),
                 *_FAST, *extra])


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if "error" in line]
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.fixture(scope="module")
def finished(tiny, tmp_path_factory):
    """One finished run (model m0, --max-new-tokens 6, --draft-vocab 32); tests copy it."""
    out = tmp_path_factory.mktemp("finished") / "head"
    assert _train(tiny, out) == 0
    return out


def _copy(finished: Path, tmp_path: Path) -> Path:
    out = tmp_path / "head"
    shutil.copytree(finished, out)
    return out


def test_rerun_with_the_same_settings_resumes(tiny, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    before = (out / "work" / "samples.jsonl").read_text()
    capsys.readouterr()
    assert _train(tiny, out) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"out", "samples", "tokens", "steps", "seconds", "heldout_acceptance", "mean_accepted_length"}
    assert (out / "work" / "samples.jsonl").read_text() == before  # nothing regenerated


def test_pipeline_resumes_on_the_same_model_object(tiny, tmp_path):
    """The library entry point: a second call with the same model object (its identity unchanged by the first
    call's speculative evaluation) resumes; another model of the same shapes is refused."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdec.training.pipeline import PipelineConfig, ResumeError, run_pipeline
    from specdec.training.train import TrainConfig

    model, tok = AutoModelForCausalLM.from_pretrained(tiny / "m0").eval(), AutoTokenizer.from_pretrained(tiny / "m0")
    config = PipelineConfig(per_group=None, self_prompts=0, max_new_tokens=4, gen_batch=4, heldout=0.25, eval_prompts=1,
                            eval_new_tokens=4, train=TrainConfig(draft_vocab=32, epochs=1, batch_tokens=256, warmup=1))
    kwargs = dict(model_name="m0", progress=False, log=lambda m: None)
    first = run_pipeline(model, tok, tiny / "data.jsonl", tmp_path / "head", config, **kwargs)
    again = run_pipeline(model, tok, tiny / "data.jsonl", tmp_path / "head", config, **kwargs)
    assert again["steps"] == first["steps"] and again["samples"] == first["samples"]
    other = AutoModelForCausalLM.from_pretrained(tiny / "m1").eval()
    with pytest.raises(ResumeError, match="--model m0 as it was then"):
        run_pipeline(other, tok, tiny / "data.jsonl", tmp_path / "head", config, **kwargs)


@pytest.mark.parametrize("flags, named", [
    (["--max-new-tokens", "8"], "--max-new-tokens 6, not 8"),
    (["--draft-vocab", "16"], "--draft-vocab 32, not 16"),
    (["--kind", "eagle"], "--kind eagle3, not eagle"),
    (["--ttt-steps", "2"], "--ttt-steps 3, not 2"),
    (["--seed", "3"], "--seed 0, not 3"),
    (["--prompt-weight", "0.5"], "--prompt-weight 0.0, not 0.5"),
    (["--lookup-weight", "0.5"], "--lookup-weight 1.0, not 0.5"),
])
def test_rerun_with_other_settings_is_refused_in_one_line(tiny, finished, tmp_path, capsys, flags, named):
    out = _copy(finished, tmp_path)
    capsys.readouterr()
    assert _train(tiny, out, *flags) == 2
    line = _one_line_error(capsys)
    assert named in line and "--overwrite" in line and str(out) in line


@pytest.mark.parametrize("key,flag,named", [("prompt_weight", "--prompt-weight", "--prompt-weight 0.0, not 0.5"),
                                           ("lookup_weight", "--lookup-weight", "--lookup-weight 1.0, not 0.5")])
def test_a_record_from_before_a_weight_existed_stands_for_its_default(tiny, finished, tmp_path, capsys, key, flag, named):
    """Runs recorded before --prompt-weight and --lookup-weight existed trained on every response target alike:
    they resume without the flags and refuse another weight."""
    import json

    out = _copy(finished, tmp_path)
    path = out / "work" / "settings.json"
    record = json.loads(path.read_text())
    del record["stages"]["training"][key]
    path.write_text(json.dumps(record))
    capsys.readouterr()
    assert _train(tiny, out, flag, "0.5") == 2
    assert named in _one_line_error(capsys)
    assert _train(tiny, out) == 0


def test_rerun_with_another_model_of_the_same_shapes_is_refused(tiny, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    head_config = (out / "config.json").read_text()
    capsys.readouterr()
    assert _train(tiny, out, model="m1") == 2
    line = _one_line_error(capsys)
    assert "--model" in line and str(tiny / "m0") in line and "--overwrite" in line
    assert (out / "config.json").read_text() == head_config  # the old head is not relabelled
    # the same model under another path is the same verifier: it resumes
    shutil.copytree(tiny / "m0", tmp_path / "m0-copy")
    assert _train(tiny, out, model=tmp_path / "m0-copy") == 0


def test_overwrite_starts_afresh(tiny, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    (out / "notes.txt").write_text("mine")  # not ours: kept
    assert _train(tiny, out, "--max-new-tokens", "3", "--overwrite") == 0
    samples = [json.loads(line) for line in (out / "work" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and max(len(s["response_ids"]) for s in samples) <= 3
    assert (out / "notes.txt").read_text() == "mine"
    capsys.readouterr()
    assert _train(tiny, out, "--max-new-tokens", "3") == 0  # and the new settings resume


def test_interrupted_checkpoint_is_skipped_on_resume(tiny, finished, tmp_path, capsys):
    out = _copy(finished, tmp_path)
    checkpoints = out / "checkpoints"
    (checkpoints / "step-99").mkdir()  # SIGINT right after the directory appeared
    partial = checkpoints / "step-98"
    shutil.copytree(sorted(checkpoints.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[0], partial)
    (partial / "optimizer.bin").unlink()  # and one cut short before its optimizer state
    capsys.readouterr()
    assert _train(tiny, out) == 0
    err = capsys.readouterr().err
    assert "step-99" in err and "step-98" in err and "incomplete" in err


def test_a_checkpoint_interrupted_mid_write_leaves_no_step_directory(tmp_path, monkeypatch):
    from accelerate import Accelerator

    from specdec.training.train import TrainConfig, train_head

    model = make_model("llama")
    features, config = tiny_head_features(model, tmp_path / "features")
    train = TrainConfig(draft_vocab=32, epochs=4, batch_tokens=64, warmup=1, save_every=2)
    real_save = Accelerator.save_state

    def interrupted(self, output_dir=None, **kwargs):
        real_save(self, output_dir, **kwargs)  # the files are there ...
        (Path(output_dir) / "optimizer.bin").write_bytes(b"")  # ... one cut short
        raise KeyboardInterrupt

    monkeypatch.setattr(Accelerator, "save_state", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_head(model, features, list(range(6)), tmp_path, train, config, progress=False, log=lambda m: None)
    assert not list((tmp_path / "checkpoints").glob("step-*"))
    monkeypatch.setattr(Accelerator, "save_state", real_save)
    head, summary = train_head(model, features, list(range(6)), tmp_path, train, config, progress=False, log=lambda m: None)
    assert summary["resumed_from"] is None and summary["steps"] == summary["total_steps"]


def test_second_run_into_a_locked_out_is_refused_at_once(tiny, tmp_path, capsys, monkeypatch):
    import specdec.models

    monkeypatch.setattr(specdec.models, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    out = tmp_path / "head"
    out.mkdir()
    with open(out / ".train-head.lock", "w") as held:  # another run holds it (specdec.training.pipeline.LOCK_FILE)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert _train(tiny, out) == 2
    line = _one_line_error(capsys)
    assert str(out) in line and "another" in line
    assert not (out / "work" / "samples.jsonl").exists()


def test_half_written_and_doubled_work_files_are_repaired(tiny, finished, tmp_path, capsys):
    """What two unlocked runs or an interruption left (duplicated rows, a broken line in the middle, a torn
    timing file, an unreadable feature index) is repaired by a rerun instead of failing every rerun."""
    out = _copy(finished, tmp_path)
    samples = out / "work" / "samples.jsonl"
    lines = samples.read_text().splitlines()
    samples.write_text("\n".join(lines[:3] + ['{"id": "p9", "resp'] + lines + lines[:4]) + "\n")
    (out / "work" / "timing.json").write_text('{"data": 1')
    (out / "work" / "features" / "index.json").write_text('{"layers": [')
    capsys.readouterr()
    assert _train(tiny, out) == 0
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == len({r["id"] for r in rows}) == 8


def test_pipeline_writes_no_half_files(tiny, finished, tmp_path, monkeypatch):
    """An interrupted save of the final head leaves the earlier head whole (every file replaced at once)."""
    import specdec.training.pipeline as pipeline

    out = _copy(finished, tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    real = pipeline.save_head

    def interrupted(head, directory, **kwargs):
        real(head, directory, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "save_head", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _train(tiny, out)
    after = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert after == before


@pytest.mark.parametrize("case, expected", [
    ("utf8", "UTF-8"),
    ("under-file", "is a file"),
    ("one-prompt", "at least 2"),
    ("draft-vocab-negative", "--draft-vocab"),
    ("ttt-steps-0", "--ttt-steps"),
    ("prompt-weight-negative", "--prompt-weight must be >= 0"),
    ("lookup-weight-above-1", "--lookup-weight must be in [0, 1]"),
])
def test_bad_inputs_fail_in_one_line_before_the_model_loads(tiny, tmp_path, capsys, monkeypatch, case, expected):
    import specdec.models
    from specdec.cli import main

    monkeypatch.setattr(specdec.models, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    data, out, extra = tiny / "data.jsonl", tmp_path / "out", []
    if case == "utf8":
        data = tmp_path / "bad.jsonl"
        data.write_bytes(b'{"id": "a", "prompt": "fine"}\n{"id": "b", "prompt": "caf\xe9"}\n')
    elif case == "under-file":
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "head"
    elif case == "one-prompt":
        data = tmp_path / "one.jsonl"
        data.write_text('{"id": "a", "prompt": "only one"}\n')
    elif case == "draft-vocab-negative":
        extra = ["--draft-vocab", "-5"]
    elif case == "ttt-steps-0":
        extra = ["--ttt-steps", "0"]
    elif case == "prompt-weight-negative":
        extra = ["--prompt-weight", "-1"]
    elif case == "lookup-weight-above-1":
        extra = ["--lookup-weight", "1.5"]
    argv = ["train-head", "--model", str(tiny / "m0"), "--data", str(data), "--out", str(out), *_FAST, *extra]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    assert code == 2
    line = _one_line_error(capsys)
    assert expected in line, line
    if case == "utf8":
        assert "bad.jsonl" in line and "line 2" in line


def test_stage_times_are_kept_as_each_stage_ends(tiny, tmp_path):
    """A run stopped after its data keeps the data's time (a session killed in a later stage loses only that
    stage's), and the card's training time is the checkpoints' clock, which counts every resumed run."""
    out = tmp_path / "head"
    assert _train(tiny, out, "--stop-after", "data") == 0
    timing = json.loads((out / "work" / "timing.json").read_text())
    assert set(timing) == {"data"} and timing["data"] >= 0  # a tiny run rounds to 0.0 s
    assert _train(tiny, out) == 0
    record = json.loads((out / "training.json").read_text())
    stages = record["stage_seconds"]
    assert set(stages) == {"data", "features", "training", "heldout_eval"}
    assert stages["data"] >= timing["data"]
    assert stages["training"] == record["training_seconds_total"]  # the checkpoints' clock, not this run's
    assert f"training {stages['training']:.0f} s" in (out / "README.md").read_text()
