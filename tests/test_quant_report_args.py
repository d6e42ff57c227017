"""`specdec quant-report` refuses bad arguments with one line, before any model loads or work starts."""

from __future__ import annotations

import json

import pytest

import specdec.quant_report as report
from specdec.cli import main


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the report gets as far as loading a model."""

    def load_model(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(report, "load_model", load_model)


def _error(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["quant-report", *argv])
    msg = exc.value.code
    assert isinstance(msg, str) and msg.startswith("error: ") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--positions", "0"], "--positions must be >= 1, got 0"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--ctx", "-1"], "--ctx must be >= 1, got -1"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
        (["--schemes", " , "], "--schemes is empty"),
        (["--device", "gpu0"], "--device 'gpu0' is not a device"),
        (["--model", "/no/such/model"], "--model: model '/no/such/model' is neither"),
    ],
)
def test_bad_counts_and_names(no_model, argv, message):
    assert message in _error(argv)


def test_unknown_scheme_is_refused_before_any_work(no_model):
    msg = _error(["--schemes", "int8,int3,int4"])
    assert "unknown quantization scheme 'int3'" in msg and "Valid schemes:" in msg


def test_missing_prompts_file(no_model, tmp_path):
    msg = _error(["--prompts", str(tmp_path / "nope.jsonl")])
    assert "--prompts" in msg and "nope.jsonl" in msg and "does not exist" in msg


def test_malformed_prompts_file_names_the_line(no_model, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n{not json\n")
    assert f"{path}:2: not valid JSON" in _error(["--prompts", str(path)])


def test_quant_report_api_checks_counts():
    with pytest.raises(ValueError, match="positions must be >= 1"):
        report.quant_report(None, None, ["int8"], ["hi"], positions=0)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        report.quant_report(None, None, ["int8"], ["hi"], repeats=0)
