"""specdec's per-position scans (specdec.runners.scans) against transformers' own: the same outputs and final state
as the multi-token scan they stand in for and as its one-token decode path step by step, and every kept state equal
to the state after that many tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.mamba import modeling_mamba
from transformers.models.nemotron_h import modeling_nemotron_h
from transformers.models.qwen3_next import modeling_qwen3_next

from specdec.runners import scans


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unwrapped(module, name):
    fn = getattr(module, name)
    return getattr(fn, "__wrapped__", fn) if getattr(fn, "_specdec_positions", False) else fn


def _taken(final: torch.Tensor) -> torch.Tensor:
    stack = scans.take(final)
    assert stack is not None
    return stack


@pytest.mark.parametrize("width,k_heads", [(1, 2), (5, 2), (7, 4)])
def test_gated_delta_scan_equals_transformers(width, k_heads):
    g = _gen(width)
    batch, v_heads, dk, dv = 3, 4, 8, 6
    q, k = (torch.randn(batch, width, k_heads, dk, generator=g) for _ in range(2))
    v = torch.randn(batch, width, v_heads, dv, generator=g)
    decay = -torch.rand(batch, width, v_heads, generator=g)
    beta = torch.rand(batch, width, v_heads, generator=g)
    start = torch.randn(batch, v_heads, dk, dv, generator=g)
    args = dict(g=decay, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    with scans.capture():
        out, final = scans.gated_delta_scan(q, k, v, initial_state=start.clone(), **args)
        stack = torch.stack(_taken(final), dim=1)
    chunk = _unwrapped(modeling_qwen3_next, "torch_chunk_gated_delta_rule")
    ref_out, ref_final = chunk(q, k, v, initial_state=start.clone(), **args)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, ref_final, rtol=1e-4, atol=1e-4)
    step = _unwrapped(modeling_qwen3_next, "torch_recurrent_gated_delta_rule")
    state = start.clone()
    for t in range(width):  # the one-token decode path: the same arithmetic, bit for bit
        one = dict(args, g=decay[:, t : t + 1], beta=beta[:, t : t + 1])
        o, state = step(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], initial_state=state, **one)
        assert torch.equal(o[:, 0], out[:, t]) and torch.equal(state, stack[:, t])


@pytest.mark.parametrize("width,groups", [(1, 1), (5, 1), (6, 2)])
def test_ssd_scan_equals_transformers(width, groups):
    g = _gen(10 + width)
    batch, heads, head_dim, state_size = 2, 4, 8, 5
    x = torch.randn(batch, width, heads, head_dim, generator=g)
    dt = torch.randn(batch, width, heads, generator=g)
    A = -torch.rand(heads, generator=g) - 0.1
    B, C = (torch.randn(batch, width, groups, state_size, generator=g) for _ in range(2))
    D, dt_bias = torch.randn(heads, generator=g), torch.randn(heads, generator=g)
    start = torch.randn(batch, heads, head_dim, state_size, generator=g)
    args = dict(chunk_size=4, D=D, dt_bias=dt_bias, dt_softplus=True, return_final_states=True)
    with scans.capture():
        out, final = scans.ssd_scan(x, dt, A, B, C, initial_states=start.clone(), **args)
        stack = torch.stack(_taken(final), dim=1)
    ref_out, ref_final = _unwrapped(modeling_nemotron_h, "mamba2_chunk_scan")(x, dt, A, B, C,
                                                                              initial_states=start.clone(), **args)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, ref_final, rtol=1e-4, atol=1e-4)
    update = _unwrapped(modeling_nemotron_h, "mamba2_selective_state_update")
    state = start.clone()
    for t in range(width):  # the mixer's one-token path, as NemotronHMamba2Mixer calls it
        o = update(state, x[:, t], dt[:, t, :, None].expand(-1, -1, head_dim), A[:, None, None].expand(-1, head_dim,
                   state_size), B[:, t], C[:, t], D[:, None].expand(-1, head_dim),
                   dt_bias=dt_bias[:, None].expand(-1, head_dim), dt_softplus=True)
        torch.testing.assert_close(o, out[:, t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state, stack[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("width", [1, 4])
def test_selective_scan_continues_from_the_cached_state(width):
    g = _gen(20 + width)
    batch, channels, state_size = 2, 6, 4
    x = torch.randn(batch, channels, width, generator=g)
    dt = torch.randn(batch, channels, width, generator=g)
    A = -torch.rand(channels, state_size, generator=g) - 0.1
    B, C = (torch.randn(batch, state_size, width, generator=g) for _ in range(2))
    D, z, bias = torch.randn(channels, generator=g), torch.randn(batch, channels, width, generator=g), torch.randn(
        channels, generator=g)
    start = torch.randn(batch, channels, state_size, generator=g)
    args = dict(D=D, z=z, delta_bias=bias, delta_softplus=True, return_last_state=True)
    with scans.capture():
        scans.enter_mixer(start)
        out, final = scans.selective_scan(x, dt, A, B, C, **args)
        stack = torch.stack(_taken(final), dim=1)
    update = _unwrapped(modeling_mamba, "mamba_selective_state_update")
    state = start.clone()
    for t in range(width):  # transformers' one-token path from the same state
        o = update(state, x[..., t], dt[..., t], A, B[..., t], C[..., t], D, z=z[..., t], dt_bias=bias,
                   dt_softplus=True)
        torch.testing.assert_close(o, out[..., t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state, stack[:, t], rtol=1e-5, atol=1e-5)
    # from a zero state it is transformers' own multi-token scan
    with scans.capture():
        scans.enter_mixer(torch.zeros_like(start))
        zero_out, _ = scans.selective_scan(x, dt, A, B, C, **args)
    ref, _ = _unwrapped(modeling_mamba, "mamba_selective_scan")(x, dt, A, B, C, **args)
    torch.testing.assert_close(zero_out, ref, rtol=1e-5, atol=1e-5)


def test_outside_a_capture_transformers_scan_runs_and_nothing_is_kept():
    from specdec.runners.recurrent_layout import layout
    from tiny_hybrids import make_hybrid

    layout(make_hybrid("qwen3_next"))  # installs the dispatcher in that module
    dispatched = modeling_qwen3_next.torch_chunk_gated_delta_rule
    assert getattr(dispatched, "_specdec_positions", False)
    q = k = torch.randn(1, 3, 2, 4)
    v = torch.randn(1, 3, 2, 4)
    out, final = dispatched(q, k, v, g=-torch.rand(1, 3, 2), beta=torch.rand(1, 3, 2), initial_state=torch.zeros(
        1, 2, 4, 4), output_final_state=True)
    assert scans.take(final) is None  # transformers' chunked scan ran: no stash
    assert not scans._capturing()
