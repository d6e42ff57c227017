"""CLI errors around drafters and trees: one ``error:`` line and a non-zero exit, never a traceback (issue 23).

Runs ``specdec generate`` and ``specdec eval`` on a tiny local llama (no shipped draft head).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specdec.cli import main
from tiny_models import char_tokenizer
from tiny_models import make_model


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-errors")
    tok = char_tokenizer()
    for arch in ("llama",):
        make_model(arch).save_pretrained(root / arch)
        tok.save_pretrained(root / arch)
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "Name a fruit."}) + "\n")
    return root


CASES = {
    "no shipped head": ("llama", ["--draft", "eagle"], "no draft head ships for this verifier"),
    "missing head dir": ("llama", ["--draft", "eagle:{root}/MISSING"], "does not exist"),
}


def _argv(command, dirs, case, tmp_path):
    arch, extra, _ = CASES[case]
    extra = [e.format(root=dirs) for e in extra]
    if command == "generate":
        return ["generate", "--model", str(dirs / arch), "--prompt", "Name a fruit.", "--max-new-tokens", "4",
                "--no-chat-template", *extra]
    return ["eval", "--model", str(dirs / arch), "--dataset", str(dirs / "prompts.jsonl"), "--max-new-tokens", "4",
            "--baselines", "hf", "--out", str(tmp_path / "out"), "--no-progress", "--no-plots", "--no-warmup", *extra]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", ["generate", "eval"])
def test_drafter_and_tree_errors_are_one_line(command, case, dirs, tmp_path):
    with pytest.raises(SystemExit) as err:
        main(_argv(command, dirs, case, tmp_path))
    message = err.value.code
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message
    assert CASES[case][2] in message


def test_the_process_exits_non_zero_without_a_traceback(dirs, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "specdec.cli", *_argv("generate", dirs, "no shipped head", tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "error: " in done.stderr and "no draft head ships" in done.stderr
