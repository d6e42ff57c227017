"""``composite:eagle[:DIR]``: prompt lookup where the text repeats, a draft head otherwise; exact as every drafter."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.draft_spec import DraftSpecError, parse_draft
from specdec.drafters import CompositeDrafter
from specdec.drafters.eagle import EagleDrafter
from test_eagle import _public_eagle3
from tiny_models import VOCAB, make_model


def test_parse():
    spec = parse_draft("composite:eagle")
    assert (spec.kind, spec.inner, spec.head, spec.scheme) == ("composite", "eagle", None, None)
    assert parse_draft("composite:eagle:./h").head == "./h"
    assert parse_draft("composite:int8").inner is None
    with pytest.raises(DraftSpecError, match="head directory"):
        parse_draft("composite:eagle:")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = make_model("llama")
    return model, _public_eagle3(tmp_path_factory.mktemp("head"), draft_vocab=VOCAB)


def _repetitive(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts that repeat themselves, so the lookup drafts in some passes and the head in others."""
    gen = torch.Generator().manual_seed(5)
    rows = [torch.randint(3, VOCAB, (n,), generator=gen).repeat(3) for n in (4, 7, 5)[:batch]]
    width = max(len(r) for r in rows)
    ids, mask = torch.zeros(batch, width, dtype=torch.long), torch.zeros(batch, width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, width - len(r):], mask[b, width - len(r):] = r, 1
    return ids, mask


@pytest.mark.parametrize("tree", [None, "dynamic"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_identical_and_both_parts_draft(tiny, tree, batch):
    model, head = tiny
    spec = specdec.SpeculativeModel(model, f"composite:eagle:{head}", num_draft_tokens=4, tree=tree)
    assert isinstance(spec.drafter, CompositeDrafter) and isinstance(spec.drafter.model_drafter, EagleDrafter)
    ids, mask = _repetitive(batch)
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    stats = spec.last_stats.drafter_stats
    assert stats["lookup_steps"] > 0 and stats["model_steps"] > 0, stats  # trees too: the head rests where text repeats


def test_sampling_runs_with_the_head_behind_the_lookup(tiny):
    model, head = tiny
    ids, mask = _repetitive(2)
    out = specdec.SpeculativeModel(model, f"composite:eagle:{head}", num_draft_tokens=4).generate(
        ids, attention_mask=mask, max_new_tokens=20, do_sample=True, eos_token_id=None, pad_token_id=0,
        generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, ids.shape[1] + 20)


@pytest.mark.slow
def test_real_model_with_the_shipped_head(smollm2):
    model, tokenizer = smollm2
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Repeat this list twice: apples, pears, plums."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    kwargs = dict(max_new_tokens=32, do_sample=False)
    spec = specdec.SpeculativeModel(model, "composite:eagle", num_draft_tokens=5)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
