"""Head training data at scale (issue 24): self-instruct prompts of every task type, sampled responses, a
faster writer dtype, and data-only runs that stop after a stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdec.training.distill import SAMPLE_TEMPERATURES, sampled_share
from specdec.training.pipeline import data_writer
from specdec.training.self_instruct import TASKS, build_prompt, dedupe, normalise, self_instruct_requests
from tiny_models import char_tokenizer, make_model


def test_requests_cover_every_task_type_and_are_reproducible():
    requests = self_instruct_requests(3 * len(TASKS), seed=1)
    assert {r["group"] for r in requests} == {t.group for t in TASKS} >= {
        "summarization", "translation", "qa", "math", "code", "extraction", "chat"}
    assert requests == self_instruct_requests(3 * len(TASKS), seed=1)
    assert requests != self_instruct_requests(3 * len(TASKS), seed=2)
    assert len({r["id"] for r in requests}) == len(requests)


def test_build_prompt_wraps_the_answer_and_drops_empty_or_runaway_ones():
    request = next(r for r in self_instruct_requests(len(TASKS)) if r["template"].startswith("Read the passage"))
    prompt = build_prompt(request, "  Bees make honey from nectar.  ")
    assert "Passage: Bees make honey from nectar." in prompt and request["question"] in prompt
    assert build_prompt(request, "ok") is None and build_prompt(request, "x" * 5000) is None


def test_dedupe_ignores_case_spaces_and_punctuation():
    pairs = [("a", "What is a bee?"), ("b", "what is a  bee"), ("c", "What is a wasp?")]
    assert [pid for pid, _ in dedupe(pairs)] == ["a", "c"]
    assert normalise("Hello,   World!") == "hello world"


def test_sampled_share_is_a_fixed_share_of_ids():
    ids = [f"p{i}" for i in range(4000)]
    chosen = [i for i in ids if sampled_share(i, 0.25)]
    assert 0.2 < len(chosen) / len(ids) < 0.3
    assert chosen == [i for i in ids if sampled_share(i, 0.25)]
    assert not any(sampled_share(i, 0.0) for i in ids)


def test_data_writer_is_a_copy_in_the_asked_dtype():
    model = make_model("llama")
    assert data_writer(model, None) is model and data_writer(model, "float32") is model
    writer = data_writer(model, "bfloat16")
    assert next(writer.parameters()).dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # the verifier itself is untouched


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("head_data")
    make_model("llama").save_pretrained(root / "m")
    char_tokenizer().save_pretrained(root / "m")
    rows = [{"id": f"p{i}", "group": "g", "prompt": f"Tell me about {i} cats."} for i in range(12)]
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _train(tiny: Path, out: Path, *extra: str) -> int:
    from specdec.cli import main

    return main(["train-head", "--model", str(tiny / "m"), "--data", str(tiny / "data.jsonl"), "--out", str(out),
                 "--max-new-tokens", "6", "--gen-batch", "4", "--epochs", "1", "--draft-vocab", "32",
                 "--batch-tokens", "256", "--eval-prompts", "1", "--heldout", "0.25", "--json", *extra])


def test_data_only_run_with_self_prompts_and_sampled_responses(tiny, tmp_path, capsys):
    out = tmp_path / "head"
    assert _train(tiny, out, "--self-prompts", "14", "--sampled", "0.5", "--gen-dtype", "bfloat16",
                  "--stop-after", "data") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["stopped_after"] == "data" and result["steps"] == 0 and result["heldout_acceptance"] is None
    assert not (out / "model.safetensors").exists() and not (out / "work" / "features").exists()
    samples = [json.loads(line) for line in (out / "work" / "samples.jsonl").read_text().splitlines()]
    sampled = [s for s in samples if "@t" in s["id"]]
    assert sampled and all(s["temperature"] in SAMPLE_TEMPERATURES for s in sampled)
    assert all(s["id"].split("@")[0] in {x["id"] for x in samples} for s in sampled)  # beside a greedy response
    settings = json.loads((out / "work" / "settings.json").read_text())["stages"]
    assert settings["samples"]["gen_dtype"] == "bfloat16" and settings["samples"]["sampled"] == 0.5
    # the same run goes on to the features; another --sampled share is refused in one line
    assert _train(tiny, out, "--self-prompts", "14", "--sampled", "0.5", "--gen-dtype", "bfloat16",
                  "--feature-dtype", "bfloat16", "--stop-after", "features") == 0
    assert (out / "work" / "features").is_dir()
    settings = json.loads((out / "work" / "settings.json").read_text())["stages"]
    assert settings["features"]["feature_dtype"] == "bfloat16"
    _check_features_from(tiny, out, torch.bfloat16)
    capsys.readouterr()
    # features made by a bf16 copy are not resumed as the verifier's own
    assert _train(tiny, out, "--self-prompts", "14", "--sampled", "0.5", "--gen-dtype", "bfloat16",
                  "--stop-after", "features") == 2
    assert "--feature-dtype bfloat16, not as loaded" in capsys.readouterr().err
    assert _train(tiny, out, "--self-prompts", "14", "--sampled", "0.25", "--gen-dtype", "bfloat16") == 2
    assert "--sampled 0.5, not 0.25" in capsys.readouterr().err


def _check_features_from(tiny: Path, out: Path, dtype: torch.dtype) -> None:
    """The first cached sample's features are those of a ``dtype`` copy of the verifier, not of the fp32 one."""
    from specdec.models import load_model
    from specdec.training.features import FeatureSet, verifier_features

    model, _ = load_model(str(tiny / "m"))
    features = FeatureSet(sorted((out / "work" / "features").glob("features-*.safetensors")))
    layers = tuple(json.loads((out / "work" / "features" / "index.json").read_text())["layers"])
    sample = features[0]
    ids = sample["input_ids"][None]
    copy_final = verifier_features(model.to(dtype), ids, None, layers)[1][0].to(torch.bfloat16)
    own_final = verifier_features(model.float(), ids, None, layers)[1][0].to(torch.bfloat16)
    # batched with padding, a bf16 pass rounds a little differently from this one-row pass: nearest, not equal
    to_copy, to_own = ((sample["final"].float() - x.float()).norm().item() for x in (copy_final, own_final))
    assert to_copy < 0.5 * to_own


def test_feature_set_reads_memory_mapped_shards_exactly(tmp_path):
    """Features are read from the shards when asked for (millions of tokens need no memory of their own),
    and each sample reads back exactly what was written."""
    from safetensors.torch import load_file

    from specdec.training.features import FeatureSet, extract_features

    model = make_model("llama")
    gen = torch.Generator().manual_seed(0)
    samples = [{"id": f"s{i}", "prompt_ids": torch.randint(3, 90, (4 + i,), generator=gen).tolist(),
                "response_ids": torch.randint(3, 90, (6,), generator=gen).tolist()} for i in range(7)]
    paths = extract_features(model, samples, tmp_path / "features", (1, 2), shard_samples=3, progress=False)
    features = FeatureSet(paths)
    assert len(features) == 7 and len(paths) == 3
    for i in range(7):
        shard = load_file(str(paths[i // 3]), device="cpu")
        a, b = shard["offsets"][i % 3].item(), shard["offsets"][i % 3 + 1].item()
        got = features[i]
        for key in ("input_ids", "hidden", "final", "top"):
            assert torch.equal(got[key], shard[key][a:b]), key
        assert got["prompt_length"] == len(samples[i]["prompt_ids"]) == features.small(i)["prompt_length"]



def test_feature_extraction_makes_its_model_only_for_a_missing_shard(tmp_path):
    """``extract_features`` given a factory (the bf16 copy of ``--feature-dtype``) calls it only when a shard
    must be computed: a resume that finds every shard builds no copy, one that lacks a shard builds one."""
    from specdec.training.features import extract_features

    model = make_model("llama")
    gen = torch.Generator().manual_seed(0)
    samples = [{"id": f"s{i}", "prompt_ids": torch.randint(3, 90, (5,), generator=gen).tolist(),
                "response_ids": torch.randint(3, 90, (4,), generator=gen).tolist()} for i in range(4)]
    calls = []

    def factory():
        calls.append(1)
        return model

    paths = extract_features(factory, samples, tmp_path / "f", (1, 2), shard_samples=2, progress=False)
    assert len(calls) == 1 and all(p.is_file() for p in paths)
    again = extract_features(factory, samples, tmp_path / "f", (1, 2), shard_samples=2, progress=False)
    assert again == paths and len(calls) == 1  # every shard there: no model made
    paths[1].unlink()
    extract_features(factory, samples, tmp_path / "f", (1, 2), shard_samples=2, progress=False)
    assert len(calls) == 2 and paths[1].is_file()

def test_training_validates_every_epoch_keeps_the_best_and_stops_early(tiny, tmp_path, capsys):
    """A held-out split the head never trains on is scored every epoch; the best head is the one saved."""
    out = tmp_path / "head"
    assert _train(tiny, out, "--self-prompts", "0", "--epochs", "6", "--lr", "0.05", "--patience", "1",
                  "--noise", "0.1", "--max-new-tokens", "12") == 0
    record = json.loads((out / "training.json").read_text())
    validation, best = record["validation"], record["best_validation"]
    assert validation and best in validation
    assert best["tokens_per_pass"] == max(v["tokens_per_pass"] for v in validation)
    assert all(len(v["top1"]) == 3 and 0 <= v["coverage"] <= 1 for v in validation)
    if record["stopped_early"]:  # patience 1: stopped right after the first epoch that was not better
        assert validation[-1]["epoch"] - best["epoch"] == 1 and validation[-1]["tokens_per_pass"] <= best["tokens_per_pass"]
    else:
        assert len(validation) == 6
    from safetensors.torch import load_file

    saved, kept = load_file(str(out / "model.safetensors")), load_file(str(out / "checkpoints" / "best" / "model.safetensors"))
    assert torch.equal(saved["fc.weight"], kept["fc.weight"].to(saved["fc.weight"].dtype))  # the best head is the one saved
    # a rerun resumes a finished (or stopped) run without training again
    capsys.readouterr()
    assert _train(tiny, out, "--self-prompts", "0", "--epochs", "6", "--lr", "0.05", "--patience", "1",
                  "--noise", "0.1", "--max-new-tokens", "12") == 0
    assert json.loads((out / "training.json").read_text())["best_validation"] == best


def test_heldout_split_keeps_a_prompts_responses_together():
    from specdec.training.prompts import heldout_split

    ids = [f"p{i}" for i in range(400)] + [f"p{i}@t0.7" for i in range(0, 400, 3)]
    held, train = heldout_split(ids, 0.1)
    assert sorted(held + train) == list(range(len(ids))) and not set(held) & set(train)
    held_prompts = {ids[i].split("@")[0] for i in held}
    assert not held_prompts & {ids[i].split("@")[0] for i in train}
    assert 20 <= len(held_prompts) <= 60  # about a tenth of 400 prompts
    # a prompt's side never changes as data grows
    more, _ = heldout_split(ids + [f"q{i}" for i in range(100)], 0.1)
    assert {ids[i] for i in held} <= {(ids + [f"q{i}" for i in range(100)])[i] for i in more}


def test_heldout_split_small_sets_keep_both_sides():
    from specdec.training.prompts import heldout_split

    for n in (2, 3, 5):
        held, train = heldout_split([f"x{i}" for i in range(n)], 0.03)
        assert held and train
    held, train = heldout_split(["a", "b"], 0.99)
    assert len(held) == 1 and len(train) == 1
    held, train = heldout_split(["a", "a@t0.7", "a@t1.0"], 0.5)
    assert held and train


def test_features_in_length_sorted_batches_keep_each_samples_own(tmp_path):
    """Batches group samples of similar length, yet every sample's stored features are its own (as a forward
    of that sample alone gives them) and in the samples' order."""
    from specdec.training.features import FeatureSet, extract_features, verifier_features

    model = make_model("llama")
    gen = torch.Generator().manual_seed(1)
    lengths = [9, 3, 14, 5, 11, 2, 7]  # out of order, so sorting moves them
    samples = [{"id": f"s{i}", "prompt_ids": torch.randint(3, 90, (3,), generator=gen).tolist(),
                "response_ids": torch.randint(3, 90, (n,), generator=gen).tolist()} for i, n in enumerate(lengths)]
    features = FeatureSet(extract_features(model, samples, tmp_path / "f", (1, 2), shard_samples=4, batch_size=3,
                                           progress=False))
    for i, s in enumerate(samples):
        ids = torch.tensor([s["prompt_ids"] + s["response_ids"]])
        with torch.no_grad():
            hidden, final, top = verifier_features(model, ids, None, (1, 2))
        got = features[i]
        assert got["input_ids"].tolist() == ids[0].tolist()
        torch.testing.assert_close(got["hidden"].float(), hidden[0].to(got["hidden"].dtype).float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got["final"].float(), final[0].to(got["final"].dtype).float(), atol=2e-2, rtol=2e-2)
        assert got["top"].tolist() == top[0].tolist()
