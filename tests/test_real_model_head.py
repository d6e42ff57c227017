"""The head shipped for the embedded SmolLM2-135M-Instruct: it loads by name, drafts well, and never
changes the output (batch 1 and a ragged batch of 3), greedy and sampled."""

import json

import pytest
import torch

import specdec
from specdec.eval.side_by_side import BUILTIN_PROMPTS, encode_prompt
from specdec.heads import shipped_head, shipped_heads

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
    assert size <= 25 * 2**20, f"{size} bytes"
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
    assert spec.last_stats.mean_accepted_length > 1.5  # a trained head, not a random one


def test_ragged_batch_of_three_with_the_shipped_head(smollm2, spec):
    model, tokenizer = smollm2
    prompts = [encode_prompt(tokenizer, item["prompt"])[0] for item in BUILTIN_PROMPTS[:3]]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.eos_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
    kwargs = dict(max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    assert torch.equal(spec.generate(ids, attention_mask=mask, **kwargs), model.generate(ids, attention_mask=mask, **kwargs))


def test_sampling_with_the_shipped_head_is_reproducible(smollm2, spec):
    _, tokenizer = smollm2
    ids = encode_prompt(tokenizer, BUILTIN_PROMPTS[0]["prompt"])
    kwargs = dict(max_new_tokens=24, do_sample=True, temperature=0.7, pad_token_id=tokenizer.eos_token_id)
    a = spec.generate(ids, generator=torch.Generator().manual_seed(5), **kwargs)
    b = spec.generate(ids, generator=torch.Generator().manual_seed(5), **kwargs)
    assert torch.equal(a, b) and spec.last_stats.accepted > 0
