"""Grammar processors (xgrammar, outlines) under speculation: greedy equal to ``model.generate`` with the same
processor, sampling by the constrained law, and stateful processors without an adapter refused."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from transformers import LogitsProcessorList

import specdec
from tiny_models import VOCAB, char_tokenizer, left_padded, make_model, perturbed_copy

xgr = pytest.importorskip("xgrammar")

# a record language with forced runs ("key" after "(" or ","), choices and repetition
EBNF = 'root ::= "(" pair ("," pair)* ")"\npair ::= "key" [0-9] ":" [a-c]+'
REGEX = r"\(key[0-9]:[a-c]+(,key[0-9]:[a-c]+)*\)"


def _vocab() -> list[str]:
    tok = char_tokenizer()
    vocab = [""] * VOCAB  # ids the tokenizer leaves unused: empty, never allowed by a grammar
    for text, i in tok.get_vocab().items():
        vocab[i] = "" if text.startswith("<") else text
    return vocab


@pytest.fixture(scope="module")
def xgrammar_factory():
    info = xgr.TokenizerInfo(_vocab(), vocab_size=VOCAB, stop_token_ids=[2])
    compiled = xgr.GrammarCompiler(info).compile_grammar(EBNF)
    return lambda: xgr.contrib.hf.LogitsProcessor(compiled)


@pytest.fixture(scope="module")
def outlines_factory():
    pytest.importorskip("outlines")
    from outlines.backends.outlines_core import OutlinesCoreLogitsProcessor
    from outlines_core import Index, Vocabulary

    vocab = {text: [i] for i, text in enumerate(_vocab()) if text and i != 2}
    index = Index(REGEX, Vocabulary(2, vocab))
    return lambda: OutlinesCoreLogitsProcessor(index, "torch")


LIBRARIES = ["xgrammar", "outlines"]


@pytest.fixture(scope="module")
def verifier():
    return make_model("llama")


def _factory(request, library: str):
    return request.getfixturevalue(f"{library}_factory")


def _prompts(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    return left_padded([5, 9, 2][:batch], seed=4) if batch > 1 else left_padded([6], seed=4)


# every drafter kind x chain/tree x batch for xgrammar; outlines on the same engine paths with one drafter kind
CASES = [("xgrammar", d, b, t) for d in ("model", "prompt-lookup") for b in (1, 3) for t in (None, "static")] + \
        [("xgrammar", "self:int8", 3, None), ("xgrammar", "composite:int8", 1, "dynamic")] + \
        [("outlines", "model", b, t) for b, t in ((1, None), (3, "static"))]


@pytest.mark.parametrize("library,draft,batch,tree", CASES, ids=lambda v: str(v))
def test_greedy_equals_generate_with_the_same_grammar(request, verifier, library, draft, batch, tree):
    make = _factory(request, library)
    ids, mask = _prompts(batch)
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=2)
    expected = verifier.generate(ids, logits_processor=LogitsProcessorList([make()]), **kwargs)
    spec = specdec.SpeculativeModel(verifier, perturbed_copy(verifier, 0.05) if draft == "model" else draft,
                                    num_draft_tokens=4, tree=tree)
    processor = make()
    got = spec.generate(ids, logits_processor=LogitsProcessorList([processor]), **kwargs)
    assert torch.equal(got, expected), f"{library} {draft} batch={batch} tree={tree}"
    assert spec.last_stats.accepted > 0  # drafts were verified under the grammar, not only plain steps
    # the same processor object again (the library's is single-use; specdec never advances it)
    assert torch.equal(spec.generate(ids, logits_processor=LogitsProcessorList([processor]), **kwargs), expected)


def test_the_grammar_is_really_applied(verifier, xgrammar_factory):
    """Negative control: without the grammar the output differs, so the identity above is not vacuous."""
    ids, mask = _prompts(1)
    kwargs = dict(attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=0, eos_token_id=2)
    constrained = verifier.generate(ids, logits_processor=LogitsProcessorList([xgrammar_factory()]), **kwargs)
    assert not torch.equal(constrained, verifier.generate(ids, **kwargs))
    vocab = _vocab()
    text = "".join(vocab[t] for t in constrained[0, ids.shape[1]:].tolist() if t != 2)
    import re

    assert re.fullmatch(r"\(key[0-9]:[a-c]+(,key[0-9]:[a-c]+)*(,k?e?y?[0-9]?:?[a-c]*)?\)?", text), text


def test_a_stateful_processor_without_an_adapter_is_refused(verifier):
    pytest.importorskip("outlines")
    from outlines.processors.base_logits_processor import OutlinesLogitsProcessor

    class Stateful(OutlinesLogitsProcessor):
        def process_logits(self, input_ids, logits):
            return logits

    spec = specdec.SpeculativeModel(verifier, "prompt-lookup", num_draft_tokens=2)
    with pytest.raises(specdec.UnsupportedProcessorError, match="Stateful.*no adapter"):
        spec.generate(torch.tensor([[5, 6, 7]]), logits_processor=LogitsProcessorList([Stateful("torch")]),
                      max_new_tokens=4)


# --- sampling: the constrained law -----------------------------------------------------------------------------
SMALL = ["a", "b", "c", "(", ")", ",", "x", "y"]  # an 8-token vocabulary; "</s>" is not in it
SMALL_EBNF = 'root ::= "(" [ab] ("," [abc])* ")"'


def _small_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=len(SMALL), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.4,
                            bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return tf.LlamaForCausalLM(config).eval()


def _small_grammar():
    info = xgr.TokenizerInfo(SMALL, vocab_size=len(SMALL), stop_token_ids=[7])  # "y" ends the text
    return xgr.GrammarCompiler(info).compile_grammar(SMALL_EBNF)


def _library_joint(model, prompt: torch.Tensor, steps: int, compiled, temperature: float) -> dict:
    """P(t1..t_steps) under the library's own processor as ``generate`` drives it (a fresh one per prefix,
    called once per step in order), by enumeration."""
    probs = {(): 1.0}
    for _ in range(steps):
        nxt = {}
        for prefix, mass in probs.items():
            processor = xgr.contrib.hf.LogitsProcessor(compiled)
            for j in range(len(prefix) + 1):
                ids = torch.cat([prompt, torch.tensor([prefix[:j]], dtype=torch.long).reshape(1, -1)], dim=1)
                with torch.no_grad():
                    logits = model(ids).logits[:, -1].float() / temperature
                scores = processor(ids, logits)
            for tok, pr in enumerate(torch.softmax(scores, dim=-1)[0].tolist()):
                if pr > 0:
                    nxt[prefix + (tok,)] = mass * pr
        probs = nxt
    return probs


def _sample_counts(spec, prompt, compiled, steps: int, rows: int, seed: int) -> dict:
    out = spec.generate(prompt.expand(rows, -1), max_new_tokens=steps, do_sample=True, temperature=0.8, top_k=0,
                        eos_token_id=None, generator=torch.Generator().manual_seed(seed),
                        logits_processor=LogitsProcessorList([xgr.contrib.hf.LogitsProcessor(compiled)]))
    counts: dict = {}
    for r in out[:, prompt.shape[1]:].tolist():
        counts[tuple(r)] = counts.get(tuple(r), 0) + 1
    return counts


def test_sampling_keeps_the_constrained_distribution():
    from test_sampling import ALPHA, _chi2

    verifier = _small_model(0)
    compiled = _small_grammar()
    prompt = torch.tensor([[6, 3]])
    steps = 4
    exact = _library_joint(verifier, prompt, steps, compiled, 0.8)
    spec = specdec.SpeculativeModel(verifier, perturbed_copy(verifier, 0.5), num_draft_tokens=3)
    counts = _sample_counts(spec, prompt, compiled, steps, 3000, seed=5)
    assert _chi2(counts, exact, sum(counts.values())) > ALPHA
    assert spec.last_stats.accepted > 0


def test_sampling_check_detects_a_grammar_one_token_late(monkeypatch):
    """Negative control: a constraint that masks each context as its parent (the bug of feeding a stateful
    processor one token behind) fails the same check."""
    from test_sampling import ALPHA, _chi2

    from specdec.constraints.xgrammar import XGrammarRow

    verifier = _small_model(0)
    compiled = _small_grammar()
    prompt = torch.tensor([[6, 3]])
    steps = 4
    exact = _library_joint(verifier, prompt, steps, compiled, 0.8)
    late = XGrammarRow.mask
    monkeypatch.setattr(XGrammarRow, "mask", lambda self, tokens, scores: late(self, tokens[:-1], scores))
    spec = specdec.SpeculativeModel(verifier, perturbed_copy(verifier, 0.5), num_draft_tokens=3)
    with pytest.raises(AssertionError):  # either an outcome the grammar forbids, or a p-value below ALPHA
        counts = _sample_counts(spec, prompt, compiled, steps, 3000, seed=5)
        assert _chi2(counts, exact, sum(counts.values())) > ALPHA


# --- grammar-aware drafting ---------------------------------------------------------------------------------------
def test_forced_text_is_drafted_and_forbidden_drafts_are_cut(verifier, xgrammar_factory):
    """With a tokenizer, the text the grammar forces ("key" after "(" or ",") is proposed without the drafter, and
    prompt lookup's drafts that break the grammar are cut; the output stays ``generate``'s."""
    ids, mask = _prompts(1)
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, pad_token_id=0, eos_token_id=2)
    expected = verifier.generate(ids, logits_processor=LogitsProcessorList([xgrammar_factory()]), **kwargs)
    z = char_tokenizer().convert_tokens_to_ids("z")

    class Scribbler(specdec.Drafter):  # proposes "z", which the grammar never allows
        def propose(self, rows, k, ctx):
            return specdec.DraftChain(torch.full((len(rows), k), z, dtype=torch.long))

    for draft in ("prompt-lookup", perturbed_copy(verifier, 0.05), Scribbler()):
        spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=4, tokenizer=char_tokenizer())
        got = spec.generate(ids, logits_processor=LogitsProcessorList([xgrammar_factory()]), **kwargs)
        assert torch.equal(got, expected)
        stats = spec.last_stats.drafter_stats
        assert stats["grammar_forced_tokens"] > 0 and stats["grammar_forced_steps"] > 0
        if isinstance(draft, Scribbler):
            assert stats["grammar_cut_tokens"] > 0 and spec.last_stats.accepted > 0  # only forced text is accepted
    # without a tokenizer nothing is forced, and the output is the same
    spec = specdec.SpeculativeModel(verifier, "prompt-lookup", num_draft_tokens=4)
    assert torch.equal(spec.generate(ids, logits_processor=LogitsProcessorList([xgrammar_factory()]), **kwargs),
                       expected)
    assert spec.last_stats.drafter_stats["grammar_forced_tokens"] == 0


class _SmallTokenizer:
    """Encodes text in the 8-token vocabulary, one character a token (what forced drafting needs)."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [SMALL.index(c) for c in text]


def test_sampling_with_forced_drafts_keeps_the_constrained_distribution():
    from test_sampling import ALPHA, _chi2

    verifier = _small_model(1)
    info = xgr.TokenizerInfo(SMALL, vocab_size=len(SMALL), stop_token_ids=[7])
    compiled = xgr.GrammarCompiler(info).compile_grammar('root ::= "(((" [ab] (",,," [abc])* ")))"')
    prompt = torch.tensor([[6, 3]])
    steps = 7
    exact = _library_joint(verifier, prompt, steps, compiled, 0.8)
    assert len(exact) >= 4  # the law has choices to test
    spec = specdec.SpeculativeModel(verifier, perturbed_copy(verifier, 0.5), num_draft_tokens=3,
                                    tokenizer=_SmallTokenizer())
    counts = _sample_counts(spec, prompt, compiled, steps, 3000, seed=9)
    assert spec.last_stats.drafter_stats["grammar_forced_tokens"] > 0
    assert _chi2(counts, exact, sum(counts.values())) > ALPHA


def test_outlines_xgrammar_backend_is_exact(verifier):
    """outlines' xgrammar backend drives xgrammar's matcher its own way; the same adapter keeps it exact."""
    pytest.importorskip("outlines")
    from outlines.backends.xgrammar import XGrammarLogitsProcessor

    info = xgr.TokenizerInfo(_vocab(), vocab_size=VOCAB, stop_token_ids=[2])
    compiled = xgr.GrammarCompiler(info).compile_grammar(EBNF)
    ids, mask = _prompts(3)
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=2)
    expected = verifier.generate(ids, logits_processor=LogitsProcessorList([XGrammarLogitsProcessor(compiled, "torch")]),
                                 **kwargs)
    spec = specdec.SpeculativeModel(verifier, "prompt-lookup", num_draft_tokens=3)
    got = spec.generate(ids, logits_processor=LogitsProcessorList([XGrammarLogitsProcessor(compiled, "torch")]), **kwargs)
    assert torch.equal(got, expected)


def test_a_bad_proposal_under_a_grammar_names_the_drafter(verifier, xgrammar_factory):
    class PastTheVocabulary(specdec.Drafter):
        def propose(self, rows, k, ctx):
            return specdec.DraftChain(torch.full((len(rows), k), VOCAB + 5, dtype=torch.long))

    spec = specdec.SpeculativeModel(verifier, PastTheVocabulary(), num_draft_tokens=3, tokenizer=char_tokenizer())
    with pytest.raises(ValueError, match="drafter PastTheVocabulary"):
        spec.generate(torch.tensor([[5, 6, 7]]), logits_processor=LogitsProcessorList([xgrammar_factory()]),
                      max_new_tokens=10, eos_token_id=2)


def test_transformers_assisted_generation_is_exact_through_any_order(verifier, xgrammar_factory):
    """transformers' assisted generation fails on xgrammar's processor as speculation did; wrapped in ``AnyOrder``
    it gives plain ``generate``'s output (what ``specdec eval`` runs its ``hf-assisted`` baseline with)."""
    from specdec.constraints.adapt import AnyOrder

    ids, mask = _prompts(1)
    kwargs = dict(attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=2)
    expected = verifier.generate(ids, logits_processor=LogitsProcessorList([xgrammar_factory()]), **kwargs)
    draft = perturbed_copy(verifier, 0.05)
    with pytest.raises(AssertionError):
        verifier.generate(ids, assistant_model=draft, logits_processor=LogitsProcessorList([xgrammar_factory()]),
                          **kwargs)
    got = verifier.generate(ids, assistant_model=draft,
                            logits_processor=LogitsProcessorList([AnyOrder([xgrammar_factory()])]), **kwargs)
    assert torch.equal(got, expected)
