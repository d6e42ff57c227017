"""`specdec demo` says which drafter it used and why its acceptance is what it is.

Runs the real demo end to end on tiny local models: one whose projections lie on an int4 g32 grid
(as the embedded Q4_1 SmolLM2's do) and a plain random one.
"""

from __future__ import annotations

import json

import pytest

from specdec.cli import drafter_summary, main
from test_quant_grid import grid_snapped_llama, tiny_llama

SUMMARY_KEYS = {"prompts", "identical", "speedup", "acceptance_rate", "mean_accepted_length", "plain_tokens_per_s",
                "spec_tokens_per_s", "new_tokens", "num_draft_tokens", "draft", "per_prompt", "tree", "mean_tree_tokens",
                "compile_verifier", "verifier_compile_seconds"}
DRAFT_KEYS = {"draft_description", "draft_note", "draft_weight_error", "draft_head_weight_error", "draft_grid_bound",
              "draft_choice"}


def _save(model, path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(model.config.vocab_size - 2)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>", pad_token="<eos>")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def snapped_dir(tmp_path_factory):
    return _save(grid_snapped_llama(), tmp_path_factory.mktemp("snapped"))


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory):
    return _save(tiny_llama(), tmp_path_factory.mktemp("plain"))


def _demo(model_dir, capsys, *extra):
    assert main(["demo", "--model", model_dir, "--prompts", "1", "--max-new-tokens", "6", *extra]) == 0
    return capsys.readouterr().out


def test_demo_says_the_default_drafter_is_grid_bound(snapped_dir, capsys):
    out = _demo(snapped_dir, capsys, "--draft", "self:int4+head8")
    assert "drafter self:int4+head8: a quantized copy of the verifier (int4:g32+head8); " \
           "relative weight error against the verifier 0.00% over 14 linear layers" in out
    assert "NOTE: its weights coincide with the verifier's storage grid" in out
    assert "not representative of a bf16 model" in out and "--draft eagle, self:int8 or prompt-lookup" in out


def test_demo_on_a_plain_model_is_not_grid_bound(plain_dir, capsys):
    out = _demo(plain_dir, capsys, "--draft", "self:int4+head8")
    line = next(l for l in out.splitlines() if l.startswith("drafter self:int4+head8:"))
    assert "0.00%" not in line.split("over")[0]
    assert "NOTE" not in out and "storage grid" not in out
    assert "acceptance reflects how far quantization moves the verifier's weights" in out


def test_demo_json_adds_drafter_keys_and_keeps_the_others(snapped_dir, capsys):
    data = json.loads(_demo(snapped_dir, capsys, "--json", "--draft", "self:int4+head8").strip().splitlines()[-1])
    assert set(data) == SUMMARY_KEYS | DRAFT_KEYS
    assert data["draft"] == "self:int4+head8" and data["prompts"] == 1
    assert data["draft_grid_bound"] is True and data["draft_weight_error"] <= 1e-6
    assert 0 < data["draft_head_weight_error"] < 0.05  # the head is int8, off the grid
    assert "storage grid" in data["draft_note"]


def test_demo_json_for_a_grid_free_drafter(snapped_dir, capsys):
    data = json.loads(_demo(snapped_dir, capsys, "--json", "--draft", "prompt-lookup").strip().splitlines()[-1])
    assert data["draft"] == "prompt-lookup"
    assert data["draft_grid_bound"] is None and data["draft_weight_error"] is None
    assert data["draft_description"].startswith("prompt-lookup: copies n-grams")


def test_demo_chooses_its_drafter_by_measuring_and_says_which(snapped_dir, capsys):
    data = json.loads(_demo(snapped_dir, capsys, "--json").strip().splitlines()[-1])
    choice = data["draft_choice"]
    assert data["draft"] == "auto" and data["identical"] == 1
    assert choice["chosen"] == choice["ranking"][0]["draft"] and choice["k"] == data["num_draft_tokens"]
    assert data["draft_description"].startswith(choice["chosen"] + ": ")  # the chosen drafter is described
    skipped = {s["draft"]: s["why"] for s in choice["skipped"]}
    assert skipped["self:int4+head8"].startswith("grid-bound")  # the demo's speedup is never a grid-bound one
    text = _demo(snapped_dir, capsys)
    assert "drafter auto chose, measuring on this machine: " in text


@pytest.mark.parametrize("tree", ["static", "dynamic", "auto"])
def test_demo_with_a_tree(plain_dir, capsys, tree):
    data = json.loads(_demo(plain_dir, capsys, "--json", "--draft", "self:int8", "--tree", tree).strip().splitlines()[-1])
    assert data["tree"]["mode"] == tree and data["identical"] == data["prompts"] == 1
    assert data["mean_tree_tokens"] > 0


def test_generate_json_with_a_tree_and_bad_tree_flags(plain_dir, capsys):
    argv = ["generate", "--model", plain_dir, "--prompt", "w1 w2 w3", "--max-new-tokens", "5", "--json"]
    assert main(argv + ["--draft", "prompt-lookup", "--tree", "dynamic"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["outputs"][0]
    assert out["tree"]["mode"] == "dynamic" and "mean_tree_tokens" in out
    with pytest.raises(SystemExit, match="--adaptive sizes chains"):
        main(argv + ["--tree", "auto", "--adaptive"])
    with pytest.raises(SystemExit):
        main(argv + ["--tree", "bushy"])


@pytest.mark.parametrize(
    "draft, start, grid_bound",
    [
        ("self:int4", "self:int4: a quantized copy of the verifier (int4:g32)", True),
        ("self:int8", "self:int8: a quantized copy of the verifier (int8)", False),
        ("composite", "composite: prompt lookup where the text repeats, else a quantized copy of the verifier (int8)",
         False),
        ("composite:int4+head8", "composite:int4+head8: prompt lookup where the text repeats", True),
        ("layer-skip:1", "layer-skip:1: the verifier's first 1 layers", None),
        ("/some/model", "/some/model: a separate draft model", None),
    ],
)
def test_drafter_summary(draft, start, grid_bound):
    s = drafter_summary(draft, grid_snapped_llama())
    assert s["description"].startswith(start) and s["grid_bound"] is grid_bound
    assert s["note"] and "\n" not in s["description"] + s["note"]


def test_demo_and_generate_compile_the_verifier_when_asked(plain_dir, capsys, tmp_path):
    """``--compile-verifier``: the verify passes are compiled before the timed generations; output stays identical."""
    data = json.loads(_demo(plain_dir, capsys, "--json", "--draft", "prompt-lookup", "--compile-verifier")
                      .strip().splitlines()[-1])
    assert data["compile_verifier"] is True and data["verifier_compile_seconds"] > 0 and data["identical"] == 1
    data = json.loads(_demo(plain_dir, capsys, "--json", "--draft", "prompt-lookup").strip().splitlines()[-1])
    assert data["compile_verifier"] is False and data["verifier_compile_seconds"] is None
    assert main(["generate", "--model", plain_dir, "--draft", "prompt-lookup", "--prompt", "hello",
                 "--max-new-tokens", "6", "--compile-verifier", "--json"]) == 0
    captured = capsys.readouterr()
    assert "compiling the verify passes" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["prompts"] == 1
