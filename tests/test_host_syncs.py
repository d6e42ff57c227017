"""One device read per chain pass: counted, per pass, by ``specdec.host_trace.HostTrace``.

On a GPU every device-to-host read (``.tolist()``, ``bool(t)``, ``nonzero``, a blocking upload) drains the launch
queue. A chain pass needs exactly one: the accepted counts and committed tokens. Everything the loop decides after
it (stops, stats, draft length, cache trimming, the drafters' bookkeeping) runs on host ints. These tests count
the reads on this CPU, where they are free but still visible, for every drafter kind, greedy and sampling, one row
and a ragged batch, with stop rules on. ``tests/test_cuda.py`` counts the same on a GPU.
"""

from __future__ import annotations

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import specdec
from specdec.drafters.eagle import EagleDrafter
from specdec.host_trace import HostTrace, sync_report
from test_eagle import _batch, _random_head
from tiny_models import make_model

DRAFTERS = ["eagle", "self:int8", "prompt-lookup", "composite:int8"]


@pytest.fixture(scope="module")
def model():
    return make_model("llama")


def _spec(model, kind: str, **kwargs) -> specdec.SpeculativeModel:
    draft = EagleDrafter(_random_head(model, "eagle3"), model) if kind == "eagle" else kind
    return specdec.SpeculativeModel(model, draft, num_draft_tokens=4, **kwargs)


def _traced(spec, ids, mask, **gen) -> tuple[HostTrace, torch.Tensor]:
    with HostTrace() as trace:
        trace.mark_engine()
        out = spec.generate(ids, attention_mask=mask, pad_token_id=0, **gen)
    return trace, out


def _assert_one_read_per_pass(trace: HostTrace, bound: int = 1) -> None:
    steady = trace.steady()
    assert len(steady) >= 3, sync_report(trace)
    assert max(r.sync_count for r in steady) <= bound, sync_report(trace)


@pytest.mark.parametrize("kind", DRAFTERS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sample"])
def test_a_chain_pass_reads_the_device_once(model, kind, batch, sample):
    ids, mask = _batch(rows=batch)
    gen = dict(max_new_tokens=32, do_sample=sample, eos_token_id=[2, 7])  # several EOS ids: host stop rules
    if sample:  # min_new_tokens: a processor that reads the length, and enough passes before an EOS
        gen.update(temperature=0.8, top_k=30, min_new_tokens=24)
    spec = _spec(model, kind)
    trace, out = _traced(spec, ids, mask, **gen)
    _assert_one_read_per_pass(trace)
    if not sample:
        assert torch.equal(out, model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                                               max_new_tokens=32, eos_token_id=[2, 7]))


def test_compiled_verify_passes_read_the_device_once(model):
    spec = _spec(model, "prompt-lookup", compile_verifier=True)
    ids, mask = _batch(rows=3)
    trace, out = _traced(spec, ids, mask, max_new_tokens=24, do_sample=False)
    _assert_one_read_per_pass(trace)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=24))


class _NeverStop(StoppingCriteria):
    """A user's own criterion: checked on the device, so it costs its own read."""

    calls = 0

    def __call__(self, input_ids, scores, **kwargs):
        type(self).calls += 1
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def test_a_users_own_stopping_criterion_is_called_once_per_pass_not_per_token(model):
    ids, mask = _batch(rows=3)
    spec = _spec(model, "self:int8")
    _NeverStop.calls = 0
    trace, out = _traced(spec, ids, mask, max_new_tokens=24, do_sample=False,
                         stopping_criteria=StoppingCriteriaList([_NeverStop()]))
    _assert_one_read_per_pass(trace, bound=2)
    passes = spec.last_stats.verifier_forwards
    assert _NeverStop.calls <= passes + 1 < spec.last_stats.new_tokens  # one call a pass (+ the first token)
    assert torch.equal(out, model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=24))


def test_stop_strings_are_exact_and_cost_one_read_a_pass():
    from tiny_models import char_tokenizer

    model, tok = make_model("llama"), char_tokenizer()
    ids = torch.tensor([tok.encode("abab ab")], device="cpu")
    gen = dict(max_new_tokens=30, do_sample=False, pad_token_id=0)
    ref = model.generate(ids, tokenizer=tok, stop_strings=["a"], **gen)
    spec = _spec(model, "prompt-lookup")
    trace, out = _traced(spec, ids, None, tokenizer=tok, stop_strings=["a"], max_new_tokens=30, do_sample=False)
    assert torch.equal(out, ref)
    assert all(r.sync_count <= 2 for r in trace.passes), sync_report(trace)


# ---- a ragged batch in which a row retires: every pass counted, retirements included ---------------------------

def _an_early_eos(model, ids, mask, new: int) -> int:
    """A token that one row's greedy continuation emits early (as its 5th to 12th token) and no other row emits
    within ``new`` tokens: with it as EOS, that row alone retires early."""
    ref = model.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=new)
    rows = ref[:, ids.shape[1]:].tolist()
    for r, row in enumerate(rows):
        for i, token in enumerate(row[4:12], start=4):
            if token not in row[:i] and all(token not in other for o, other in enumerate(rows) if o != r):
                return token
    raise AssertionError(f"no early EOS for a single row in {rows}")


@pytest.mark.parametrize("kind", DRAFTERS)
def test_a_ragged_batch_reads_the_device_once_every_pass_through_retirements(model, kind):
    """Prompts of 9, 7 and 5 tokens (left padded), one row stopping early at an EOS: every pass, those after which
    a row leaves and the last included, makes exactly one blocking read (``Verified.read``), counted at the
    dispatch level (scalar reads under inference mode, ``nonzero``, ``tolist``/``cpu``, blocking uploads). The
    padding makes every session non-dense: its forwards take a 4-D mask built on the device, where a 2-D one
    would be read back by transformers on every 1-token forward."""
    ids, mask = _batch(rows=3)
    eos = _an_early_eos(model, ids, mask, new=40)
    gen = dict(max_new_tokens=40, do_sample=False, eos_token_id=eos)
    trace, out = _traced(_spec(model, kind), ids, mask, **gen)
    batches = [r.batch for r in trace.passes]
    assert batches[0] == 3 and min(batches) < 3, batches  # a row left between passes, the others went on
    assert len(trace.passes) >= 5
    assert trace.sync_counts() == [1] * len(trace.passes), sync_report(trace, trace.every_pass())
    assert all(what == "Tensor.tolist" and site.startswith("verification.py") for (what, site) in
               trace.sync_sites(trace.every_pass())), sync_report(trace, trace.every_pass())
    assert torch.equal(out, model.generate(ids, attention_mask=mask, pad_token_id=0, **gen))


# ---- the counter itself: it must see what it claims to see ------------------------------------------------------

def test_the_trace_counts_every_kind_of_device_read():
    t = torch.arange(6, device="cpu")
    device = torch.device("cpu")  # not the literal "cpu": stands for the accelerator the code runs on
    with HostTrace() as trace:
        t[0].item()
        bool(t[1] > 0)
        int(t.sum())
        t.tolist()
        t.nonzero()
        t[t > 2]
        torch.tensor([1, 2], device=device)
        torch.tensor([1, 2], device="cpu").to(device)  # a blocking upload of host data
        t.cpu()
    whats = [what for what, _ in trace.records[0].syncs]
    assert whats == ["_local_scalar_dense", "_local_scalar_dense", "_local_scalar_dense", "Tensor.tolist", "nonzero",
                     "index", "torch.tensor(device=...)", "Tensor.to(device)", "Tensor.cpu"]


def test_the_trace_counts_scalar_reads_under_inference_mode():
    """Every specdec forward runs under ``torch.inference_mode()``, where ``bool``, ``.item()``, ``int`` and
    ``float`` reach a dispatch mode as ``item`` / ``is_nonzero``, not as ``_local_scalar_dense``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Names(TorchDispatchMode):  # the negative control: which ops a dispatch mode sees
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    def reads(t, f):
        bool(t[1] > 0)
        t[0].item()
        int(t.sum())
        float(f)

    with torch.inference_mode():
        t, f = torch.arange(6, device="cpu"), torch.ones((), device="cpu")
        with Names() as names:
            reads(t, f)
        with HostTrace() as trace:
            reads(t, f)
    # what the old counter looked for (``_local_scalar_dense`` at the dispatch level) is not there: it counted 0
    assert names.names.count("aten::_local_scalar_dense") == 0
    assert [what for what, _ in trace.records[0].syncs] == ["_local_scalar_dense"] * 4
    assert trace.records[0].syncs[0][1] == "outside specdec"  # a site is still attributed


def test_the_trace_does_not_count_device_work_or_host_bookkeeping():
    t = torch.arange(6, device="cpu")
    with HostTrace() as trace:
        u = (t * 2).cumsum(0).index_select(0, t.argmax().view(1))  # device ops, a tensor index: no read
        torch.tensor([1, 2], device="cpu").tolist()  # host bookkeeping, read on the host
        u.to(u.device)  # a device tensor to its own device: a no-op
    assert trace.records[0].sync_count == 0
    assert trace.records[0].op_count >= 4


class _ChattyLookup(specdec.drafters.PromptLookupDrafter):
    """A drafter that reads the device every pass (the negative control)."""

    def propose(self, rows, k, ctx):
        rows.tokens.sum().item()
        return super().propose(rows, k, ctx)


def test_a_drafter_that_reads_the_device_is_caught(model):
    ids, mask = _batch(rows=1)
    trace, _ = _traced(specdec.SpeculativeModel(model, _ChattyLookup(), num_draft_tokens=4), ids, mask,
                       max_new_tokens=16, do_sample=False)
    assert min(r.sync_count for r in trace.steady()) == 2
    assert any("propose" in site for (_, site) in trace.sync_sites())
