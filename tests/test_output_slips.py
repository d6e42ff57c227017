"""Output slips of the command line (issue 51): counts in the singular when there is one ("running 1 prompt"),
the drafter described once by ``generate --compare`` (on stdout, with the results), and ``tree`` /
``mean_tree_tokens`` on a chain run: ``tree`` null (no tree configuration), ``mean_tree_tokens`` the draft
tokens the verifier scored per pass (a chain's k), both stated where a user reads them.

Runs on a tiny random model saved as a local directory, with a character tokenizer.
"""

from __future__ import annotations

import json

import pytest

from specdec.cli import build_parser, main
from specdec.eval.__main__ import main as eval_main
from specdec.eval.side_by_side import Comparison
from specdec.prompts import plural
from specdec.stats import SpecStats

DESCRIPTION = "prompt-lookup: copies n-grams from the prompt and the output so far"




def _generate(model_dir, capsys, *extra):
    argv = ["generate", "--model", model_dir, "--prompt", "Say hi.", "--draft", "prompt-lookup", "-k", "2", *extra]
    assert main(argv) == 0
    return capsys.readouterr()


# ------------------------------------------------------------------------------------------------
# counts
# ------------------------------------------------------------------------------------------------


def test_plural():
    assert [plural(n, "prompt") for n in (0, 1, 2)] == ["0 prompts", "1 prompt", "2 prompts"]
    assert plural(1, "new token") == "1 new token" and plural(3, "graph") == "3 graphs"
    assert plural(2, "batch", "batches") == "2 batches"


def test_compare_of_one_prompt_says_1_prompt(tiny_model_dir, capsys):
    err = _generate(tiny_model_dir, capsys, "--compare", "--max-new-tokens", "1").err
    assert "running 1 prompt, 1 new token, plain generate vs specdec" in err
    assert "1 prompts" not in err and "1 new tokens" not in err and " 1 tokens " not in err


def test_generate_of_one_token_says_1_token(tiny_model_dir, capsys):
    err = _generate(tiny_model_dir, capsys, "--max-new-tokens", "1").err
    assert "[1 token, " in err and "1 tokens" not in err


def test_eval_of_one_prompt_says_1_prompt(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "one.jsonl"
    path.write_text('{"prompt": "Say hi."}\n')
    argv = ["--dataset", str(path), "--model", tiny_model_dir, "--draft", "prompt-lookup", "-k", "2",
            "--max-new-tokens", "2", "--baselines", "hf", "--no-progress", "--no-plots", "--no-warmup",
            "--out", str(tmp_path / "out")]
    assert eval_main(argv) == 0
    err = capsys.readouterr().err
    assert f"1 prompt from {path}" in err and "1 prompts" not in err


# ------------------------------------------------------------------------------------------------
# the drafter, described once
# ------------------------------------------------------------------------------------------------


def test_compare_describes_the_drafter_once_on_stdout(tiny_model_dir, capsys):
    captured = _generate(tiny_model_dir, capsys, "--compare", "--max-new-tokens", "3")
    assert (captured.out + captured.err).count(DESCRIPTION) == 1
    assert f"drafter {DESCRIPTION}" in captured.out  # with the results, not with the progress


def test_compare_json_describes_the_drafter_in_the_json_only(tiny_model_dir, capsys):
    captured = _generate(tiny_model_dir, capsys, "--compare", "--json", "--max-new-tokens", "3")
    data = json.loads(captured.out.strip().splitlines()[-1])
    assert data["draft_description"].startswith(DESCRIPTION)
    assert DESCRIPTION not in captured.err and captured.out.count(DESCRIPTION) == 1


# ------------------------------------------------------------------------------------------------
# tree / mean_tree_tokens on a chain run
# ------------------------------------------------------------------------------------------------


def test_generate_json_on_a_chain_keeps_both_keys_with_their_stated_meaning(tiny_model_dir, capsys):
    out = json.loads(_generate(tiny_model_dir, capsys, "--json", "--max-new-tokens", "6").out.strip()
                     .splitlines()[-1])["outputs"][0]
    assert "tree" in out and out["tree"] is None  # no tree configuration: a chain
    # a number on chains too: the draft tokens the verifier scored per pass, the chain's drafts
    assert out["mean_tree_tokens"] == out["mean_draft_length"] == pytest.approx(out["proposed"] / out["verifier_forwards"])


def test_compare_json_on_a_chain_keeps_both_keys(tiny_model_dir, capsys):
    data = json.loads(_generate(tiny_model_dir, capsys, "--compare", "--json", "--max-new-tokens", "6").out.strip()
                      .splitlines()[-1])
    assert data["tree"] is None and isinstance(data["mean_tree_tokens"], float)


def test_the_json_help_and_docstrings_say_what_tree_and_mean_tree_tokens_are():
    for command in ("generate", "demo"):
        sub = build_parser(command)._subparsers._group_actions[0].choices[command]
        text = " ".join(next(a for a in sub._actions if "--json" in a.option_strings).help.split())
        assert "'tree' is the tree configuration (null for chains)" in text
        assert "'mean_tree_tokens' the draft tokens the verifier scored per pass, chains and trees alike" in text
    for doc in (SpecStats.mean_tree_tokens.__doc__, SpecStats.to_dict.__doc__, Comparison.mean_tree_tokens.__doc__,
                Comparison.summary.__doc__):
        assert "chain" in doc and ("None" in doc or "null" in doc)
