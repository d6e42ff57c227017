"""Ragged batches: every row gets exactly what it would get alone, however many drafts it accepts."""

import pytest
import torch

import specdec
from specdec.runners import CausalLMRunner
from tiny_models import VOCAB, make_model, perturbed_copy


def _left_pad(prompts: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
    return ids, mask


def _prompts(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2", "qwen2", "gpt_neox"])
@pytest.mark.parametrize("lengths", [[3, 19], [1, 30, 7, 12], [5, 2, 25, 9, 14, 1, 3, 8]], ids=["b2", "b4", "b8"])
def test_each_row_equals_its_single_row_generate(arch, lengths):
    model = make_model(arch)
    prompts = _prompts(lengths, seed=len(lengths))
    ids, mask = _left_pad(prompts)
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=4)
    out = spec.generate(ids, attention_mask=mask, **kwargs)
    for r, p in enumerate(prompts):
        alone = model.generate(p.unsqueeze(0), **kwargs)[0, len(p):]
        assert torch.equal(out[r, ids.shape[1]:], alone), f"row {r}"
    # rows really were ragged: different rows accepted different numbers of drafts in one pass
    assert len(set(spec.last_stats.committed_per_step)) > 1


def test_rows_finishing_at_different_steps_and_eos_inside_a_block():
    model = make_model("llama")
    prompts = _prompts([4, 9, 6], seed=3)
    free = [model.generate(p.unsqueeze(0), max_new_tokens=30, do_sample=False, eos_token_id=None)[0, len(p):] for p in prompts]
    eos = int(free[0][5])  # row 0 ends at its 6th token; others whenever they meet it, if ever
    ids, mask = _left_pad(prompts)
    kwargs = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=0)
    spec = specdec.SpeculativeModel(model, model, num_draft_tokens=8)  # EOS arrives inside accepted blocks
    got = spec.generate(ids, **kwargs)
    assert torch.equal(got, model.generate(ids, **kwargs))
    for r, p in enumerate(prompts):
        alone = model.generate(p.unsqueeze(0), max_new_tokens=30, do_sample=False, eos_token_id=eos, pad_token_id=0)
        n = alone.shape[1] - len(p)
        assert torch.equal(got[r, ids.shape[1]: ids.shape[1] + n], alone[0, len(p):])
        assert (got[r, ids.shape[1] + n:] == 0).all()  # padded after its EOS


def test_finished_rows_leave_the_batch():
    model = make_model("llama")
    prompts = _prompts([4, 4], seed=3)
    eos = int(model.generate(prompts[0].unsqueeze(0), max_new_tokens=3, do_sample=False, eos_token_id=None)[0, -1])
    ids, mask = _left_pad(prompts)
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=2)
    spec.generate(ids, attention_mask=mask, max_new_tokens=40, do_sample=False, eos_token_id=eos, pad_token_id=0)
    stats = spec.last_stats
    # a row that stopped early contributes no more proposals: fewer than 2 rows x passes x k
    assert stats.proposed < 2 * stats.verifier_forwards * 2


def test_custom_stop_without_eos_keeps_rows_running_like_generate():
    """Without an EOS criterion generate extends finished rows until all stop; so must we."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StopAt(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == 11

    model = make_model("gpt2")
    prompts = _prompts([3, 8, 5], seed=1)
    ids, mask = _left_pad(prompts)
    kwargs = dict(attention_mask=mask, max_new_tokens=25, do_sample=False, eos_token_id=None, pad_token_id=0,
                  stopping_criteria=StoppingCriteriaList([StopAt()]))
    got = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3).generate(ids, **kwargs)
    assert torch.equal(got, model.generate(ids, **kwargs))


def test_holes_and_filler_slots_are_never_attended():
    """Garbage written into every invalid slot does not change a row's next logits."""
    model = make_model("qwen2")
    ids, mask = _left_pad(_prompts([3, 7], seed=2))
    runner, _ = CausalLMRunner(model).prefill(ids, mask.bool(), 64)
    runner.forward(torch.tensor([[5, 6, 7], [8, 9, 10]]))
    runner.keep(runner.counts - torch.tensor([2, 0]))  # row 0 rejects two tokens: holes
    probe = torch.tensor([[20], [21]])
    clean = runner.forward(probe).logits
    runner.keep(runner.counts - 1)
    with torch.inference_mode():
        for layer in runner.cache.layers:
            for buf in (layer.keys, layer.values):
                buf.transpose(1, 2)[~runner.valid] = 1e4  # every hole and pad slot, all heads
    torch.testing.assert_close(runner.forward(probe).logits, clean)


def test_compaction_preserves_every_row():
    model = make_model("llama")
    ids, mask = _left_pad(_prompts([2, 6, 4], seed=4))
    runner, _ = CausalLMRunner(model).prefill(ids, mask.bool(), 64)
    runner.forward(torch.tensor([[5, 6, 7]] * 3))
    runner.keep(runner.counts - torch.tensor([3, 1, 0]))
    before = runner.length
    probe = torch.tensor([[30], [31], [32]])
    clean = runner.forward(probe).logits
    runner.keep(runner.counts - 1)
    runner.compact()
    assert runner.length == int(runner.counts.max()) < before
    torch.testing.assert_close(runner.forward(probe).logits, clean, rtol=1e-4, atol=1e-5)


def test_tight_cache_compacts_instead_of_overflowing():
    model = make_model("mistral")  # sliding window 16, counted in positions: holes stay until the slots run out
    prompts = _prompts([2, 21, 9], seed=5)
    ids, mask = _left_pad(prompts)
    kwargs = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    got = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=5).generate(ids, attention_mask=mask, **kwargs)
    for r, p in enumerate(prompts):
        assert torch.equal(got[r, ids.shape[1]:], model.generate(p.unsqueeze(0), **kwargs)[0, len(p):])


def test_batch_streaming_and_scores_refused():
    model = make_model("llama")
    ids, mask = _left_pad(_prompts([3, 5]))
    spec = specdec.SpeculativeModel(model, model)
    with pytest.raises(NotImplementedError, match="batch size 1"):
        spec.generate(ids, attention_mask=mask, max_new_tokens=4, streamer=object())
    with pytest.raises(NotImplementedError, match="batch size 1"):
        spec.generate(ids, attention_mask=mask, max_new_tokens=4, return_dict_in_generate=True, output_scores=True)


def test_per_row_statistics_add_up_to_the_batch_totals():
    model = make_model("llama")
    prompts = _prompts([3, 17, 8], seed=5)
    ids, mask = _left_pad(prompts)
    eos = int(model.generate(prompts[0].unsqueeze(0), max_new_tokens=4, do_sample=False, eos_token_id=None)[0, -1])
    spec = specdec.SpeculativeModel(model, perturbed_copy(model, 0.05), num_draft_tokens=3)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0)
    stats = spec.last_stats
    rows = stats.rows
    assert len(rows) == 3
    assert sum(r.proposed for r in rows) == stats.proposed
    assert sum(r.accepted for r in rows) == stats.accepted
    assert sum(r.committed for r in rows) == sum(stats.committed_per_step)
    for i in range(len(stats.proposed_per_position)):
        assert sum(r.proposed_per_position[i] for r in rows if i < len(r.proposed_per_position)) == stats.proposed_per_position[i]
        assert sum(r.accepted_per_position[i] for r in rows if i < len(r.accepted_per_position)) == stats.accepted_per_position[i]
    # each row's committed tokens are its new tokens minus the prefill's first one (up to its EOS)
    for r, row in enumerate(rows):
        new = out[r, ids.shape[1]:].tolist()
        n = new.index(eos) + 1 if eos in new else len(new)
        assert row.committed == n - 1, f"row {r}"
        assert row.accepted == sum(row.accepted_lengths)
        assert len(row.accepted_lengths) == row.verifier_passes
    # row 0 stopped after 4 tokens: it took part in fewer passes than the longest row
    assert rows[0].verifier_passes < max(r.verifier_passes for r in rows)
    assert stats.to_dict()["rows"][1]["mean_accepted_length"] == pytest.approx(rows[1].mean_accepted_length)
