"""The fused soft cross-entropy of draft-head training equals the plain PyTorch one, values and gradients."""

import pytest
import torch

from specdec.training import soft_ce
from specdec.training.soft_ce import chunk_rows, soft_cross_entropy


def _reference(logits, target_p):
    z = logits.float()
    return -(target_p * torch.log_softmax(z, dim=-1)).sum(-1), z.argmax(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [0, 1, 7, 40])
def test_equals_the_plain_loss_and_its_gradient(dtype, rows, monkeypatch):
    monkeypatch.setitem(soft_ce.CHUNK_ELEMENTS, "cpu", 7 * 300)  # chunks of 7 rows: 40 rows end in a partial one
    g = torch.Generator(device="cpu").manual_seed(rows)
    logits = (torch.randn(rows, 300, generator=g, device="cpu") * 4).to(dtype)
    target_p = torch.softmax(torch.randn(rows, 300, generator=g, device="cpu") * 3, dim=-1)
    if rows:
        target_p[0] = 0.0
        target_p[0, 7] = 1.0  # a one-hot row
    weights = torch.rand(rows, generator=g, device="cpu")
    results = []
    for fn in (soft_cross_entropy, _reference):
        x = logits.clone().requires_grad_(True)
        ce, top = fn(x, target_p)
        (ce * weights).sum().backward()
        results.append((ce.detach(), top, x.grad))
    (ce, top, grad), (ref_ce, ref_top, ref_grad) = results
    assert ce.dtype == torch.float32 and grad.dtype == dtype and ce.shape == (rows,)
    torch.testing.assert_close(ce, ref_ce, rtol=1e-5, atol=1e-5)
    assert torch.equal(top, ref_top)
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {}
    torch.testing.assert_close(grad, ref_grad, **tolerance)


def test_a_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="rows, vocabulary"):
        soft_cross_entropy(torch.zeros(3, 5, device="cpu"), torch.zeros(3, 6, device="cpu"))


def test_chunk_sizes():
    cpu = torch.device("cpu")
    assert chunk_rows(16384, cpu) == 16 and chunk_rows(10**7, cpu) == 1  # 1 MiB chunks on a CPU, never empty
    assert chunk_rows(16384, torch.device("cuda")) == 4096  # few launches on a GPU
