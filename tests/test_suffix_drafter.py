"""Suffix decoding (issue 54): exactness, the cross-call cache (learning, budget, files, threads), the sampling law,
``composite:suffix`` and ``--draft suffix``."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import transformers as tf

import specdec
from law import ALPHA, chi2, exact_joint, tally
from specdec.cli import main
from specdec.draft_kinds import learns_across_calls
from specdec.draft_spec import DraftSpecError, parse_draft
from specdec.drafters import SuffixCache, SuffixCacheError, SuffixCompositeDrafter, SuffixDrafter
from specdec.drafters.base import DraftContext, Rows
from specdec.drafters.suffix import cross_call_cache
from specdec.drafters.suffix_index import TokenIndex
from tiny_models import char_tokenizer, left_padded, make_model, perturbed_copy

GREEDY = dict(do_sample=False, eos_token_id=None)
REPEATS = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]])


# --- the index -----------------------------------------------------------------------------------------------


def test_match_counts_continuations_of_the_longest_suffix():
    index = TokenIndex()
    index.extend(0, [1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 1, 2, 3, 4, 5])
    longest, *_ = index.match([9, 1, 2, 3, 4], depth=3)
    # "1 2 3 4" is followed by 5 twice and 6 once (the context's own end is not a candidate)
    assert longest.match == 4 and longest.total == 3
    chain, score = longest.chain(3, min_prob=0.1)
    # 5 (2 of 3), then 1 and 2 (1 of 3: the last occurrence ends the text after its 5)
    assert chain == [5, 1, 2] and score == pytest.approx(2 / 3 + 1 / 3 + 1 / 3)
    tokens, parents, probs, _ = longest.tree(1, 4, min_prob=0.1)
    assert tokens == [5, 6] and parents == [-1, -1] and probs == pytest.approx([2 / 3, 1 / 3])
    assert index.match([77, 78], depth=3) == []


def test_the_draft_length_follows_the_match_length():
    drafter = SuffixDrafter()
    row = [1, 2, 3, 4, 5, 6, 7, 8, 40, 41, 50, 8]  # "8" matched once (length 1), so 1 token; k allows 6
    ids = torch.tensor([row])
    drafter.start(ids, None, 64)
    assert drafter.propose(Rows(ids, [len(row)]), 6, DraftContext(None, False)).tokens.tolist() == [[40]]
    row = [1, 2, 3, 4, 5, 6, 7, 8, 40, 41, 42, 43, 2, 3, 4, 5, 6, 7, 8]  # a 7-token match: k caps it
    ids = torch.tensor([row])
    drafter.start(ids, None, 64)
    assert drafter.propose(Rows(ids, [len(row)]), 3, DraftContext(None, False)).tokens.tolist() == [[40, 41, 42]]


def test_nothing_matches_means_a_plain_step():
    drafter = SuffixDrafter()
    ids = torch.tensor([[1, 2, 3]])
    drafter.start(ids, None, 8)
    assert drafter.propose(Rows(ids, [3]), 4, DraftContext(None, False)).tokens.shape == (1, 0)
    assert drafter.stats()["suffix_misses"] == 1


# --- exactness -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", [None, "static"], ids=["chains", "trees"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_exact_batch_one_and_ragged_cold_and_warm(arch, tree):
    model = make_model(arch)
    spec = specdec.SpeculativeModel(model, "suffix", num_draft_tokens=5, tree=tree)
    ids, mask = left_padded([5, 11, 3], seed=1)
    single = model.generate(REPEATS, max_new_tokens=30, **GREEDY)
    batch = model.generate(ids, attention_mask=mask, max_new_tokens=30, **GREEDY)
    for _ in range(2):  # the second round drafts from the first round's outputs too
        assert torch.equal(spec.generate(REPEATS, max_new_tokens=30, **GREEDY), single)
        assert torch.equal(spec.generate(ids, attention_mask=mask, max_new_tokens=30, **GREEDY), batch)
    assert spec.last_stats.proposed > 0


def test_rows_that_stop_early_feed_the_cache_with_their_whole_output():
    model = make_model("llama")
    ids, mask = left_padded([4, 9], seed=3)
    eos = int(model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None)[0, -1])
    kwargs = dict(max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0)
    spec = specdec.SpeculativeModel(model, "suffix", num_draft_tokens=4)
    out = spec.generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, **kwargs))
    fed = spec.drafter.cache.contents()
    width = ids.shape[1]
    rows = [r[width:] for r in out.tolist()]
    row0 = rows[0][: rows[0].index(eos) + 1]  # row 0 stops at eos (padding after it is not output)
    assert row0 in fed and rows[1] in fed


def test_composite_suffix_is_exact_and_falls_back_to_the_model_drafter():
    model = make_model("llama")
    drafter = SuffixCompositeDrafter(specdec.drafters.ModelDrafter(perturbed_copy(model, 0.05)))
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4)
    ids, mask = left_padded([6, 2], seed=5)
    expected = model.generate(ids, attention_mask=mask, max_new_tokens=24, **GREEDY)
    for _ in range(2):
        assert torch.equal(spec.generate(ids, attention_mask=mask, max_new_tokens=24, **GREEDY), expected)
    stats = spec.last_stats.drafter_stats
    assert stats["model_steps"] > 0 and stats["lookup_steps"] > 0  # warm: the cache matches where the model did not
    assert spec.drafter.cache is cross_call_cache(spec.drafter) and spec.drafter.suffix.cache.tokens > 0


def test_composite_suffix_names_parse_and_learn_across_calls():
    spec = parse_draft("composite:suffix")
    assert (spec.kind, spec.inner, spec.scheme) == ("composite", "suffix", "int8")
    assert parse_draft("composite:suffix:int4").scheme == "int4"
    assert learns_across_calls("suffix") and learns_across_calls("composite:suffix")
    assert not learns_across_calls("composite") and not learns_across_calls("prompt-lookup")
    built = specdec.drafters.resolve_drafter("composite:suffix", make_model("llama"))
    assert isinstance(built, SuffixCompositeDrafter) and isinstance(built.suffix, SuffixDrafter)


def test_suffix_names():
    assert specdec.drafters.resolve_drafter("suffix:123", make_model("llama")).cache.budget == 123
    for bad in ("suffix:abc", "suffix:-1", "suffix:"):
        with pytest.raises(DraftSpecError, match="budget"):
            parse_draft(bad)


# --- the cross-call cache --------------------------------------------------------------------------------------


def test_a_second_call_with_the_same_pattern_takes_fewer_passes():
    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, "suffix", num_draft_tokens=6)
    prompt = torch.tensor([[11, 12, 13]])
    spec.generate(prompt, max_new_tokens=40, **GREEDY)
    cold = spec.last_stats
    spec.generate(prompt, max_new_tokens=40, **GREEDY)
    warm = spec.last_stats
    assert warm.drafter_stats["suffix_cache_steps"] > 0 and cold.drafter_stats["suffix_cache_steps"] == 0
    assert warm.new_tokens == cold.new_tokens
    assert warm.verifier_forwards < cold.verifier_forwards  # more tokens a pass from the cache


def test_a_cache_that_does_not_learn_stays_empty():
    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, "suffix", num_draft_tokens=4)
    spec.drafter.cache.learning = False
    spec.generate(REPEATS, max_new_tokens=10, **GREEDY)
    assert spec.drafter.cache.tokens == 0


def test_eviction_keeps_the_budget_and_drops_the_oldest():
    cache = SuffixCache(budget=50)
    seqs = [list(range(100 + 20 * i, 120 + 20 * i)) for i in range(6)]
    for s in seqs:
        cache.add(s)
        assert cache.tokens <= 50
    assert cache.contents() == seqs[-2:]
    assert cache.match([seqs[0][3]], 4) == []  # evicted: its index entries went with it
    assert cache.match([seqs[-1][3]], 4)[0].chain(4, 0.1)[0] == seqs[-1][4:8]
    cache.add(list(range(500, 580)))  # longer than the budget: its last 50 tokens
    assert cache.contents() == [list(range(530, 580))]
    with pytest.raises(SuffixCacheError, match="budget"):
        SuffixCache(budget=-1)


def test_save_load_roundtrip(tmp_path):
    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, "suffix", num_draft_tokens=4)
    spec.generate(REPEATS, max_new_tokens=12, **GREEDY)
    path = spec.drafter.save(tmp_path / "cache.json")
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"]  # no temporary file left behind
    fresh = specdec.SpeculativeModel(model, "suffix", num_draft_tokens=4)
    fresh.drafter.load(path)
    assert fresh.drafter.cache.contents() == spec.drafter.cache.contents() != []
    small = SuffixCache(budget=5)
    small.load(path)  # a smaller budget keeps the newest that fit
    assert small.tokens <= 5


@pytest.mark.parametrize("content, message", [
    (b"\x00\xff\xfe garbage", "not a suffix cache file"),
    (b'{"format": "specdec-suffix-cache", "version": 1, "sequ', "corrupted or truncated"),
    (b'{"format": "something-else"}', "not a suffix cache file"),
    (b'{"format": "specdec-suffix-cache", "version": 99, "sequences": []}', "version 99"),
    (b'{"format": "specdec-suffix-cache", "version": 1, "sequences": ["@@@"]}', "not base64"),
    (b'{"format": "specdec-suffix-cache", "version": 1, "sequences": ["AAA="]}', "int32"),
])
def test_bad_files_are_one_line_errors_and_leave_the_cache_alone(tmp_path, content, message):
    cache = SuffixCache()
    cache.add([1, 2, 3])
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(SuffixCacheError, match=message) as err:
        cache.load(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)
    assert cache.contents() == [[1, 2, 3]]
    with pytest.raises(SuffixCacheError, match="cannot read"):
        cache.load(tmp_path / "missing.json")


def test_a_failed_save_leaves_the_old_file(tmp_path, monkeypatch):
    cache = SuffixCache()
    cache.add([1, 2, 3])
    path = cache.save(tmp_path / "c.json")
    before = path.read_bytes()
    cache.add([4, 5, 6])

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("specdec.drafters.suffix_cache.os.replace", broken)
    with pytest.raises(OSError):
        cache.save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_threads_share_one_cache_and_stay_exact():
    model = make_model("llama")
    spec = specdec.SpeculativeModel(model, "suffix", num_draft_tokens=4)
    gen = torch.Generator(device="cpu").manual_seed(11)
    prompts = [torch.randint(3, 96, (1, 3 + 2 * i), generator=gen, device="cpu") for i in range(4)]
    expected = [model.generate(p, max_new_tokens=20, **GREEDY) for p in prompts]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda p: spec.generate(p, max_new_tokens=20, **GREEDY), prompts * 3))
    for i, got in enumerate(results):
        assert torch.equal(got, expected[i % len(prompts)]), f"call {i} differs"
    assert spec.drafter.cache.sequences == len(results)  # every call fed it


# --- the sampling law --------------------------------------------------------------------------------------------


def _tiny_vocab_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, initializer_range=0.4,
                            bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return tf.LlamaForCausalLM(config).eval()


class _BiasedSuffix(SuffixDrafter):
    """The negative control: deterministic drafts that claim to be drawn from a uniform ``q``, so the acceptance rule
    takes them far more often than the verifier would pick them (``min(1, p / q)`` with a small ``q``)."""

    def propose(self, rows, k, ctx):
        chain = super().propose(rows, k, ctx)
        if chain.num_tokens:
            chain.probs = torch.full((*chain.tokens.shape, ctx.vocab_size), 1 / ctx.vocab_size, device=rows.device)
        return chain


@pytest.mark.parametrize("tree", [None, "static"], ids=["chains", "trees"])
def test_sampled_sequences_follow_the_verifier_with_a_warm_cache(tree):
    verifier = _tiny_vocab_model(0)
    prompt = torch.tensor([[3, 1, 4, 3, 1]])
    steps, rows = 3, 1500
    spec = specdec.SpeculativeModel(verifier, "suffix", num_draft_tokens=3, tree=tree)
    gen = torch.Generator().manual_seed(42)
    sampling = dict(temperature=0.9, top_k=0, top_p=1.0)
    spec.generate(prompt.expand(64, -1), max_new_tokens=8, do_sample=True, generator=gen, **sampling)  # warms the cache
    out = spec.generate(prompt.expand(rows, -1), max_new_tokens=steps, do_sample=True, generator=gen, **sampling)
    assert spec.last_stats.drafter_stats["suffix_cache_steps"] > 0 and spec.last_stats.accepted > 0
    exact = exact_joint(verifier, prompt, steps, **sampling)
    assert chi2(tally(out[:, prompt.shape[1]:].tolist()), exact, rows) > ALPHA


def test_the_sampling_check_catches_drafts_taken_as_certain():
    """Negative control: drafts that misstate their ``q`` bias the output toward the cache's continuations; the same
    check must fail."""
    verifier = _tiny_vocab_model(0)
    prompt = torch.tensor([[3, 1, 4, 3, 1]])
    steps, rows = 3, 1500
    drafter = _BiasedSuffix()
    drafter.cache.add([3, 1, 4, 3, 1, 0, 0, 0, 0] * 4)  # a continuation the verifier rarely picks
    spec = specdec.SpeculativeModel(verifier, drafter, num_draft_tokens=3)
    gen = torch.Generator().manual_seed(42)
    sampling = dict(temperature=0.9, top_k=0, top_p=1.0)
    drafter.cache.learning = False
    out = spec.generate(prompt.expand(rows, -1), max_new_tokens=steps, do_sample=True, generator=gen, **sampling)
    exact = exact_joint(verifier, prompt, steps, **sampling)
    assert chi2(tally(out[:, prompt.shape[1]:].tolist()), exact, rows) < ALPHA


# --- the command line --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("suffix-cli")
    make_model("llama").save_pretrained(root)
    char_tokenizer().save_pretrained(root)
    return root


def test_cli_draft_suffix_runs(tiny_dir, capsys):
    assert main(["generate", "--model", str(tiny_dir), "--prompt", "abcabcabc", "--max-new-tokens", "6",
                 "--no-chat-template", "--draft", "suffix", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_cli_bad_suffix_budget_is_one_line(tiny_dir):
    with pytest.raises(SystemExit) as err:
        main(["generate", "--model", str(tiny_dir), "--prompt", "abc", "--max-new-tokens", "2", "--no-chat-template",
              "--draft", "suffix:lots"])
    assert str(err.value.code).startswith("error: ") and "budget" in str(err.value.code)


# --- specdec eval: cold and warm -----------------------------------------------------------------------------------


def test_eval_measures_suffix_cold_and_warm_without_leaks(tmp_path):
    from specdec.eval import EvalConfig, run_eval
    from specdec.eval.methods import MethodSpec, plan_methods

    names = [m.name for m in plan_methods(["hf"], ["suffix", "prompt-lookup"], [4])]
    assert names == ["hf", "specdec[suffix,k=4,cold]", "specdec[suffix,k=4,warm]", "specdec[prompt-lookup,k=4]"]
    assert all(MethodSpec.parse(n).name == n for n in names)
    model, tok = make_model("llama"), char_tokenizer()
    text = "abc def abc ghi"
    prompts = [{"id": "p0", "prompt": text}, {"id": "p1", "prompt": text}]  # the same text: p1's warm cache holds p0's
    run_eval(model, tok, prompts, EvalConfig(out_dir=tmp_path / "out", baselines=["hf"],
                                             draft=["suffix", "prompt-lookup"], num_draft_tokens=4, max_new_tokens=24,
                                             chat=False, progress=False, plots=False))
    records = {(r["prompt_id"], r["method"]): r for path in (tmp_path / "out").glob("records*.jsonl")
               for r in map(json.loads, path.read_text().splitlines())}
    cold, warm = "specdec[suffix,k=4,cold]", "specdec[suffix,k=4,warm]"
    assert records[("p0", cold)]["cache"] == "cold" and records[("p0", warm)]["cache"] == "warm"
    assert records[("p0", "hf")]["cache"] is None
    # the warm-up taught nothing: the first prompt is drafted as cold; the second learns from the first's output
    assert records[("p0", warm)]["verifier_passes"] == records[("p0", cold)]["verifier_passes"]
    assert records[("p1", warm)]["verifier_passes"] < records[("p1", cold)]["verifier_passes"]
    assert all(r["identical"] for r in records.values() if r["kind"] != "hf")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {m["name"]: m["cache"] for m in summary["methods"]} == {n: MethodSpec.parse(n).cache for n in names}


def test_every_method_with_a_cross_call_cache_owns_its_drafter():
    """Two warm methods (adaptive and not, two k) never share a cache: the second to run a prompt would find that
    prompt's own output in it."""
    from specdec.drafters.suffix import cross_call_cache
    from specdec.eval.measure import _cache_drafter
    from specdec.eval.methods import MethodSpec

    model, drafts = make_model("llama"), {}
    names = ["specdec[suffix,k=4,warm]", "specdec[suffix,k=4,adaptive,warm]", "specdec[suffix,k=2,warm]",
             "specdec[suffix,k=4,cold]"]
    caches = [cross_call_cache(_cache_drafter(drafts, MethodSpec.parse(n), model, None)) for n in names]
    assert len({id(c) for c in caches}) == len(names)
    assert [c.learning for c in caches] == [True, True, True, False]
