"""`specdec eval` on a fresh clone (issue 51): no Spec-Bench file there, so the error offers the shipped
sets and the first example of docs/eval.md uses one; a prompt file without groups runs every prompt
under ``--per-group N``.

Runs on a tiny random model saved as a local directory, with a character tokenizer.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest

import specdec.prompts
import specdec.prompts.sets
from specdec.eval.__main__ import add_eval_arguments, main as eval_main
from specdec.prompts import (
    BUILTIN_SETS,
    DEFAULT_GROUP,
    DatasetError,
    Prompt,
    PromptRecord,
    load_prompts,
    select_per_group,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "eval.md"
#: what makes a run of the tiny model short: every other setting is the command's own
TINY = ["--draft", "prompt-lookup", "-k", "2", "--max-new-tokens", "2", "--baselines", "hf", "--no-progress",
        "--no-plots", "--no-warmup", "--json"]


@pytest.fixture
def clone(monkeypatch):
    """A fresh clone: no Spec-Bench questions anywhere specdec looks for them."""
    for module in (specdec.prompts, specdec.prompts.sets):
        monkeypatch.setattr(module, "default_dataset", lambda: None)




def _summary(capsys) -> tuple[dict, str]:
    captured = capsys.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


# ------------------------------------------------------------------------------------------------
# no --dataset on a clone
# ------------------------------------------------------------------------------------------------


def test_eval_without_a_dataset_on_a_clone_offers_the_shipped_sets(clone, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        eval_main(["--out", str(tmp_path / "out")])
    message = str(exit_info.value.code)
    assert message.startswith("error: no --dataset given") and "\n" not in message
    assert "Spec-Bench" in message and "shared/data/spec_bench/question.jsonl" in message
    for name in BUILTIN_SETS:  # every shipped set, as the flag to type
        assert f"--dataset {name}" in message
    assert "--dataset json-schema" in message


def test_load_prompts_without_a_source_on_a_clone_names_the_shipped_sets(clone):
    with pytest.raises(DatasetError) as err:
        load_prompts()
    assert "'json-schema'" in str(err.value) and "\n" not in str(err.value)


def _first_example() -> list[str]:
    """The first command of the first ``bash`` block of docs/eval.md, as argv after ``specdec eval``."""
    block = re.search(r"```bash\n(.*?)```", DOCS.read_text(), re.S).group(1)
    line = next(l for l in block.splitlines() if l.strip() and not l.lstrip().startswith("#"))
    argv = shlex.split(line)
    assert argv[:2] == ["specdec", "eval"], line
    return argv[2:]


def test_the_first_example_of_the_docs_names_a_set_a_clone_has():
    args = add_eval_arguments(argparse.ArgumentParser()).parse_args(_first_example())
    assert args.dataset in BUILTIN_SETS  # not the Spec-Bench default a clone lacks


def test_the_first_example_of_the_docs_runs_on_a_clone(clone, tiny_model_dir, tmp_path, capsys):
    # the docs' command as written, on the tiny model and for 2 new tokens
    argv = [*_first_example(), "--model", tiny_model_dir, *TINY, "--out", str(tmp_path / "out")]
    assert eval_main(argv) == 0
    summary, err = _summary(capsys)
    assert summary["prompts"] == 3 and len(summary["groups"]) == 3  # json-schema: one prompt of each group
    assert "3 prompts from json-schema" in err


def test_the_docs_keep_the_spec_bench_example_and_say_where_its_file_goes():
    block = re.search(r"```bash\n(.*?)```", DOCS.read_text(), re.S).group(1)
    assert "\nspecdec eval\n" in block
    assert "shared/data/spec_bench/question.jsonl" in block and "SPECDEC_SPEC_BENCH" in block


# ------------------------------------------------------------------------------------------------
# --per-group on a set without groups
# ------------------------------------------------------------------------------------------------


def test_select_per_group_counts_each_prompt_of_a_set_without_groups_as_its_own_group():
    plain = [Prompt("0", DEFAULT_GROUP, "Say hi."), Prompt("1", DEFAULT_GROUP, "Name a fruit.")]
    assert select_per_group(plain, 1) == plain
    records = [PromptRecord("a", None, None, 1), PromptRecord("b", None, None, 2), PromptRecord("c", None, None, 3)]
    assert select_per_group(records, 2) == records
    # a set with groups is unchanged: the first N of each
    grouped = [Prompt("0", "a", "x"), Prompt("1", "a", "y"), Prompt("2", "b", "z")]
    assert [p.id for p in select_per_group(grouped, 1)] == ["0", "2"]
    with pytest.raises(ValueError):
        select_per_group(plain, 0)


def test_load_prompts_per_group_keeps_every_prompt_of_a_file_without_groups(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text('{"prompt": "Say hi."}\n{"prompt": "Name a fruit."}\n')
    assert [p.text for p in load_prompts(path, per_group=1)] == ["Say hi.", "Name a fruit."]


def test_eval_per_group_1_runs_both_prompts_of_a_file_without_groups(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "two.jsonl"
    path.write_text('{"prompt": "Say hi."}\n{"prompt": "Name a fruit."}\n')
    argv = ["--dataset", str(path), "--per-group", "1", "--model", tiny_model_dir, *TINY, "--out", str(tmp_path / "o")]
    assert eval_main(argv) == 0
    summary, err = _summary(capsys)
    assert summary["prompts"] == 2 and summary["config"]["per_group"] == "all"
    assert f"2 prompts from {path}" in err


def test_per_group_help_says_what_a_set_without_groups_does():
    text = " ".join(add_eval_arguments(argparse.ArgumentParser()).format_help().split())
    assert "in a set without groups (no category/task/group on any row) each prompt is its own group" in text
