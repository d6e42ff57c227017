"""A drafter whose tokenizer differs from the verifier's (specdec.drafters.cross_vocab): drafts go through text, so
greedy output is the verifier's at batch 1 and ragged, for any vocabulary pair. Here the drafter is the verifier with
its character ids permuted (its embedding and head rows moved with them): the same model in another vocabulary."""

from __future__ import annotations

import string

import pytest
import torch
from tiny_models import VOCAB, char_tokenizer, make_model

import specdec
from specdec.drafters.cross_vocab import CrossVocabDrafter
from specdec.drafters.model import VocabularyMismatchError


def _permuted(model: torch.nn.Module) -> tuple[torch.nn.Module, object]:
    """``model`` and its character tokenizer with every character's id reversed among the characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = char_tokenizer().get_vocab()
    chars = [c for c in string.ascii_letters + string.digits + " .,?!'-:;()" if c in base]
    ids = [base[c] for c in chars]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **dict(zip(chars, reversed(ids)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>")
    order = list(range(VOCAB))  # draft id -> verifier id
    for c in chars:
        order[vocab[c]] = base[c]
    draft = make_model("llama")
    draft.load_state_dict(model.state_dict())
    with torch.no_grad():
        for weight in {id(w): w for w in (draft.get_input_embeddings().weight,
                                          draft.get_output_embeddings().weight)}.values():
            weight.copy_(weight[order])
    return draft, tokenizer


@pytest.fixture(scope="module")
def pair():
    model, tokenizer = make_model("llama"), char_tokenizer()
    return model, tokenizer, *_permuted(model)


def test_another_vocabulary_drafts_by_text_and_greedy_is_generate(pair):
    model, tokenizer, draft, draft_tokenizer = pair
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=3, tokenizer=tokenizer,
                                    draft_tokenizer=draft_tokenizer)
    assert isinstance(spec.drafter, CrossVocabDrafter)
    ids = tokenizer("the cat sat on the mat, the cat", return_tensors="pt").input_ids
    kwargs = dict(max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.proposed > 0
    tokenizer.padding_side = "left"
    batch = tokenizer(["the cat sat", "a dog ran on the hill"], return_tensors="pt", padding=True)
    kwargs = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(spec.generate(**batch, **kwargs), model.generate(**batch, **kwargs))


def test_without_both_tokenizers_the_mismatch_says_how(pair):
    model, _, draft, _ = pair
    draft.config.bos_token_id = 7  # what a model of another family declares
    try:
        with pytest.raises(VocabularyMismatchError, match="draft_tokenizer="):
            specdec.SpeculativeModel(model, draft)
    finally:
        draft.config.bos_token_id = model.config.bos_token_id


def test_the_cli_takes_the_drafters_tokenizer(pair, tmp_path, capsys):
    import json

    from specdec.cli import main

    model, tokenizer, draft, draft_tokenizer = pair
    verifier_dir, draft_dir, tokenizer_dir = (str(tmp_path / name) for name in ("verifier", "draft", "tokenizer"))
    model.save_pretrained(verifier_dir)
    tokenizer.save_pretrained(verifier_dir)
    draft.save_pretrained(draft_dir)
    tokenizer.save_pretrained(draft_dir)  # beside it, the verifier's: --draft-tokenizer names the right one
    draft_tokenizer.save_pretrained(tokenizer_dir)
    argv = ["generate", "--model", verifier_dir, "--draft", draft_dir, "--prompt", "the cat sat on the mat", "--compare",
            "--json", "--max-new-tokens", "8", "-k", "3", "--no-chat-template"]
    assert main([*argv, "--draft-tokenizer", tokenizer_dir]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["identical"] == 1
    with pytest.raises(SystemExit, match="--draft-tokenizer .*nowhere"):
        main([*argv, "--draft-tokenizer", str(tmp_path / "nowhere")])
