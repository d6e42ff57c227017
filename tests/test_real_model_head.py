"""The head shipped for the embedded SmolLM2-135M-Instruct: it loads by name, drafts well, and never
changes the output (batch 1 and a ragged batch of 3), greedy and sampled."""

import json

import pytest
import torch

import specdec
from specdec.eval.side_by_side import BUILTIN_PROMPTS, encode_prompt
from specdec.heads import shipped_head, shipped_heads
from specdec.prompts import encode_batch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spec(smollm2):
    model, tokenizer = smollm2
    return specdec.SpeculativeModel(model, "eagle", num_draft_tokens=5, tokenizer=tokenizer)


def test_shipped_head_is_small_and_documented(smollm2):
    model, _ = smollm2
    directory = shipped_head(model)
    assert directory in shipped_heads()
    size = sum(p.stat().st_size for p in directory.iterdir())
    # bf16; its 16k-token draft vocabulary (98% held-out coverage) is 19 MB of the 29 (the working tree that travels
    # to a lent GPU is capped at 64 MiB)
    assert size <= 32 * 2**20, f"{size} bytes"
    card = (directory / "README.md").read_text()
    for needed in ("license", "Spec-Bench", "specdec train-head", "acceptance"):
        assert needed in card
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]


@pytest.mark.parametrize("item", BUILTIN_PROMPTS[:3], ids=lambda item: item["task"])
def test_greedy_identical_with_the_shipped_head(smollm2, spec, item):
    model, tokenizer = smollm2
    ids = encode_prompt(tokenizer, item["prompt"])
    kwargs = dict(max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.mean_accepted_length > 1.15  # a trained head (a random one stays near 1.0)


def test_ragged_batch_of_three_with_the_shipped_head(smollm2, spec):
    model, tokenizer = smollm2
    ids, mask = encode_batch(tokenizer, [item["prompt"] for item in BUILTIN_PROMPTS[:3]])
    assert (mask == 0).any()  # ragged: left padding
    kwargs = dict(max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert torch.equal(spec.generate(ids, attention_mask=mask, **kwargs), model.generate(ids, attention_mask=mask, **kwargs))


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_trees_with_the_shipped_head_are_exact_and_accept_more(smollm2, spec, tree):
    """Greedy identity with tree drafts at batch 1 (2 prompts) and a ragged batch of 3; trees commit more
    tokens per pass than the chain of the same head."""
    model, tokenizer = smollm2
    trees = specdec.SpeculativeModel(model, "eagle", tokenizer=tokenizer, tree=tree)
    kwargs = dict(max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    chain_len = tree_len = 0.0
    for item in BUILTIN_PROMPTS[:2]:
        ids = encode_prompt(tokenizer, item["prompt"])
        ref = model.generate(ids, **kwargs)
        assert torch.equal(trees.generate(ids, **kwargs), ref)
        assert torch.equal(spec.generate(ids, **kwargs), ref)
        chain_len += spec.last_stats.mean_accepted_length
        tree_len += trees.last_stats.mean_accepted_length
    assert tree_len > chain_len
    ids, mask = encode_batch(tokenizer, [item["prompt"] for item in BUILTIN_PROMPTS[:3]])
    kwargs["max_new_tokens"] = 24
    assert torch.equal(trees.generate(ids, attention_mask=mask, **kwargs), model.generate(ids, attention_mask=mask, **kwargs))


def test_sampling_with_the_shipped_head_is_reproducible(smollm2, spec):
    _, tokenizer = smollm2
    ids = encode_prompt(tokenizer, BUILTIN_PROMPTS[0]["prompt"])
    kwargs = dict(max_new_tokens=24, do_sample=True, temperature=0.7, pad_token_id=tokenizer.eos_token_id)
    a = spec.generate(ids, generator=torch.Generator().manual_seed(5), **kwargs)
    b = spec.generate(ids, generator=torch.Generator().manual_seed(5), **kwargs)
    assert torch.equal(a, b) and spec.last_stats.accepted > 0


def test_train_head_pipeline_end_to_end_with_the_real_tokenizer(smollm2, tmp_path):
    """Every stage of train-head on a tiny verifier sharing SmolLM2's tokenizer: prompt files with licenses,
    verifier-written prompts, a given response, features, training, the saved head and the contract keys;
    a rerun resumes every stage instead of redoing it."""
    import transformers as tf

    from specdec.training.pipeline import PipelineConfig, run_pipeline
    from specdec.training.train import TrainConfig

    _, tokenizer = smollm2
    torch.manual_seed(0)
    tiny = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)).eval()
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"id": f"m{i}", "group": "math", "prompt": f"What is {i} plus {i}?"} for i in range(4)]
    rows += [{"id": "c0", "group": "chat", "prompt": "Say hello.", "response": "Hello there, friend."}]
    (data / "mix.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "README.md").write_text("| file | rows | source | license |\n|---|---|---|---|\n| mix.jsonl | 5 | made up | CC0 |\n")
    config = PipelineConfig(per_group=3, self_prompts=2, max_new_tokens=8, gen_batch=4, heldout=0.2, eval_prompts=1,
                            eval_new_tokens=8, train=TrainConfig(draft_vocab=64, epochs=1, batch_tokens=256, warmup=1))
    result = run_pipeline(tiny, tokenizer, data, tmp_path / "head", config, model_name="tiny", progress=False,
                          log=lambda m: None)
    assert set(result) == {"out", "samples", "tokens", "steps", "seconds", "heldout_acceptance", "mean_accepted_length"}
    assert 3 + 1 <= result["samples"] <= 3 + 1 + 2 and result["steps"] >= 1 and 0 <= result["heldout_acceptance"] <= 1
    samples = [json.loads(line) for line in (tmp_path / "head" / "work" / "samples.jsonl").read_text().splitlines()]
    given = next(s for s in samples if s["id"] == "c0")
    assert tokenizer.decode(given["response_ids"], skip_special_tokens=True) == "Hello there, friend."
    assert "CC0" in {s.get("license") for s in samples}
    card = (tmp_path / "head" / "README.md").read_text()
    assert "CC0" in card and "made up" in card
    again = run_pipeline(tiny, tokenizer, data, tmp_path / "head", config, model_name="tiny", progress=False,
                         log=lambda m: None)
    assert again["samples"] == result["samples"] and again["steps"] == result["steps"]
    head = specdec.SpeculativeModel(tiny, f"eagle:{tmp_path / 'head'}")
    ids = torch.tensor([tokenizer("Hi")["input_ids"]])
    assert torch.equal(head.generate(ids, max_new_tokens=6, do_sample=False),
                       tiny.generate(ids, max_new_tokens=6, do_sample=False))
