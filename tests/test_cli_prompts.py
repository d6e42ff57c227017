"""`specdec generate` refuses bad prompt files and sampling options with one line, before the model loads;
specdec.prompts is the one reader of prompt files."""

from __future__ import annotations

import argparse
import json

import pytest

import specdec.models
from specdec.cli import main
from specdec.prompts import PromptFileError, PromptRecord, read_prompt_file, round_robin


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if the command gets as far as loading a model."""

    def load_model(*_args, **_kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(specdec.models, "load_model", load_model)


def _error(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    msg = exc.value.code
    assert isinstance(msg, str) and msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def _generate(path) -> str:
    return _error(["generate", "--prompts", str(path)])


def test_missing_file(no_model, tmp_path):
    msg = _generate(tmp_path / "missing.jsonl")
    assert "missing.jsonl" in msg and "does not exist" in msg


def test_directory(no_model, tmp_path):
    msg = _generate(tmp_path)
    assert str(tmp_path) in msg and "is a directory" in msg


def test_non_utf8_file(no_model, tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps({"prompt": "ok"}).encode() + b"\n" + '{"prompt": "caf\u00e9"}'.encode("latin-1") + b"\n")
    msg = _generate(path)
    assert str(path) in msg and "not UTF-8" in msg and "line 2" in msg


def test_malformed_json_line_names_file_and_line(no_model, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "one"}) + "\n\n" + json.dumps({"prompt": "two"}) + "\n{\"prompt\": \"three\"\n")
    msg = _generate(path)
    assert f"{path}:4: not valid JSON" in msg


@pytest.mark.parametrize("line, kind", [("[1, 2]", "an array"), ('"just text"', "a string"), ("42", "a number"),
                                        ("null", "null")])
def test_line_that_is_not_an_object(no_model, tmp_path, line, kind):
    path = tmp_path / "list.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + line + "\n")
    msg = _generate(path)
    assert f"{path}:2: expected a JSON object" in msg and kind in msg


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--do-sample", "--temperature", "0"], "--temperature must be > 0 with --do-sample (got 0)"),
        (["--do-sample", "--temperature", "-0.5"], "--temperature must be > 0"),
        (["--do-sample", "--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--do-sample", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--do-sample", "--top-k", "-1"], "--top-k must be >= 0"),
        (["--temperature", "0.7"], "--temperature only apply with --do-sample"),
        (["--do-sample", "--compare"], "--compare measures greedy decoding"),
    ],
)
def test_bad_sampling_options(no_model, extra, message):
    assert message in _error(["generate", "--prompt", "hi", *extra])


@pytest.mark.parametrize(
    "draft, message",
    [
        ("self:int3", "unknown quantization scheme 'int3'"),
        ("composite:int4:g3", "group size must be a power of two"),
        ("layer-skip:x", "layer-skip needs a layer count"),
        ("no-such-drafter", "is not a drafter"),
    ],
)
def test_bad_draft_fails_before_the_model_loads(no_model, draft, message):
    assert message in _error(["generate", "--prompt", "hi", "--draft", draft])


def test_bad_model_fails_before_loading(no_model):
    assert "--model: model 'org/remote-model' is neither" in _error(["demo", "--model", "org/remote-model"])


# the reader itself


def test_reader_formats_and_fields(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"question_id": 7, "category": "a", "turns": ["A1", "second turn"]}, {"prompt": "P1", "task": "t"},
            {"prompt": "P2"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert read_prompt_file(path) == [
        PromptRecord(text="A1", group="a", id="7", line=1),
        PromptRecord(text="P1", group="t", id=None, line=2),
        PromptRecord(text="P2", group=None, id=None, line=3),
    ]


def test_reader_errors_are_prompt_file_errors(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n \n")
    with pytest.raises(PromptFileError, match="holds no prompts"):
        read_prompt_file(tmp_path / "empty.jsonl")
    (tmp_path / "blank.jsonl").write_text(json.dumps({"prompt": "  "}) + "\n")
    with pytest.raises(PromptFileError, match=r"blank.jsonl:1 has no non-empty 'prompt'"):
        read_prompt_file(tmp_path / "blank.jsonl")
    assert issubclass(PromptFileError, ValueError)


def test_round_robin_over_groups():
    recs = [PromptRecord(t, g, None, i) for i, (t, g) in enumerate([("a1", "a"), ("a2", "a"), ("b1", "b"), ("n1", None)])]
    assert [r.text for r in round_robin(recs, 3)] == ["a1", "b1", "n1"]
    assert [r.text for r in round_robin(recs)] == ["a1", "b1", "n1", "a2"]


def test_select_per_group_and_group_order_keep_first_appearance():
    from specdec.prompts import Prompt, group_order, select_per_group

    ps = [Prompt(str(i), g, f"t{i}") for i, g in enumerate("baab")]
    assert group_order(ps) == ["b", "a"]
    assert [p.id for p in select_per_group(ps, 1)] == ["0", "1"]


def test_encode_batch_left_pads_each_prompts_encoding():
    import torch

    from specdec.prompts import encode_batch, encode_prompt

    class WordLengths:  # a tokenizer without a chat template: one id per word
        chat_template, pad_token_id, eos_token_id = None, 0, 2

        def __call__(self, text, return_tensors="pt"):
            return argparse.Namespace(input_ids=torch.tensor([[3 + len(w) for w in text.split()]], device="cpu"))

    tok = WordLengths()
    assert encode_prompt(tok, "a bb").tolist() == [[4, 5]]
    ids, mask = encode_batch(tok, ["a bb", "ccc"])
    assert ids.tolist() == [[4, 5], [0, 6]] and mask.tolist() == [[1, 1], [0, 1]]
    with pytest.raises(ValueError, match="empty prompt"):
        encode_prompt(tok, "  ")
