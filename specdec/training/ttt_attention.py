"""Training-time-test attention on a CPU: flash attention over the true-feature block, merged exactly with the
chain's diagonal keys through the log-sum-exp (SpecForge's FlashAttention merge, sgl-project/SpecForge
``_FlashCachedMergeFunc``, rewritten for PyTorch's CPU flash kernel).

At training-time step ``s`` slot ``i`` attends to the step-0 keys ``K0[0 .. i - s]`` (a causal block shifted by
``s``) and to one key of each step ``t = 1 .. s``, ``K_t[i - s + t]`` (:class:`~specdec.training.train.TrainingKeyValues`).
Written as one masked attention over all ``(s + 1) n`` keys, the CPU kernel scans every key block (it skips blocks
only when ``is_causal``): 15 n^2 over five steps. Here the block is a plain causal flash call over ``n - s`` keys
(query rows ``s ..``), which returns its log-sum-exp; the ``s`` diagonal scores per row are dot products; both are
merged by their log-sum-exps. The backward calls the flash backward with the *merged* output and log-sum-exp, so
its softmax is the full one's and the gradients are exact (a plain autograd merge would differentiate through a
log-sum-exp the kernel does not differentiate: SpecForge's fix in its PR #536).
"""

from __future__ import annotations

import torch

__all__ = ["flash_ttt_available", "ttt_attention"]

_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


def flash_ttt_available(device: torch.device) -> bool:
    """Whether :func:`ttt_attention` runs on ``device`` (PyTorch's CPU flash kernel with its log-sum-exp)."""
    return device.type == "cpu" and _FLASH is not None and _FLASH_BACKWARD is not None


class _MergedFlash(torch.autograd.Function):
    """Softmax attention of ``q [B,h,n,d]`` over the causal block ``k0, v0 [B,h,n-s,d]`` (query row ``s + r``
    sees block keys ``0 .. r``) and, for ``t = 1 .. s``, the per-row keys ``kd[t-1], vd[t-1] [B,h,n,d]`` (row ``i``'s
    key of step ``t``, valid from row ``s - t`` on)."""

    @staticmethod
    @torch.autocast("cpu", enabled=False)  # the merge in fp32 (autocast would run products in bf16)
    def forward(ctx, q, k0, v0, s: int, scale: float, *diag):  # noqa: D102
        kd, vd = diag[:s], diag[s:]
        n = q.shape[2]
        lse0 = q.new_full(q.shape[:3], float("-inf"), dtype=torch.float32)
        out0 = torch.zeros_like(q, dtype=torch.float32)
        if s < n:
            o, lse = _FLASH(q[:, :, s:], k0, v0, 0.0, True, scale=scale)[:2]
            out0[:, :, s:], lse0[:, :, s:] = o.float(), lse
        qf = q.float()
        scores = [lse0]
        for t in range(1, s + 1):
            score = (qf * kd[t - 1]).sum(-1) * scale
            score[:, :, : s - t] = float("-inf")  # rows before s - t have no key of step t
            scores.append(score)
        merged = torch.logsumexp(torch.stack(scores, dim=-1), dim=-1)  # finite: every row has its own key (t = s)
        weights = [torch.exp(x - merged) for x in scores]
        out = weights[0].unsqueeze(-1) * out0
        for t in range(1, s + 1):
            out += weights[t].unsqueeze(-1) * vd[t - 1]
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k0, v0, out, merged, *weights[1:], *kd, *vd)
        ctx.s, ctx.scale = s, scale
        return out

    @staticmethod
    @torch.autocast("cpu", enabled=False)
    def backward(ctx, grad):  # noqa: D102
        s, scale = ctx.s, ctx.scale
        q, k0, v0, out, merged, *rest = ctx.saved_tensors
        weights, kd, vd = rest[:s], rest[s:2 * s], rest[2 * s:]
        n = q.shape[2]
        grad = grad.contiguous()
        g = grad.float()
        dq = torch.zeros_like(q, dtype=torch.float32)
        dk0, dv0 = torch.zeros_like(k0), torch.zeros_like(v0)
        if s < n:  # the block's softmax is the merged one: pass the merged output and log-sum-exp
            dqb, dk0, dv0 = _FLASH_BACKWARD(grad[:, :, s:].contiguous(), q[:, :, s:].contiguous(), k0, v0,
                                            out[:, :, s:].contiguous(), merged[:, :, s:].contiguous(), 0.0, True,
                                            scale=scale)[:3]
            dq[:, :, s:] = dqb.float()
        correction = (g * out.float()).sum(-1)  # D = rowsum(dO * O), the softmax gradient's shared term
        qf = q.float()
        dkd, dvd = [], []
        for w, k, v in zip(weights, kd, vd):
            dscore = (w * ((g * v).sum(-1) - correction)).unsqueeze(-1)
            dq += scale * dscore * k
            dkd.append(scale * dscore * qf)
            dvd.append(w.unsqueeze(-1) * g)
        return (dq.to(q.dtype), dk0, dv0, None, None, *dkd, *dvd)


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """Attention of step ``s = len(keys) - 1``'s queries ``q [B,h,n,d]`` over the keys and values of steps
    ``0 .. s`` (each ``[B,h,n,d]``, heads already repeated for GQA), as the training-time mask allows; equal to
    masked SDPA over all of them, in about a third of the work over five steps (exact, gradients included)."""
    s, n = len(keys) - 1, q.shape[2]
    if s == 0:  # the plain causal case: flash skips the masked blocks itself
        return torch.nn.functional.scaled_dot_product_attention(q, keys[0], values[0], is_causal=True)

    def shifted(x: torch.Tensor, by: int) -> torch.Tensor:  # row i holds x's row i - by (zeros before), in fp32
        return torch.nn.functional.pad(x[:, :, : max(n - by, 0)].float(), (0, 0, min(by, n), 0))

    # slot i's key of step t sits at slot i - s + t of that step: shift step t's keys down by s - t rows
    kd = [shifted(keys[t], s - t) for t in range(1, s + 1)]
    vd = [shifted(values[t], s - t) for t in range(1, s + 1)]
    k0, v0 = keys[0][:, :, : max(n - s, 0)].contiguous(), values[0][:, :, : max(n - s, 0)].contiguous()
    return _MergedFlash.apply(q.contiguous(), k0, v0, s, q.shape[-1] ** -0.5, *kd, *vd)
