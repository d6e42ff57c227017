"""Cross-entropy against soft targets, fused and chunked: the draft head's loss over its draft vocabulary.

``-(p * log_softmax(z)).sum(-1)`` written out in PyTorch makes five full ``[M, V]`` passes forward (the fp32 copy of
bf16 logits, log-softmax, the product, its sum, the argmax for the statistics) and four backward; with a 16k draft
vocabulary and ~3.5k scored slots each pass moves ~235 MB, and together they were ~40% of a CPU training step.
Since ``p`` sums to one, ``ce = logsumexp(z) - p . z`` and ``d ce / d z = softmax(z) - p``: one read of ``z`` and
``p`` forward, one backward, over row chunks small enough to stay in cache.
"""

from __future__ import annotations

import torch

#: fp32 elements per chunk. On a CPU 1 MiB (16 rows of a 16k vocabulary): its temporaries stay in cache and in
#: malloc's reused pool (2 MiB ones took 2.7x longer backward, measured); on a GPU large chunks, few launches.
CHUNK_ELEMENTS = {"cpu": 1 << 18}
GPU_CHUNK_ELEMENTS = 1 << 26


def chunk_rows(vocab: int, device: torch.device) -> int:
    """Rows per chunk for a ``vocab``-wide fp32 chunk on ``device``."""
    return max(1, CHUNK_ELEMENTS.get(device.type, GPU_CHUNK_ELEMENTS) // max(1, vocab))


class _SoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(device_type=logits.device.type, enabled=False):  # fp32 math whatever the caller's autocast
            rows, step = logits.shape[0], chunk_rows(logits.shape[-1], logits.device)
            ce = torch.empty(rows, dtype=torch.float32, device=logits.device)
            lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
            top = torch.empty(rows, dtype=torch.long, device=logits.device)
            for a in range(0, rows, step):
                b = a + step
                z = logits[a:b].float()
                peak, top[a:b] = z.max(dim=-1)  # one pass for both (argmax alone is 3x slower on CPU)
                lse[a:b] = peak + (z - peak[:, None]).exp_().sum(-1).log_()
                ce[a:b] = lse[a:b] - (target_p[a:b] * z).sum(-1)
        ctx.save_for_backward(logits, target_p, lse)
        ctx.mark_non_differentiable(top)
        return ce, top

    @staticmethod
    def backward(ctx, grad_ce: torch.Tensor, _grad_top: torch.Tensor | None) -> tuple[torch.Tensor, None]:
        logits, target_p, lse = ctx.saved_tensors
        grad, step = torch.empty_like(logits), chunk_rows(logits.shape[-1], logits.device)
        with torch.autocast(device_type=logits.device.type, enabled=False):
            for a in range(0, logits.shape[0], step):
                b = a + step
                z = logits[a:b].float()
                grad[a:b] = ((z - lse[a:b, None]).exp_() - target_p[a:b]).mul_(grad_ce[a:b, None])
        return grad, None


def soft_cross_entropy(logits: torch.Tensor, target_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row cross-entropy ``[M]`` (fp32) of ``logits [M, V]`` (any float dtype) against the distributions
    ``target_p [M, V]`` (fp32, each row summing to one), and each row's argmax ``[M]`` (no gradient).

    Equal to ``-(target_p * log_softmax(logits.float())).sum(-1)`` and ``logits.argmax(-1)``; differentiable in
    ``logits`` only (the gradient has ``logits``' dtype)."""
    if logits.shape != target_p.shape or logits.dim() != 2:
        raise ValueError(f"soft_cross_entropy: logits {tuple(logits.shape)} and targets {tuple(target_p.shape)} "
                         "must both be [rows, vocabulary]")
    return _SoftCrossEntropy.apply(logits, target_p.float())
