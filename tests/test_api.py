"""The drop-in API: return types, streamers, stopping criteria, patching, and clear errors for bad input."""

import pytest
import torch
import transformers as tf
from transformers import DynamicCache, GenerationConfig, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer
from transformers.generation.utils import GenerateDecoderOnlyOutput

import specdec
from specdec.drafters import Drafter, DraftChain
from tiny_models import VOCAB, make_model, perturbed_copy


@pytest.fixture(scope="module")
def llama():
    model = make_model("llama")
    return model, perturbed_copy(model, 0.05)


PROMPT = torch.tensor([[5, 17, 33, 8, 41]])
GREEDY = dict(max_new_tokens=20, do_sample=False, eos_token_id=None)


class Recorder(BaseStreamer):
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.tolist())

    def end(self):
        self.ended = True


def test_return_dict_scores_and_logits_match_generate(llama):
    model, draft = llama
    kwargs = dict(GREEDY, return_dict_in_generate=True, output_scores=True, output_logits=True, repetition_penalty=1.2)
    ref = model.generate(PROMPT, **kwargs)
    out = specdec.SpeculativeModel(model, draft, num_draft_tokens=4).generate(PROMPT, **kwargs)
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.scores) == len(ref.scores) == 20
    for mine, theirs in zip(out.scores, ref.scores):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(out.logits, ref.logits):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    assert out.spec_stats.new_tokens == 20
    assert out.spec_stats.proposed > 0


def test_streamer_sees_what_generate_streams(llama):
    model, draft = llama
    theirs, mine = Recorder(), Recorder()
    model.generate(PROMPT, streamer=theirs, **GREEDY)
    specdec.SpeculativeModel(model, draft).generate(PROMPT, streamer=mine, **GREEDY)
    assert mine.ended and theirs.ended
    assert mine.chunks[0] == theirs.chunks[0]  # the prompt first

    def flat(chunks):
        return [t for c in chunks[1:] for t in (c if isinstance(c, list) else [c])]

    assert flat(mine.chunks) == flat(theirs.chunks)


class StopAfterToken(StoppingCriteria):
    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


def test_custom_stopping_criteria_inside_a_block(llama):
    """A stop that is not EOS, met inside an accepted block: sequences, scores, logits and the streamer
    all end where ``model.generate``'s do (the drafter is the verifier, so whole blocks are accepted)."""
    model, _ = llama
    free = model.generate(PROMPT, **GREEDY)[0, 5:].tolist()
    criteria = StoppingCriteriaList([StopAfterToken(free[7])])
    kwargs = dict(GREEDY, stopping_criteria=criteria, return_dict_in_generate=True, output_scores=True, output_logits=True)
    theirs, mine = Recorder(), Recorder()
    ref = model.generate(PROMPT, streamer=theirs, **kwargs)
    got = specdec.SpeculativeModel(model, model, num_draft_tokens=8).generate(PROMPT, streamer=mine, **kwargs)
    assert torch.equal(got.sequences, ref.sequences)
    assert got.sequences.shape[1] < PROMPT.shape[1] + 20
    assert len(got.scores) == len(ref.scores) == got.sequences.shape[1] - PROMPT.shape[1]
    assert len(got.logits) == len(ref.logits)
    for mine_s, theirs_s in zip(got.scores, ref.scores):
        torch.testing.assert_close(mine_s, theirs_s, rtol=1e-4, atol=1e-4)
    streamed = [t for chunk in mine.chunks[1:] for t in (chunk if isinstance(chunk[0], int) else chunk[0])]
    assert streamed == got.sequences[0, PROMPT.shape[1]:].tolist()


def test_stop_inside_a_block_in_a_batch_without_eos(llama):
    """Without EOS, rows run on until every row stopped and are cut at the longest stop, as in ``generate``."""
    model, _ = llama
    prompts = torch.tensor([[5, 17, 33, 8, 41], [9, 3, 71, 12, 60]])
    free = model.generate(prompts, **GREEDY)[:, 5:]
    criteria = StoppingCriteriaList([StopAfterToken(int(free[0, 3]))])
    ref = model.generate(prompts, stopping_criteria=criteria, **GREEDY)
    got = specdec.SpeculativeModel(model, model, num_draft_tokens=8).generate(prompts, stopping_criteria=criteria, **GREEDY)
    assert torch.equal(got, ref)


def test_generation_config_and_max_length(llama):
    model, draft = llama
    config = GenerationConfig(max_length=17, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = specdec.SpeculativeModel(model, draft).generate(PROMPT, generation_config=config)
    assert got.shape[1] == 17
    assert torch.equal(got, model.generate(PROMPT, generation_config=config))


def test_min_new_tokens_with_eos(llama):
    model, draft = llama
    eos = model.generate(PROMPT, **GREEDY)[0, 5 + 2].item()
    kwargs = dict(max_new_tokens=20, do_sample=False, eos_token_id=eos, min_new_tokens=10)
    assert torch.equal(specdec.SpeculativeModel(model, draft).generate(PROMPT, **kwargs), model.generate(PROMPT, **kwargs))


def test_patch_and_unpatch(llama):
    model, draft = llama
    ref = model.generate(PROMPT, **GREEDY)
    wrapper = specdec.patch(model, draft, num_draft_tokens=3)
    try:
        assert wrapper.last_stats is None
        got = model.generate(PROMPT, **GREEDY)
        assert torch.equal(got, ref)
        assert wrapper.last_stats is not None and wrapper.last_stats.num_draft_tokens == 3
        with pytest.raises(RuntimeError, match="already patched"):
            specdec.patch(model, draft)
    finally:
        specdec.unpatch(model)
    model.generate(PROMPT, **GREEDY)
    assert wrapper.last_stats.verifier_forwards > 0  # unchanged by the unpatched call
    with pytest.raises(RuntimeError, match="not patched"):
        specdec.unpatch(model)


def test_functional_generate(llama):
    model, draft = llama
    got = specdec.generate(model, draft, PROMPT, num_draft_tokens=2, **GREEDY)
    assert torch.equal(got, model.generate(PROMPT, **GREEDY))


class CountingDrafter(Drafter):
    """A drafter written against the base class: always proposes token 7; counts its calls in stats()."""

    def start(self, input_ids, attention_mask, max_len, **kwargs):
        self.calls = 0

    def propose(self, rows, k, ctx):
        self.calls += 1
        return DraftChain(torch.full((len(rows), k), 7, dtype=torch.long))

    def stats(self):
        return {"calls": self.calls}


class OldProtocolDrafter:
    """A drafter written against the protocol before the base class (duck-typed, not a Drafter subclass)."""

    def start(self, input_ids, attention_mask, max_len):
        pass

    def propose(self, rows, k, ctx):
        return DraftChain(torch.full((len(rows), k), 7, dtype=torch.long))

    def commit(self, rows):
        pass

    def keep_rows(self, indices):
        pass

    def finish(self):
        pass


def test_old_protocol_drafter_is_refused(llama):
    """specdec.drafters.legacy is gone: a duck-typed drafter is refused, and told to subclass Drafter."""
    model, _ = llama
    with pytest.raises(TypeError, match="cannot use OldProtocolDrafter as a drafter: .*subclass of specdec.drafters.Drafter"):
        specdec.SpeculativeModel(model, OldProtocolDrafter(), num_draft_tokens=3)


def test_custom_drafter_protocol(llama):
    model, _ = llama
    spec = specdec.SpeculativeModel(model, CountingDrafter(), num_draft_tokens=3)
    assert torch.equal(spec.generate(PROMPT, **GREEDY), model.generate(PROMPT, **GREEDY))
    assert spec.last_stats.drafter_stats["calls"] > 0


def test_custom_drafter_protocol_under_sampling(llama):
    """A deterministic drafter (``probs=None``) under sampling: its drafts count as one-hot ``q``, judged
    against the *processed* distribution, and a seeded generator makes the call reproducible."""
    model, _ = llama
    spec = specdec.SpeculativeModel(model, CountingDrafter(), num_draft_tokens=3)
    # top_k=1: the processed distribution is one-hot at the argmax, so sampling must give greedy output
    sampled = spec.generate(PROMPT, do_sample=True, top_k=1, max_new_tokens=20, eos_token_id=None)
    assert torch.equal(sampled, model.generate(PROMPT, **GREEDY))
    # token 7 banned by a processor: a draft of 7 has processed probability 0, so none may be accepted
    kwargs = dict(do_sample=True, max_new_tokens=20, eos_token_id=None, bad_words_ids=[[7]])
    runs = [spec.generate(PROMPT, generator=torch.Generator(device="cpu").manual_seed(5), **kwargs) for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    assert 7 not in runs[0][0, PROMPT.shape[1]:].tolist()
    assert spec.last_stats.proposed > 0 and spec.last_stats.accepted == 0


# --- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_beams=2), NotImplementedError, "beam search"),
        (dict(num_return_sequences=2, do_sample=True), NotImplementedError, "several return sequences"),
        (dict(output_attentions=True, return_dict_in_generate=True), NotImplementedError, "attentions"),
        (dict(output_hidden_states=True, return_dict_in_generate=True), NotImplementedError, "hidden states"),
        (dict(penalty_alpha=0.6, top_k=4), NotImplementedError, "contrastive"),
        (dict(assistant_model="x"), NotImplementedError, "assistant_model"),
        (dict(past_key_values=DynamicCache()), NotImplementedError, "past_key_values"),
        (dict(cache=DynamicCache()), NotImplementedError, "`cache`"),
        (dict(do_sample=True, temperature=-1.0), ValueError, "temperature"),
        (dict(do_sample=True, top_p=1.5), ValueError, "top_p"),
        (dict(repetition_penalty=0.0), ValueError, "repetition_penalty"),
        (dict(num_draft_tokens=0), ValueError, "num_draft_tokens"),
        (dict(frobnicate=3), (NotImplementedError, ValueError), "frobnicate"),
    ],
)
def test_unsupported_or_invalid_arguments_are_named(llama, kwargs, error, match):
    model, draft = llama
    spec = specdec.SpeculativeModel(model, draft)
    with pytest.raises(error, match=match):
        spec.generate(PROMPT, **{"max_new_tokens": 5, **kwargs})


def test_empty_prompt(llama):
    model, draft = llama
    spec = specdec.SpeculativeModel(model, draft)
    with pytest.raises(ValueError, match="empty prompt"):
        spec.generate(torch.zeros((1, 0), dtype=torch.long), max_new_tokens=5)
    with pytest.raises(ValueError, match="input_ids"):
        spec.generate(max_new_tokens=5)
    with pytest.raises(ValueError, match="all zeros"):
        spec.generate(torch.tensor([[1, 2], [3, 4]]), attention_mask=torch.tensor([[1, 1], [0, 0]]), max_new_tokens=5)


def test_right_padding_is_refused(llama):
    model, draft = llama
    with pytest.raises(ValueError, match="left padding"):
        specdec.SpeculativeModel(model, draft).generate(
            torch.tensor([[1, 2, 0]]), attention_mask=torch.tensor([[1, 1, 0]]), max_new_tokens=5)


def test_nothing_to_generate(llama):
    model, draft = llama
    with pytest.raises(ValueError, match="nothing to generate|max_length"):
        specdec.SpeculativeModel(model, draft).generate(PROMPT, max_length=3)


def test_mismatched_vocabularies():
    verifier = make_model("llama")
    torch.manual_seed(0)
    other = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=5000, eos_token_id=2, bos_token_id=1))
    with pytest.raises(specdec.VocabularyMismatchError, match="different tokenizers"):
        specdec.SpeculativeModel(verifier, other)
    other_eos = tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB, eos_token_id=9, bos_token_id=1))
    with pytest.raises(specdec.VocabularyMismatchError, match="eos_token_id"):
        specdec.SpeculativeModel(verifier, other_eos)


def test_drafter_with_a_smaller_vocabulary_is_refused_when_built():
    verifier = make_model("llama")
    config = verifier.config.to_dict()
    config["vocab_size"] = VOCAB - 16
    torch.manual_seed(3)
    draft = tf.LlamaForCausalLM(tf.LlamaConfig(**config)).eval()
    with pytest.raises(specdec.VocabularyMismatchError, match=f"smaller.*{VOCAB - 16}.*{VOCAB}"):
        specdec.SpeculativeModel(verifier, draft, num_draft_tokens=3)


def test_padded_drafter_head_is_accepted():
    verifier = make_model("llama")
    config = verifier.config.to_dict()
    config["vocab_size"] = VOCAB + 32  # embedding matrix padded to a multiple of 64
    torch.manual_seed(3)
    draft = tf.LlamaForCausalLM(tf.LlamaConfig(**config)).eval()
    with pytest.warns(UserWarning, match="padding"):
        spec = specdec.SpeculativeModel(verifier, draft, num_draft_tokens=3)
    got = spec.generate(PROMPT, **GREEDY)
    assert torch.equal(got, verifier.generate(PROMPT, **GREEDY))


def test_unsupported_models():
    t5 = tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=1, num_heads=2, d_kv=16))
    with pytest.raises(specdec.UnsupportedModelError, match="encoder-decoder"):
        specdec.SpeculativeModel(t5, t5)
    with pytest.raises(TypeError, match="cannot use int as a drafter"):
        specdec.SpeculativeModel(make_model("llama"), 42)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        specdec.SpeculativeModel(make_model("llama"), "some-org/some-model")


def test_request_that_cannot_fit_fails_before_compute(llama):
    from specdec.sizing import PlanError

    model, draft = llama
    calls = []
    hook = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        spec = specdec.SpeculativeModel(model, draft, memory_budget="64KiB")
        with pytest.raises(PlanError, match="batch|context|length"):
            spec.generate(PROMPT.expand(8, -1), max_new_tokens=500, do_sample=False)
    finally:
        hook.remove()
    assert calls == []
