"""The head's chain draft as one fixed-shape region (``specdec.heads.static_draft``): what a CUDA graph captures.

Preconditions of graph replay, checked on this CPU: the region drafts what the eager head drafts, pass after pass
(every feed width, ragged rows, rows leaving); its ops and their shapes are the same every pass; dynamo traces it
whole (no graph break); it reads nothing back from the device. Then the compiled region keeps output exact.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.drafters.base import Drafter
from specdec.drafters import eagle as eagle_module
from specdec.drafters.eagle import EagleDrafter
from specdec.heads.static_draft import draft_chain, region_steps
from specdec.host_trace import HostTrace, sync_report
from test_eagle import _batch, _random_head
from tiny_models import make_model

NEW = 30


class _Twins(Drafter):
    """The same head drafting eagerly and through the static region, side by side: their drafts must agree every
    pass. It proposes the verifier's own greedy tokens (``reference``), so that passes accept 0..k drafts and the
    feeds take every width."""

    def __init__(self, head, model, reference: torch.Tensor) -> None:
        self.eager, self.static = EagleDrafter(head, model), EagleDrafter(head, model)
        self.static.static_draft = True
        self.hidden_layers, self.reference = self.eager.hidden_layers, reference
        self.static_passes = self.passes = 0

    def for_call(self):
        call = super().for_call()
        call.eager, call.static = self.eager.for_call(), self.static.for_call()
        return call

    def start(self, input_ids, attention_mask, max_len, *, verifier=None, hidden=None):
        self.eager.start(input_ids, attention_mask, max_len, verifier=verifier, hidden=hidden)
        self.static.start(input_ids, attention_mask, max_len, verifier=verifier, hidden=hidden)
        self.rows = list(range(input_ids.shape[0]))

    def propose(self, rows, k, ctx):
        fed_before = self.static._fed_hidden is not None
        a, b = self.eager.propose(rows, k, ctx), self.static.propose(rows, k, ctx)
        assert torch.equal(a.tokens, b.tokens)
        self.passes += 1
        self.static_passes += fed_before
        truth = torch.stack([self.reference[r, rows.length(i): rows.length(i) + k] for i, r in enumerate(self.rows)])
        wrong = (truth + 1) % 96
        # row i's drafts are right up to position (pass + i) % (k + 1): every acceptance count occurs
        cut = torch.tensor([(self.passes + i) % (k + 1) for i in range(len(rows))], device="cpu").unsqueeze(1)
        return type(a)(torch.where(torch.arange(k, device="cpu") < cut, truth, wrong))

    def commit(self, update):
        self.eager.commit(update)
        self.static.commit(update)

    def keep_rows(self, indices):
        self.rows = [self.rows[i] for i in indices.tolist()]
        self.eager.keep_rows(indices)
        self.static.keep_rows(indices)

    def finish(self):
        self.eager.finish()
        self.static.finish()


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
@pytest.mark.parametrize("batch", [1, 3])
def test_the_static_region_drafts_what_the_eager_head_drafts(kind, batch):
    model = make_model("llama")
    ids, mask = _batch(rows=batch)
    gen = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    reference = model.generate(ids, **gen)
    twins = _Twins(_random_head(model, kind), model, torch.nn.functional.pad(reference, (0, 8)))
    spec = specdec.SpeculativeModel(model, twins, num_draft_tokens=3)
    assert torch.equal(spec.generate(ids, **gen), reference)
    assert spec.last_stats.accepted > 0 and twins.static_passes >= twins.passes - 1  # all but the prompt's feed


def test_the_regions_ops_and_shapes_are_the_same_every_pass_and_it_reads_nothing_back():
    model = make_model("llama")
    drafter = EagleDrafter(_random_head(model, "eagle3"), model)
    drafter.static_draft = True
    ids, mask = _batch(rows=3)
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4)
    with HostTrace(signatures=("draft",)) as trace:
        trace.mark_engine()
        trace.wrap(eagle_module, "draft_chain", region="draft")  # the region a graph captures
        spec.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    regions = [r.trace["draft"] for r in trace.steady() if "draft" in r.trace]
    assert len(regions) >= 10
    assert all(region == regions[0] for region in regions)  # one graph replays every pass
    assert max(r.sync_count for r in trace.steady()) <= 1, sync_report(trace)


def _region_inputs(drafter: EagleDrafter, batch: int = 2, steps: int = 4, slots: int = 64):
    c, p = drafter.head.config, next(drafter.head.parameters())
    keys = [torch.zeros(batch, slots, c.num_key_value_heads, c.head_dim, device=p.device) for _ in range(1)]
    values = [torch.zeros_like(keys[0])]
    return (drafter.head, keys, values, torch.tensor([5, 9][:batch], device=p.device),
            torch.randint(3, 90, (batch, steps + 1), device=p.device),
            torch.randn(batch, steps + 1, c.fc_in_features, device=p.device), torch.tensor([1, 3][:batch], device=p.device),
            steps)


def test_dynamo_traces_the_region_whole():
    model = make_model("llama")
    drafter = EagleDrafter(_random_head(model, "eagle3"), model)
    explained = torch._dynamo.explain(draft_chain)(*_region_inputs(drafter))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_region_steps_round_k_up_to_a_power_of_two():
    assert [region_steps(k) for k in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]


@pytest.mark.slow
def test_compile_drafter_captures_the_heads_chain_and_stays_exact():
    """``compile_drafter=True``: the region is compiled whole (inductor on a CPU, CUDA graphs on a GPU); output
    stays the verifier's."""
    model = make_model("llama")
    drafter = EagleDrafter(_random_head(model, "eagle3"), model)
    spec = specdec.SpeculativeModel(model, drafter, num_draft_tokens=4, compile_drafter=True)
    assert drafter.static_draft
    for batch in (1, 3):
        ids, mask = _batch(rows=batch)
        gen = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        assert torch.equal(spec.generate(ids, **gen), model.generate(ids, **gen))
    assert "chain-4" in drafter._compiled  # it ran compiled: a failed compilation empties the dict
