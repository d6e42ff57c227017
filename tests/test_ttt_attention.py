"""The CPU training-time-test attention (flash over the causal block, merged with the chain's keys by their
log-sum-exps) equals the masked attention over every step's keys: outputs and every gradient, each step, short
and long rows; and a whole training loss and its gradients equal the masked path's."""

from __future__ import annotations

import pytest
import torch

from specdec.training.ttt_attention import flash_ttt_available, ttt_attention
from specdec.training.train import TrainingKeyValues

pytestmark = pytest.mark.skipif(not flash_ttt_available(torch.device("cpu")), reason="no CPU flash kernel")


def _masked(q, keys, values, mask):
    return torch.nn.functional.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2),
                                                            attn_mask=mask.unsqueeze(1))


@pytest.mark.parametrize("n,steps", [(9, 5), (3, 5), (1, 3), (40, 4)])
def test_equals_the_masked_attention_with_gradients(n, steps):
    g = torch.Generator().manual_seed(n)
    b, h, d = 2, 3, 8
    kv = TrainingKeyValues(n, torch.device("cpu"))
    for s in range(steps):
        q = torch.randn(b, h, n, d, generator=g, requires_grad=True)
        keys = [torch.randn(b, h, n, d, generator=g, requires_grad=True) for _ in range(s + 1)]
        values = [torch.randn(b, h, n, d, generator=g, requires_grad=True) for _ in range(s + 1)]
        mask = kv.mask()
        want = _masked(q, keys, values, mask)
        got = ttt_attention(q, keys, values)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4), f"step {s}"
        up = torch.randn(want.shape, generator=g)
        grads_want = torch.autograd.grad((want * up).sum(), [q, *keys, *values])
        grads_got = torch.autograd.grad((got * up).sum(), [q, *keys, *values])
        for name, a, e in zip(["q"] + [f"k{j}" for j in range(s + 1)] + [f"v{j}" for j in range(s + 1)], grads_got, grads_want):
            assert torch.allclose(a, e, atol=1e-5, rtol=1e-4), f"step {s}: d{name} differs by {(a - e).abs().max()}"
        kv.next_step()


def test_a_wrong_merge_is_caught():
    """Negative control: merging with the block's own log-sum-exp in the backward (the trap SpecForge fixed)
    gives other gradients, which the comparison above would catch."""
    import specdec.training.ttt_attention as ta

    g = torch.Generator().manual_seed(0)
    n, s = 7, 2
    q = torch.randn(1, 2, n, 8, generator=g, requires_grad=True)
    keys = [torch.randn(1, 2, n, 8, generator=g, requires_grad=True) for _ in range(s + 1)]
    values = [torch.randn(1, 2, n, 8, generator=g, requires_grad=True) for _ in range(s + 1)]
    kv = TrainingKeyValues(n, torch.device("cpu"))
    kv.step = s
    want = torch.autograd.grad(_masked(q, keys, values, kv.mask()).sum(), keys[0])[0]
    real = ta._FLASH_BACKWARD

    def block_only(grad, qb, k0, v0, out, lse, *args, **kwargs):  # the block's own output and lse
        o, l0 = ta._FLASH(qb, k0, v0, 0.0, True, scale=kwargs["scale"])[:2]
        return real(grad, qb, k0, v0, o, l0, *args, **kwargs)

    ta._FLASH_BACKWARD = block_only
    try:
        wrong = torch.autograd.grad(ttt_attention(q, keys, values).sum(), keys[0])[0]
    finally:
        ta._FLASH_BACKWARD = real
    assert not torch.allclose(wrong, want, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_loss_and_gradients_equal_the_masked_path(dtype, monkeypatch):
    """A whole training step (EAGLE-3 head, 5 training-time steps, ragged rows) through the flash path gives the
    masked path's loss and gradients (bf16: within bf16 rounding)."""
    import specdec.training.train as train_mod
    from specdec.heads.config import HeadConfig
    from tiny_models import make_model

    model = make_model("llama")
    config = HeadConfig.for_verifier(model.config, "eagle3", draft_vocab_size=None)
    g = torch.Generator().manual_seed(0)
    head = train_mod.init_head(config, model, torch.arange(config.vocab_size))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    lengths = torch.tensor([14, 9])
    ids = torch.randint(3, 90, (2, 14), generator=g)
    hidden = torch.randn(2, 14, 3 * config.hidden_size, generator=g)
    final = torch.randn(2, 14, config.hidden_size, generator=g)
    top = torch.randint(3, 90, (2, 14), generator=g)
    batch = {"input_ids": ids, "hidden": hidden, "final": final, "top": top, "lengths": lengths,
             "prompt_lengths": torch.tensor([4, 3])}
    embed, target = model.get_input_embeddings(), model.get_output_embeddings()
    results, calls = {}, []
    real = train_mod.TrainingKeyValues.__init__
    real_attention = train_mod.ttt_attention
    monkeypatch.setattr(train_mod, "ttt_attention", lambda *a: calls.append(1) or real_attention(*a))
    for flash in (False, True):
        monkeypatch.setattr(train_mod.TrainingKeyValues, "__init__",
                            lambda self, n, device, flash_=flash: real(self, n, device, flash=flash_))
        head.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss, stats = train_mod.head_loss(head, batch, embed, target, 5)
        loss.backward()
        results[flash] = (loss.detach(), {n: p.grad.clone() for n, p in head.named_parameters() if p.grad is not None})
    assert len(calls) == 5 * config.num_hidden_layers  # the flash run took the flash path at every step
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert torch.allclose(results[True][0], results[False][0], rtol=tol, atol=tol)
    for name, grad in results[False][1].items():
        other = results[True][1][name]
        assert torch.allclose(other, grad, rtol=tol, atol=tol * grad.abs().max().item()), name
