"""A drafter whose tokenizer differs from the verifier's (specdec.drafters.cross_vocab): drafts go through text, so
greedy output is the verifier's at batch 1 and ragged, for any vocabulary pair. Here the drafter is the verifier with
its character ids permuted (its embedding and head rows moved with them): the same model in another vocabulary."""

from __future__ import annotations

import string

import pytest
import torch
from law import ALPHA
from tiny_models import VOCAB, char_tokenizer, make_model

import specdec
from specdec.drafters.cross_vocab import CrossVocabDrafter
from specdec.drafters.shared_vocab import SharedVocabularyError
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


# --------------------------------------------------------------------------------------------
# sampling: token-level intersection (TLI) over the tokens both vocabularies share
# --------------------------------------------------------------------------------------------


def _word_level(vocab: dict[str, int], unk: str):
    """A character tokenizer over ``vocab`` (no special tokens declared to transformers)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _tiny_pair():
    """An 8-token verifier (characters a-h) and a noisy drafter whose vocabulary lacks 'a', has 'z', and orders the
    rest backwards: six shared tokens, not at their verifier ids."""
    from test_sampling import _tiny_vocab_model
    from tiny_models import perturbed_copy

    verifier = _tiny_vocab_model(4)
    chars = "abcdefgh"
    vtok = _word_level({c: i for i, c in enumerate(chars)}, unk="a")
    dvocab = {"z": 0, **{c: 8 - i for i, c in enumerate(chars) if c not in "ah"}, "h": 1}
    draft = perturbed_copy(verifier, 0.4)
    order = [0] * 8  # draft id -> the verifier row it takes
    for c, d in dvocab.items():
        order[d] = vtok.convert_tokens_to_ids(c) if c != "z" else 0
    with torch.no_grad():
        for weight in {id(w): w for w in (draft.get_input_embeddings().weight,
                                          draft.get_output_embeddings().weight)}.values():
            weight.copy_(weight[order])
    return verifier, vtok, draft, _word_level(dvocab, unk="z")


def _tli_law(verifier, vtok, draft, dtok, rows: int = 2400, **options) -> float:
    from law import sampled_law

    drafter = CrossVocabDrafter(draft, dtok, vtok, sample="a bad cafe faced a big hedge")  # text in a-h
    p_value, spec = sampled_law(verifier, drafter, rows, num_draft_tokens=2, tokenizer=vtok, **options)
    assert spec.last_stats.proposed > 0 and spec.last_stats.accepted > 0
    return p_value


def test_the_shared_vocabulary_maps_tokens_by_their_text():
    _, vtok, draft, dtok = _tiny_pair()
    shared = CrossVocabDrafter(draft, dtok, vtok).shared_vocab()
    assert sorted(vtok.convert_ids_to_tokens(shared.verifier_ids.tolist())) == list("bcdefgh")
    assert [dtok.convert_ids_to_tokens(int(shared.to_draft[vtok.convert_tokens_to_ids(c)])) for c in "bch"] == \
        list("bch")
    assert int(shared.to_draft[vtok.convert_tokens_to_ids("a")]) == -1


def test_sampled_cross_vocabulary_drafts_keep_the_verifier_law():
    assert _tli_law(*_tiny_pair()) > ALPHA


def test_drafts_judged_by_a_distribution_they_were_not_drawn_from_fail_the_same_law_test(monkeypatch):
    """The negative control: the drafts' ``q`` reported unrestricted-like (flattened), not what they were drawn from."""
    sample = CrossVocabDrafter._sample

    def flattened(self, *args, **kwargs):
        chain = sample(self, *args, **kwargs)
        q = chain.probs.sqrt() * (chain.probs > 0)
        chain.probs = q / q.sum(dim=-1, keepdim=True)
        return chain

    monkeypatch.setattr(CrossVocabDrafter, "_sample", flattened)
    assert _tli_law(*_tiny_pair()) < ALPHA


def test_a_pair_that_shares_too_little_is_refused_in_one_line(pair):
    model, tokenizer, draft, _ = pair
    few = _word_level({"<unk>": 0, **{c: i + 1 for i, c in enumerate("XYZ0123")}}, unk="<unk>")
    spec = specdec.SpeculativeModel(model, draft, num_draft_tokens=3, tokenizer=tokenizer, draft_tokenizer=few)
    ids = tokenizer("the cat sat", return_tensors="pt").input_ids
    with pytest.raises(SharedVocabularyError, match=r"shares 7 of the verifier's \d+ tokens, \d+% .*TLI") as err:
        spec.generate(ids, max_new_tokens=4, do_sample=True)
    assert "\n" not in str(err.value)
    greedy = dict(max_new_tokens=4, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **greedy), model.generate(ids, **greedy))  # greedy goes by text


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_cross_vocabulary_trees_are_greedy_identical_at_batch_one_and_ragged_four(pair, tree):
    """Trees under TLI: every node a shared token, fed by its draft id under the tree mask; greedy is ``generate``."""
    model, tokenizer, draft, draft_tokenizer = pair
    spec = specdec.SpeculativeModel(model, draft, tree=tree, tokenizer=tokenizer, draft_tokenizer=draft_tokenizer)
    ids = tokenizer("the cat sat on the mat, the cat", return_tensors="pt").input_ids
    kwargs = dict(max_new_tokens=16, do_sample=False, eos_token_id=None)
    assert torch.equal(spec.generate(ids, **kwargs), model.generate(ids, **kwargs))
    assert spec.last_stats.accepted > 0 and spec.last_stats.mean_tree_tokens > 1.5
    tokenizer.padding_side = "left"
    texts = ["the cat sat", "a dog ran on the hill", "to be or not to be", "hi"]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    kwargs = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(spec.generate(**batch, **kwargs), model.generate(**batch, **kwargs))


@pytest.mark.parametrize("rule", ["token", "traversal"])
def test_sampled_cross_vocabulary_trees_keep_the_verifier_law(rule):
    assert _tli_law(*_tiny_pair(), tree=[[0], [1], [2], [0, 0], [1, 0]], verify=rule) > ALPHA


def test_cross_vocabulary_trees_misreporting_their_laws_fail_the_same_law_test(monkeypatch):
    """The negative control: a sampled tree's children reported with a flat law over their support."""
    from specdec.trees import build

    real = build._children

    def flat(logprobs, width, sample, generator):
        v, t, laws = real(logprobs, width, sample, generator)
        return v, t, None if laws is None else (laws > 0).float() / (laws > 0).float().sum(dim=-1, keepdim=True)

    monkeypatch.setattr(build, "_children", flat)
    assert _tli_law(*_tiny_pair(), tree=[[0], [1], [2], [0, 0], [1, 0]], verify="traversal") < ALPHA


def test_a_tree_over_a_pair_that_shares_too_little_is_refused_in_one_line(pair):
    model, tokenizer, draft, _ = pair
    few = _word_level({"<unk>": 0, **{c: i + 1 for i, c in enumerate("XYZ0123")}}, unk="<unk>")
    spec = specdec.SpeculativeModel(model, draft, tree="static", tokenizer=tokenizer, draft_tokenizer=few)
    ids = tokenizer("the cat sat", return_tensors="pt").input_ids
    with pytest.raises(SharedVocabularyError, match=r"shares 7 of the verifier's \d+ tokens.*trees over them .*tree=None"):
        spec.generate(ids, max_new_tokens=4, do_sample=False)


# --------------------------------------------------------------------------------------------
# the evaluation: hf-uag beside specdec, the drafter's tokenizer found beside it or named
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_eval_runs_hf_uag_beside_specdec_on_the_same_pair(pair, tmp_path, do_sample):
    from specdec.eval import EvalConfig, run_eval

    import copy

    model, tokenizer, draft, draft_tokenizer = pair
    draft = copy.deepcopy(draft)
    draft.resize_token_embeddings(VOCAB + 32)  # transformers tells vocabularies apart by their size alone
    draft_tokenizer = copy.deepcopy(draft_tokenizer)
    draft_tokenizer.add_tokens(["§"])  # and prunes the LM head of an assistant with tokens the verifier lacks
    draft_dir, tokenizer_dir = tmp_path / "draft", tmp_path / "tokenizer"
    draft.save_pretrained(draft_dir)
    tokenizer.save_pretrained(draft_dir)  # the wrong one beside it: draft_tokenizer= names the right one
    draft_tokenizer.save_pretrained(tokenizer_dir)
    head = draft.get_output_embeddings().weight.clone()
    config = EvalConfig(out_dir=tmp_path / "out", draft=[str(draft_dir)], num_draft_tokens=3, baselines=["hf-uag"],
                        max_new_tokens=8, do_sample=do_sample, temperature=0.8 if do_sample else None,
                        draft_tokenizer=str(tokenizer_dir), progress=False, plots=False)
    summary = run_eval(model, tokenizer, ["the cat sat on the mat", "a dog ran"], config).to_dict()
    methods = {m["name"]: m for m in summary["methods"]}
    assert set(methods) == {"hf", f"hf-uag[{draft_dir}]", f"specdec[{draft_dir},k=3]"}
    assert not any(m.get("errors") for m in methods.values())
    if not do_sample:
        assert methods[f"specdec[{draft_dir},k=3]"]["identical"] == 2
        assert methods[f"hf-uag[{draft_dir}]"]["identical"] == 2
    assert torch.equal(draft.get_output_embeddings().weight, head)  # transformers' pruning hit a copy
