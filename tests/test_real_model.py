"""The embedded SmolLM2-135M-Instruct (Llama, GQA 9/3 heads): exactness with its int8 self-drafter, pipelines, stop strings."""

import pytest
import torch
from transformers import pipeline

import specdec
from specdec.eval.side_by_side import BUILTIN_PROMPTS, encode_prompt

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spec(smollm2):
    model, tokenizer = smollm2
    return specdec.SpeculativeModel(model, "self:int8", num_draft_tokens=4, tokenizer=tokenizer)


@pytest.mark.parametrize("item", BUILTIN_PROMPTS[:3], ids=lambda item: item["task"])
def test_greedy_identical_to_generate(smollm2, spec, item):
    model, tokenizer = smollm2
    ids = encode_prompt(tokenizer, item["prompt"])
    kwargs = dict(max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    expected = model.generate(ids, **kwargs)
    got = spec.generate(ids, **kwargs)
    assert torch.equal(got, expected)
    assert spec.last_stats.acceptance_rate > 0.3  # a quantized copy of the verifier agrees most of the time


def test_patched_pipeline_matches_plain_pipeline(smollm2):
    model, tokenizer = smollm2
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    messages = [{"role": "user", "content": "Name two planets."}]
    plain = pipe(messages, max_new_tokens=24, do_sample=False)
    wrapper = specdec.patch(model, "self:int8", tokenizer=tokenizer)
    try:
        fast = pipe(messages, max_new_tokens=24, do_sample=False)
    finally:
        specdec.unpatch(model)
    assert fast == plain
    assert wrapper.last_stats is not None and wrapper.last_stats.proposed > 0


def test_stop_strings(smollm2, spec):
    model, tokenizer = smollm2
    ids = encode_prompt(tokenizer, "List five colours.")
    base = dict(max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    free = tokenizer.decode(model.generate(ids, **base)[0, ids.shape[1]:], skip_special_tokens=True)
    stop = free.split()[5]  # a word from the middle of the free-running answer
    kwargs = dict(base, stop_strings=[stop], tokenizer=tokenizer)
    expected = model.generate(ids, **kwargs)
    got = spec.generate(ids, **kwargs)
    assert torch.equal(got, expected)
    assert tokenizer.decode(got[0, ids.shape[1]:]).endswith(stop) or stop in tokenizer.decode(got[0, -3:])


def test_sampling_runs_and_is_reproducible(smollm2, spec):
    model, tokenizer = smollm2
    ids = encode_prompt(tokenizer, "Tell me a fun fact.")
    kwargs = dict(max_new_tokens=24, do_sample=True, temperature=0.8, top_p=0.95, pad_token_id=tokenizer.eos_token_id)
    a = spec.generate(ids, generator=torch.Generator().manual_seed(3), **kwargs)
    b = spec.generate(ids, generator=torch.Generator().manual_seed(3), **kwargs)
    assert torch.equal(a, b)


def test_ragged_batch_rows_equal_single_row_generate(smollm2, spec):
    """Prompts of very different lengths, left padded into one batch: each row is what the model gives it alone."""
    model, tokenizer = smollm2
    prompts = [encode_prompt(tokenizer, item["prompt"])[0] for item in BUILTIN_PROMPTS[:4]]
    assert max(map(len, prompts)) > 2 * min(map(len, prompts))
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.eos_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
    kwargs = dict(max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    got = spec.generate(ids, attention_mask=mask, **kwargs)
    for r, p in enumerate(prompts):
        alone = model.generate(p.unsqueeze(0), **kwargs)[0, len(p):]
        row = got[r, width: width + len(alone)]
        assert torch.equal(row, alone), f"row {r}"
        assert (got[r, width + len(alone):] == tokenizer.eos_token_id).all()  # padded after its EOS, as generate does
    assert len(spec.last_stats.rows) == len(prompts)


def test_gguf_tokenizer_ends_and_pads_with_the_generation_eos(smollm2):
    """transformers <= 5.17 built this GGUF's tokenizer with eos <|im_start|> and no pad token; load_model aligns
    it with the generation config (what later versions read), so padding and train-head's verifier identity do
    not depend on the transformers version."""
    import copy
    import types

    from specdec.models import align_special_tokens

    model, tokenizer = smollm2
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id == 2 and tokenizer.pad_token == "<|im_end|>"
    old = copy.deepcopy(tokenizer)
    old.eos_token, old.pad_token = "<|im_start|>", None  # as 5.17 built it
    align_special_tokens(types.SimpleNamespace(generation_config=model.generation_config), old)
    assert (old.eos_token, old.eos_token_id, old.pad_token, old.pad_token_id) == ("<|im_end|>", 2, "<|im_end|>", 2)
