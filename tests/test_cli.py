"""The command line: JSON contracts on the real model, and clear errors for bad input."""

import json

import pytest

from specdec.cli import main


def _last_json(capsys) -> dict:
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


@pytest.mark.slow
def test_demo_json_contract(capsys):
    assert main(["demo", "--json", "--prompts", "2", "--max-new-tokens", "12"]) == 0
    data = _last_json(capsys)
    for key in ("prompts", "identical", "speedup", "acceptance_rate", "mean_accepted_length"):
        assert key in data
    assert data["prompts"] == 2 and isinstance(data["identical"], int)
    assert data["identical"] == 2
    assert data["speedup"] > 0 and 0 <= data["acceptance_rate"] <= 1
    assert data["mean_accepted_length"] >= 1
    # the default drafter is measured here and never grid-bound: int4 (g32) is the embedded Q4_1 model's own grid
    choice = data["draft_choice"]
    assert data["draft"] == "auto" and choice["chosen"] == choice["ranking"][0]["draft"]
    assert any(s["draft"] == "self:int4+head8" and s["why"].startswith("grid-bound") for s in choice["skipped"])
    assert data["draft_grid_bound"] is not True and "storage grid" not in data["draft_note"]


@pytest.mark.slow
def test_demo_says_when_its_drafter_is_grid_bound(capsys):
    """int4 in groups of 32 is the embedded GGUF's own grid: the demo must say its acceptance is not representative."""
    assert main(["demo", "--json", "--prompts", "1", "--max-new-tokens", "8", "--draft", "self:int4+head8"]) == 0
    data = _last_json(capsys)
    assert data["draft_grid_bound"] is True and data["draft_weight_error"] <= 1e-6
    assert "storage grid" in data["draft_note"] and "self:int8" in data["draft_note"]


@pytest.mark.slow
def test_generate_prompts_file_compare_json(tmp_path, capsys):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "Say hello."}) + "\n\n" + json.dumps({"turns": ["Name a fruit."], "category": "qa"}) + "\n")
    assert main(["generate", "--prompts", str(path), "--compare", "--json", "--max-new-tokens", "10", "-k", "3"]) == 0
    data = _last_json(capsys)
    assert data["prompts"] == 2 and data["identical"] == 2
    assert {"speedup", "acceptance_rate", "mean_accepted_length"} <= set(data)


def test_plan_json(capsys):
    main(["plan", "--model", "mistral-7b", "--batch", "4", "--context", "4096", "--dtype", "float16", "--json"])
    data = _last_json(capsys)
    assert data["kv_cache_bytes"] == 2 * 1024**3  # 8 KV heads, not 32


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate"], "exactly one of --prompt"),
        (["generate", "--prompt", "   "], "empty prompt"),
        (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
        (["demo", "--prompts", "0"], "--prompts must be"),
    ],
)
def test_bad_cli_input(argv, message):
    with pytest.raises(SystemExit, match=message):
        main(argv)


def test_bad_prompts_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "no prompt field"}) + "\n")
    with pytest.raises(SystemExit, match="no non-empty 'prompt'"):
        main(["generate", "--prompts", str(path)])
    with pytest.raises(SystemExit, match="no prompts"):
        (tmp_path / "empty.jsonl").write_text("\n")
        main(["generate", "--prompts", str(tmp_path / "empty.jsonl")])


def test_unknown_model_is_a_clear_error():
    from specdec.models import ModelNotFoundError, load_model

    with pytest.raises(ModelNotFoundError, match="never downloads"):
        load_model("meta-llama/Llama-3-8B")
