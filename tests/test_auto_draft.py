"""``draft="auto"``: the drafter with the best measured tokens a second, chosen once, exact like any other.

The choice itself is timing (machine-dependent), so what is tested here is what does not depend on the clock: the
chosen drafter is the one the measurements rank first, it is measured once per model whatever the threads, the
candidates left out say why, the calibration teaches a cross-call cache nothing, and the output is
``model.generate``'s. The speed of the choice is measured in BENCHMARKS.md (section 25).
"""

from __future__ import annotations

import threading

import pytest
import torch

from specdec import SpeculativeModel
from specdec.drafters import resolve_drafter
from specdec.drafters.auto import AutoChoice, AutoDraftError, AutoDrafter, Calibration, Candidate
from specdec.drafters.base import Drafter
from specdec.drafters.suffix import cross_call_cache
from specdec.engine import speculative_generate
from specdec.arguments import prepare_generation
from specdec.chains import ChainPlan
from tiny_models import char_tokenizer, make_model
from test_quant_grid import grid_snapped_llama


@pytest.fixture(scope="module")
def tiny():
    return make_model("llama"), char_tokenizer()


def _ids(tok, text="Tell me about the sea. The sea is"):
    return tok(text, return_tensors="pt").input_ids


def test_auto_is_exact_and_says_what_it_chose(tiny):
    model, tok = tiny
    fast = SpeculativeModel(model, "auto", tokenizer=tok, num_draft_tokens=3)
    assert fast.drafter.choice is None  # nothing measured before the first call
    ids = _ids(tok)
    out = fast.generate(ids, max_new_tokens=20, do_sample=False)
    assert torch.equal(out, model.generate(ids, max_new_tokens=20, do_sample=False))
    choice = fast.last_stats.draft_choice
    ranking = choice["ranking"]
    assert choice["chosen"] == ranking[0]["draft"] and choice["k"] == 3
    assert [r["tokens_per_s"] for r in ranking] == sorted((r["tokens_per_s"] for r in ranking), reverse=True)
    assert {"prompt-lookup", "suffix", "self:int8"} <= {r["draft"] for r in ranking}
    assert {"draft": "eagle", "why": "no head ships for this model"} in choice["skipped"]
    assert choice["reason"].startswith(f"{choice['chosen']}: ") and "tokens/s" in choice["reason"]
    assert fast.last_stats.to_dict()["draft_choice"] == choice


def test_auto_chooses_once_per_model_even_when_first_calls_race(tiny):
    model, tok = tiny
    fast = SpeculativeModel(model, "auto", tokenizer=tok, num_draft_tokens=2)
    measured = []
    calibrate = fast.strategy.calibrate
    fast.drafter._measure = lambda d, p: measured.append(d) or calibrate(d, p)
    ids = _ids(tok)
    outs = [None, None]

    def run(i):
        outs[i] = fast.generate(ids, max_new_tokens=12, do_sample=False)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    count = len(measured)
    decision = fast.drafter.decision
    fast.generate(ids, max_new_tokens=12, do_sample=False)
    assert len(measured) == count and fast.drafter.decision is decision  # not measured again
    assert torch.equal(outs[0], outs[1])


class _Fake(Drafter):
    """A drafter that proposes nothing; the measurement is faked by name."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.compiled = False

    @property
    def compilable(self) -> bool:
        return True

    def compile(self) -> None:
        self.compiled = True


def _fake_auto(model, tok, rates: dict[str, float], names: list[str]):
    """An AutoDrafter over fake candidates whose measured rates are ``rates`` (a name's composite: its own key)."""
    drafter = AutoDrafter(model, tok, build=_Fake, candidates=names)
    calls: list[str] = []

    def measure(d, prompts):
        name = getattr(d, "name", None) or "composite:" + d.inner.name.partition(":")[2]
        calls.append(name)
        return Calibration(tokens=int(rates[name] * 10), passes=10, decode_seconds=10.0)

    drafter.attach(measure, k=4)
    return drafter, calls


def test_auto_takes_the_fastest_and_adds_the_composite_of_the_best_scheme(tiny):
    model, tok = tiny
    rates = {"prompt-lookup": 20, "self:int8": 30, "self:bf16": 25, "composite:int8": 35}
    drafter, calls = _fake_auto(model, tok, rates, ["prompt-lookup", "self:int8", "self:bf16"])
    chosen = drafter.choose()
    assert drafter.decision.chosen == "composite:int8" and chosen.inner.name == "self:int8"
    # the first candidate also warms the verifier up (measured once more, untimed); the slower copy is dropped once
    # measured (one copy in memory at a time); the three leaders still held are measured again, in reverse order
    assert calls == ["prompt-lookup", "prompt-lookup", "self:int8", "self:bf16", "composite:int8",
                     "prompt-lookup", "self:int8", "composite:int8"]
    ranking = [c.draft for c in drafter.decision.ranking()]
    assert ranking == ["composite:int8", "self:int8", "prompt-lookup", "self:bf16"]  # the copy let go comes last
    assert [c.released for c in drafter.decision.ranking()] == [False, False, False, True]
    assert "1.17x the next (self:int8" in drafter.decision.reason()


def test_auto_ranks_the_chosen_drafter_first_even_below_a_copy_it_let_go(tiny):
    """A copy let go keeps the one rate it measured early; the leaders are measured again and may fall below it. The
    ranking still opens with what was chosen (the demo's JSON contract: chosen == ranking[0])."""
    model, tok = tiny
    drafter = AutoDrafter(model, tok, build=_Fake, candidates=["self:int8", "self:bf16"])
    seen: dict[str, int] = {}

    def measure(d, prompts):
        name = getattr(d, "name", None) or "composite:" + d.inner.name.partition(":")[2]
        seen[name] = seen.get(name, 0) + 1
        rate = {"self:bf16": 25, "composite:int8": 12}.get(name, 30 if seen[name] <= 2 else 10)
        return Calibration(tokens=int(rate * 10), passes=10, decode_seconds=10.0)

    drafter.attach(measure, k=4)
    drafter.choose()
    choice = drafter.decision
    assert choice.chosen == "self:int8"
    assert choice.to_dict()["ranking"][0]["draft"] == choice.chosen
    assert [(c.draft, c.released) for c in choice.ranking()] == [
        ("self:int8", False), ("composite:int8", False), ("self:bf16", True)]
    assert "let go" in choice.table()


def test_auto_keeps_compile_drafter_for_the_chosen_drafter(tiny):
    model, tok = tiny
    drafter, _ = _fake_auto(model, tok, {"prompt-lookup": 20, "suffix": 30}, ["prompt-lookup", "suffix"])
    drafter.compile()  # as SpeculativeModel(compile_drafter=True) does before anything is measured
    assert drafter.choose().name == "suffix" and drafter.choose().compiled


def test_auto_lists_what_it_left_out(tiny):
    model, tok = tiny
    snapped = grid_snapped_llama()
    fast = SpeculativeModel(snapped, "auto", tokenizer=tok, num_draft_tokens=2)
    fast.prime()
    skipped = {s["draft"]: s["why"] for s in fast.drafter.choice["skipped"]}
    assert skipped["self:int4+head8"].startswith("grid-bound")
    assert "self:int4+head8" not in {r["draft"] for r in fast.drafter.choice["ranking"]}

    def broken(name):
        raise AutoDraftError(f"{name} cannot be built here")

    drafter = AutoDrafter(model, tok, build=broken, candidates=["self:int8"])
    drafter.attach(lambda d, p: Calibration(), k=2)
    with pytest.raises(AutoDraftError, match="no drafter could run here: self:int8: AutoDraftError: self:int8 cannot"):
        drafter.choose()


def test_auto_with_a_tree_takes_only_tree_drafters(tiny):
    model, tok = tiny
    fast = SpeculativeModel(model, "auto", tokenizer=tok, num_draft_tokens=2, tree="static")
    ids = _ids(tok)
    out = fast.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(out, model.generate(ids, max_new_tokens=12, do_sample=False))
    assert fast.drafter.supports_tree and fast.last_stats.tree["mode"] == "static"


def test_auto_calibration_teaches_the_suffix_cache_nothing(tiny):
    model, tok = tiny
    fast = SpeculativeModel(model, AutoDrafter(model, tok, lambda n: resolve_drafter(n, model), ["suffix"]),
                            tokenizer=tok, num_draft_tokens=2)
    fast.prime()
    cache = cross_call_cache(fast.drafter.choose())
    assert cache is not None and cache.learning and cache.tokens == 0


def test_auto_refuses_without_a_tokenizer_or_outside_a_model(tiny):
    model, tok = tiny
    with pytest.raises(AutoDraftError, match="pass the verifier's tokenizer"):
        SpeculativeModel(model, "auto")
    from specdec.runners.hf import CausalLMRunner

    drafter = resolve_drafter("auto", model, verifier_tokenizer=tok)
    setup = prepare_generation(model, _ids(tok), max_new_tokens=4, do_sample=False)
    with pytest.raises(AutoDraftError, match="inside a SpeculativeModel"):
        speculative_generate(CausalLMRunner(model), drafter, setup, ChainPlan.fixed(2))


def test_choice_table_and_dict_agree():
    c = AutoChoice("b", 4, [Candidate("a", Calibration(10, 5, 1.0, 0.1)), Candidate("b", Calibration(30, 10, 1.0, 0.5)),
                            Candidate("c", skipped="no backend for int8 on cuda")])
    data = c.to_dict()
    assert [r["draft"] for r in data["ranking"]] == ["b", "a"] and data["ranking"][0]["tokens_per_s"] == 30.0
    assert data["ranking"][0]["pass_ms"] == 100.0 and data["ranking"][0]["draft_ms_per_pass"] == 50.0
    assert data["skipped"] == [{"draft": "c", "why": "no backend for int8 on cuda"}]
    table = c.table().splitlines()
    assert table[1].startswith("b *") and table[-1].startswith("c") and "left out: no backend" in table[-1]
