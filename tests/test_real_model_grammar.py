"""The embedded SmolLM2 under an xgrammar JSON schema: every drafter kind, chains and trees, one row and a ragged
batch, token-identical to ``model.generate`` with the same processor; the outputs parse and follow the schema."""

import json

import pytest
import torch
from transformers import LogitsProcessorList

import specdec

xgr = pytest.importorskip("xgrammar")
pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PASSAGES = ["Maria Lopez is 34 and lives in Valencia.", "Our new colleague, Tom Becker (51), moved from Hamburg."]


@pytest.fixture(scope="module")
def setting(smollm2):
    model, tokenizer = smollm2
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=model.config.vocab_size)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Extract name, age and city as JSON: {p}"}],
                                           add_generation_prompt=True, tokenize=False) for p in PASSAGES]
    tokenizer.padding_side = "left"
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    make = lambda: LogitsProcessorList([xgr.contrib.hf.LogitsProcessor(compiled)])  # noqa: E731
    kwargs = dict(max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    expected = {1: model.generate(batch.input_ids[:1, batch.attention_mask[0].argmax():], logits_processor=make(),
                                  **kwargs)}
    expected[2] = model.generate(**batch, logits_processor=make(), **kwargs)
    one = batch.input_ids[:1, batch.attention_mask[0].argmax():]
    return model, tokenizer, make, kwargs, {1: (one, None), 2: (batch.input_ids, batch.attention_mask)}, expected


@pytest.mark.parametrize("draft,tree,rows", [("self:int8", None, 2), ("prompt-lookup", None, 1),
                                             ("composite:int8", None, 1), ("eagle", None, 2),
                                             ("eagle", "dynamic", 1), ("composite:int8", "static", 2)])
def test_json_schema_output_is_generate_s(setting, draft, tree, rows):
    model, tokenizer, make, kwargs, inputs, expected = setting
    ids, mask = inputs[rows]
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tokenizer=tokenizer, tree=tree)
    got = spec.generate(ids, attention_mask=mask, logits_processor=make(), **kwargs)
    assert torch.equal(got, expected[rows])
    for row in got[:, ids.shape[1]:]:
        record = json.loads(tokenizer.decode(row, skip_special_tokens=True))
        assert set(record) == {"name", "age", "city"} and isinstance(record["age"], int)
    if tree is None:
        assert spec.last_stats.drafter_stats["grammar_forced_tokens"] > 0  # the keys are forced text
