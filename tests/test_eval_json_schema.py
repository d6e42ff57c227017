"""``specdec eval`` on JSON answers: the shipped ``json-schema`` prompt set, the validity check, ``--json-schema``
(xgrammar constraints, every method alike) and error records for a method that raises on a prompt."""

from __future__ import annotations

import argparse
import json
import runpy
import string
import sys
import warnings
from pathlib import Path

import pytest

from specdec.drafters import register_drafter
from specdec.eval import EvalConfig, Prompt, SchemaError, check_output, load_prompts, load_records, run_eval
from specdec.eval.__main__ import add_eval_arguments, main as eval_main
from specdec.eval.json_schema import require_schemas, validity
from specdec.prompts import builtin_set
from tiny_models import make_model, perturbed_copy

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[1]
DRAFT = "json-perturbed:0.05"
register_drafter("json-perturbed", lambda spec, model, tok: perturbed_copy(model, float(spec.split(":")[1])),
                 hf_assistant=True)

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
                         "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
                         "code": {"type": "string", "pattern": "^[A-Z]{2}$"}}}
OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
YES_NO = {"enum": ["yes", "no"]}


def _quiet() -> dict:
    return dict(progress=False, plots=False)


# --------------------------------------------------------------------------------------------
# the prompt set
# --------------------------------------------------------------------------------------------


def test_json_schema_set_loads_by_name_with_valid_schemas():
    prompts = load_prompts("json-schema")
    schemas = {json.dumps(p.schema, sort_keys=True) for p in prompts}
    assert len(prompts) >= 30 and len(schemas) >= 10
    assert {p.group for p in prompts} == {"extraction", "tool_call", "generation"}
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        jsonschema.validators.validator_for(p.schema).check_schema(p.schema)
        assert json.dumps(p.schema) in p.text, p.id  # the user turn shows the schema it is held to
    # the default --per-group takes one per group: a 3-prompt smoke run
    first = load_prompts("json-schema", per_group=1)
    assert [p.id for p in first] == ["extraction-01", "tool_call-01", "generation-01"]


def test_json_schema_set_is_small_and_built_by_its_script(monkeypatch):
    path = builtin_set("json-schema")
    assert path.stat().st_size < 100_000
    monkeypatch.setattr(sys, "argv", ["json_schema_prompts.py", "--check"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(REPO / "benchmarks" / "json_schema_prompts.py"), run_name="__main__")
    assert done.value.code == 0  # the file is what the script builds


def test_every_schema_of_the_set_compiles_with_xgrammar():
    xgr = pytest.importorskip("xgrammar")
    from specdec.eval import SchemaConstraints

    constraints = SchemaConstraints(tokenizer_info=xgr.TokenizerInfo(encoded_vocab=_JSON_VOCAB, vocab_size=96))
    prompts = load_prompts("json-schema")
    constraints.compile_all(p.schema for p in prompts)
    assert len(constraints._compiled) == len({json.dumps(p.schema, sort_keys=True) for p in prompts})


def test_a_schema_column_may_hold_json_text_and_bad_ones_are_one_line_errors(tmp_path):
    from specdec.prompts import DatasetError, as_prompts

    (p,) = as_prompts([{"prompt": "x", "schema": json.dumps(OK)}])
    assert p.schema == OK and as_prompts([{"prompt": "x"}])[0].schema is None
    for bad in ("{not json", "[1, 2]"):
        with pytest.raises(DatasetError, match="'schema' that is not"):
            as_prompts([{"prompt": "x", "schema": bad}])


# --------------------------------------------------------------------------------------------
# validity
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ['{"name": "Ada", "age": 36, "tags": ["a"]}',
                                  ' \n{"name": "Ada", "age": 0, "tags": [], "code": "GB"}\n'])
def test_valid_answers_are_accepted(text):
    assert check_output(text, PERSON) is None
    assert validity(text, PERSON) == {"valid": True, "invalid_reason": None}


@pytest.mark.parametrize("text, reason", [
    ('', "not JSON"),
    ('{"name": "Ada", "age": 3', "not JSON"),                                   # cut short by max_new_tokens
    ('```json\n{"name": "Ada", "age": 36, "tags": []}\n```', "not JSON"),       # fenced: not the JSON asked for
    ('{"name": "Ada", "tags": []}', "'age' is a required property"),
    ('{"name": "Ada", "age": "36", "tags": []}', "age: '36' is not of type 'integer'"),
    ('{"name": "Ada", "age": -1, "tags": []}', "age: -1 is less than the minimum of 0"),
    ('{"name": "Ada", "age": 1, "tags": ["c"]}', "tags/0: 'c' is not one of"),
    ('{"name": "Ada", "age": 1, "tags": [], "code": "gb"}', "code: 'gb' does not match"),
    ('{"name": "Ada", "age": 1, "tags": [], "extra": 1}', "Additional properties are not allowed"),
    ('[]', "is not of type 'object'"),
])
def test_invalid_answers_are_rejected_with_a_one_line_reason(text, reason):
    why = check_output(text, PERSON)
    assert why is not None and reason in why and "\n" not in why
    assert validity(text, PERSON)["valid"] is False
    assert validity(text, None) == {"valid": None, "invalid_reason": None}  # no schema: nothing to check


def test_require_schemas_names_what_is_missing_or_broken(monkeypatch):
    with pytest.raises(SchemaError, match=r"2 of 3 prompts have none \(id b, c\)"):
        require_schemas([Prompt("a", "g", "x", schema=OK), Prompt("b", "g", "y"), Prompt("c", "g", "z")])
    with pytest.raises(SchemaError, match="prompt a: its 'schema' is not a valid JSON schema"):
        require_schemas([Prompt("a", "g", "x", schema={"type": "nonsense"})])
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "xgrammar" else find_spec(name, *a))
    with pytest.raises(SchemaError, match=r"xgrammar, which is not installed: pip install 'specdec\[grammar\]'"):
        require_schemas([Prompt("a", "g", "x", schema=OK)])


# --------------------------------------------------------------------------------------------
# --json-schema: one line when the prompts have no schema, before the model loads
# --------------------------------------------------------------------------------------------


def test_json_schema_flag_parses_on_and_off():
    parser = add_eval_arguments(argparse.ArgumentParser())
    assert parser.parse_args([]).json_schema is False
    assert parser.parse_args(["--json-schema"]).json_schema is True
    assert parser.parse_args(["--json-schema", "--no-json-schema"]).json_schema is False


def test_json_schema_on_prompts_without_schemas_is_a_one_line_error(tmp_path, monkeypatch):
    import specdec.models

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the prompts were checked")

    monkeypatch.setattr(specdec.models, "load_model", no_model)
    data = tmp_path / "plain.jsonl"
    data.write_text(json.dumps({"prompt": "Name a fruit."}) + "\n")
    with pytest.raises(SystemExit) as err:
        eval_main(["--dataset", str(data), "--json-schema", "--baselines", "hf", "--out", str(tmp_path / "out")])
    message = err.value.code
    assert isinstance(message, str) and "\n" not in message
    assert message.startswith("error: --json-schema needs a JSON schema per prompt") and "1 of 1 prompt has none" in message


def test_run_eval_refuses_json_schema_without_schemas(tmp_path):
    with pytest.raises(SchemaError, match="needs a JSON schema per prompt"):
        run_eval(object(), object(), ["Name a fruit."], EvalConfig(out_dir=tmp_path, methods=["hf"], json_schema=True))


# --------------------------------------------------------------------------------------------
# tiny models: constrained generation for every method, error records
# --------------------------------------------------------------------------------------------

#: characters of the tiny JSON tokenizer (one token each), after <pad> <s> </s> <unk>
_CHARS = string.ascii_lowercase + string.ascii_uppercase[:20] + string.digits + ' {}[]":,.-_\n'
_JSON_VOCAB = ["<pad>", "<s>", "</s>", "<unk>", *_CHARS]


def json_tokenizer():
    """A character-level tokenizer whose characters can write JSON, within the tiny models' 96 ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(_JSON_VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


@pytest.fixture(scope="module")
def tiny():
    assert len(_JSON_VOCAB) <= 96
    return make_model("llama"), json_tokenizer()


PROMPTS = [Prompt("ok", "flags", "say ok", schema=OK), Prompt("yn", "answers", "yes or no", schema=YES_NO)]
METHODS = ["hf", f"hf-assisted[{DRAFT}]", f"specdec[{DRAFT},k=2]"]


def _follows_grammar(ids: list[int], schema: dict, tokenizer) -> bool:
    """Whether a fresh xgrammar matcher accepts every token of ``ids`` and ends terminated (``ids`` ends with EOS)."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=96)
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema)))
    return all(matcher.accept_token(t) for t in ids) and matcher.is_terminated()


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "T=0.7"])
def test_every_method_generates_under_the_schema_or_records_an_error(tiny, tmp_path, sampling):
    pytest.importorskip("xgrammar")
    model, tok = tiny
    config = EvalConfig(out_dir=tmp_path, methods=METHODS, max_new_tokens=32, json_schema=True, do_sample=sampling,
                        temperature=0.7 if sampling else None, **_quiet())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # hf-assisted may warn that it failed: that is what is under test
        report = run_eval(model, tok, PROMPTS, config)
    summary = report.to_dict()
    assert summary["config"]["json_schema"] is True and summary["config"]["grammar_compile_seconds"] >= 0
    assert summary["prompts"] == 2  # a method that raised does not drop the prompt from the run
    records = {(r["prompt_id"], r["method"]): r for r in load_records(tmp_path)}
    assert len(records) == len(PROMPTS) * len(METHODS)
    for p in PROMPTS:
        hf = records[(p.id, "hf")]
        assert hf.get("error") is None and hf["valid"] in (True, False)
        # xgrammar's processor was applied: the answer is in the schema's language (complete: EOS within budget)
        assert _follows_grammar(hf["output_ids"], p.schema, tok) and hf["output_ids"][-1] == tok.eos_token_id
        assert hf["valid"] is True and json.loads(hf["text"]) is not None
    for m in summary["methods"]:
        mine = [records[(p.id, m["name"])] for p in PROMPTS]
        failed = [r for r in mine if r.get("error")]
        assert m["errors"] == len(failed) and m["prompts"] == len(mine) - len(failed)
        for r in failed:  # one line: the exception type and where it was raised
            assert "\n" not in r["error"] and r["error"].split(":")[0].split(" ")[0].endswith("Error")
            assert "output_ids" not in r and m["error"] is not None
        answered = [r for r in mine if not r.get("error")]
        if answered:
            assert m["valid"] == sum(r["valid"] for r in answered)
            assert m["validity_rate"] == round(m["valid"] / len(answered), 4)
        else:  # nothing to check
            assert m["valid"] is None and m["validity_rate"] is None and m["tokens_per_s"] is None
    md = (tmp_path / "report.md").read_text()
    assert "| valid |" in md and "--json-schema" in md


def test_a_method_that_raises_is_recorded_and_tried_again_on_resume(tmp_path, monkeypatch):
    """Independent of xgrammar: hf-prompt-lookup raises on every prompt, the run goes on, a rerun retries it."""
    model, tok = make_model("llama"), json_tokenizer()
    prompts = [Prompt("ok", "flags", "say ok", schema=OK), Prompt("free", "free", "anything")]
    generate = model.generate

    def broken_lookup(*args, **kwargs):
        if "prompt_lookup_num_tokens" in kwargs:
            raise ValueError("lookup\nbroke")
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", broken_lookup)
    config = EvalConfig(out_dir=tmp_path, methods=["hf", "hf-prompt-lookup"], max_new_tokens=6, **_quiet())
    with pytest.warns(UserWarning, match="hf-prompt-lookup failed"):
        report = run_eval(model, tok, prompts, config)
    lookup = report.method("hf-prompt-lookup")
    assert lookup["errors"] == 2 and lookup["prompts"] == 0 and lookup["tokens_per_s"] is None
    assert lookup["error"].startswith("ValueError: lookup broke (") and lookup["speedup"] is None
    hf = report.method("hf")
    assert hf["errors"] == 0 and hf["prompts"] == 2 and hf["valid"] in (0, 1)  # the prompt without a schema: unchecked
    md = (tmp_path / "report.md").read_text()
    assert "`hf-prompt-lookup` raised on 2 prompt(s): ValueError: lookup broke" in md and "| errors |" in md

    monkeypatch.setattr(model, "generate", generate)
    report = run_eval(model, tok, prompts, config)  # resumes: hf is not run again, the errors are
    assert report.method("hf-prompt-lookup")["errors"] == 0 and report.method("hf-prompt-lookup")["prompts"] == 2
    assert report.method("hf-prompt-lookup")["identical"] == 2
    assert len(load_records(tmp_path)) == 4 and all(r.get("error") is None for r in load_records(tmp_path))


# --------------------------------------------------------------------------------------------
# the real model
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_model_answers_follow_their_schemas(smollm2, tmp_path):
    pytest.importorskip("xgrammar")
    model, tok = smollm2
    prompts = [p for p in load_prompts("json-schema") if p.id in ("tool_call-01", "extraction-09")]
    config = EvalConfig(out_dir=tmp_path, methods=["hf"], max_new_tokens=128, json_schema=True, warmup=False,
                        **_quiet())
    report = run_eval(model, tok, prompts, config)
    hf = report.method("hf")
    assert hf["prompts"] == 2 and hf["errors"] == 0
    assert hf["valid"] == 2, [(r["prompt_id"], r["text"], r["invalid_reason"]) for r in load_records(tmp_path)]
