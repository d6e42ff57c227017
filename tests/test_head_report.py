"""Online drafting equals teacher forcing: each verify pass's first draft is the teacher-forced step-0 prediction
at that position, for chains and trees, batch 1 and ragged batches; and ``specdec head-report``."""

from __future__ import annotations

import json

import pytest
import torch

from specdec.cli import main
from specdec.heads import load_head, shipped_head
from specdec.training.report import first_draft_agreement, head_report
from test_eagle import _public_eagle3
from tiny_models import VOCAB, make_model


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lengths]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = make_model("llama")
    return model, load_head(_public_eagle3(tmp_path_factory.mktemp("head"), draft_vocab=60), model)


def _assert_agrees(result: dict) -> None:
    assert result["passes"] > 0
    assert result["mismatches"] == [], result["mismatches"][:5]
    assert result["equal"] + result["near_ties"] == result["passes"]
    assert result["near_ties"] <= max(1, result["passes"] // 20)  # float near-ties only: rare


@pytest.mark.parametrize("tree", [None, "static", "dynamic"])
@pytest.mark.parametrize("batch", [False, True], ids=["one-by-one", "ragged-batch"])
def test_first_draft_is_teacher_forced_step0_tiny(tiny, tree, batch):
    model, head = tiny
    _assert_agrees(first_draft_agreement(model, head, _prompts([4, 13, 8]), new_tokens=30, tree=tree, batch=batch))


def test_a_head_that_disagrees_is_caught(tiny):
    """Negative control: a recorder whose drafts are shifted by one position must show mismatches."""
    from specdec.training import report

    model, head = tiny
    run = report.online_run(model, head, _prompts([6, 9]), new_tokens=24)
    run["first"] = [(r, committed + 1, token) for r, committed, token in run["first"]
                    if committed + 1 < len(run["outputs"][r])]
    assert report.compare_first_drafts(model, head, run)["mismatches"]


def test_head_report_keys_and_ranges(tiny):
    model, head = tiny
    samples = [{"prompt_ids": p, "response_ids": model.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False,
                                                                 eos_token_id=None)[0, len(p):].tolist()}
               for p in _prompts([5, 9])]
    report = head_report(model, head, samples, steps=3, k=4)
    assert len(report["teacher_forced"]) == 3 and len(report["teacher_forced_in_vocab"]) == 3
    assert 0 <= report["coverage"] <= 1 and 1 <= report["mean_accepted_length"] <= 5
    assert len(report["online_by_position"]) == 4
    assert all(0 <= x <= 1 for x in report["teacher_forced"] + report["online_by_position"])
    assert report["first_draft"]["mismatches"] == 0
    # the online loop's output is the verifier's greedy response, so first-draft acceptance is teacher forcing there
    assert report["online_acceptance_by_position"][0] == pytest.approx(report["first_draft"]["accepted_at_pass_starts"])


@pytest.mark.slow
@pytest.mark.parametrize("tree,batch", [(None, False), (None, True), ("dynamic", False), ("static", True)])
def test_first_draft_is_teacher_forced_step0_real_model(smollm2, tree, batch):
    model, tokenizer = smollm2
    head = load_head(shipped_head(model), model)
    texts = ["Write a haiku about autumn rain.", "What is the capital of Australia? Explain briefly.",
             "List three uses of a paperclip."]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"] for t in texts]
    result = first_draft_agreement(model, head, prompts, new_tokens=24, tree=tree, batch=batch,
                                   pad_token_id=tokenizer.pad_token_id or 0)
    _assert_agrees(result)


# -- the command: every error before any model loads ---------------------------------------------------------------

@pytest.fixture
def no_model(monkeypatch):
    import specdec.models

    def refuse(*_, **__):
        raise AssertionError("the model must not load for a bad argument")

    monkeypatch.setattr(specdec.models, "load_model", refuse)


@pytest.mark.parametrize("content,needle", [
    (None, "does not exist"),
    ("{not json\n", "not valid JSON"),
    ("[1, 2]\n", "expected a JSON object"),
    ('{"id": 1}\n', "needs prompt_ids + response_ids"),
    ('{"prompt_ids": [], "response_ids": [3]}\n', "non-empty lists of token ids"),
    ('{"prompt_ids": [1], "response_ids": [-3]}\n', "non-empty lists of token ids"),
    ("\n\n", "no rows"),
])
def test_bad_data_fails_before_the_model_loads(tmp_path, capsys, no_model, content, needle):
    path = tmp_path / "data.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["head-report", "--data", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_invalid_utf8_and_bad_options_fail_before_the_model_loads(tmp_path, capsys, no_model):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b'{"prompt": "caf\xe9"}\n')
    assert main(["head-report", "--data", str(data)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    data.write_text(json.dumps({"prompt": "hello"}) + "\n")
    for argv, needle in ((["--steps", "0"], "--steps"), (["--head", str(tmp_path / "missing")], "no such directory"),
                         (["--tree", "bushy"], "--tree"), (["-k", "0"], "--num-draft-tokens")):
        assert main(["head-report", "--data", str(data), *argv]) == 2
        assert needle in capsys.readouterr().err


def test_head_report_command_end_to_end(tmp_path, capsys):
    """``specdec head-report --json`` on a local tiny verifier and head: verifier responses and prompt rows alike."""
    from tiny_models import char_tokenizer

    model = make_model("llama")
    model.save_pretrained(tmp_path / "m")
    char_tokenizer().save_pretrained(tmp_path / "m")
    head = _public_eagle3(tmp_path / "head", draft_vocab=60)
    prompt = _prompts([6])[0]
    response = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None)[0, 6:]
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt_ids": prompt, "response_ids": response.tolist()}) + "\n"
                    + json.dumps({"prompt": "Tell me about cats."}) + "\n")
    assert main(["head-report", "--model", str(tmp_path / "m"), "--head", str(head), "--data", str(data),
                 "--max-new-tokens", "10", "--steps", "2", "-k", "3", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"teacher_forced", "coverage", "online_by_position", "mean_accepted_length"} <= set(report)
    assert report["samples"] == 2 and len(report["teacher_forced"]) == 2 and report["first_draft"]["mismatches"] == 0
