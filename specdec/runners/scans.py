"""A recurrent state per draft position: the scans of a verify pass keep the state after every token, so a rollback
selects the accepted one by index (docs/design.md, "Hybrid models").

transformers' hybrid mixers (Gated DeltaNet, Mamba-2, Mamba-1) run a multi-token forward through one module-level
scan function (``torch_chunk_gated_delta_rule``, ``mamba2_chunk_scan``, ``mamba_selective_scan``) and hand only its
final state to the cache. While a specdec session's forward runs on this thread (:func:`begin` to :func:`end`, or
:func:`capture`), those names
resolve to the scans below instead: token by token, the same arithmetic as transformers' one-token decode path, with
every intermediate state kept (the loop's own tensors, no copy). The cache layer that receives the final state
(``update_recurrent_state``) takes them with it (:func:`take`). Outside a capture, and for a prefill (no state to continue), transformers' own
function runs unchanged, so other users of transformers in the process see no difference.

Mamba-1's ``mamba_selective_scan`` takes no initial state (it always starts from zero); within a capture it continues
from the state the mixer's cache layer held when the mixer was called (:func:`enter_mixer`).

Convolution states need no scan: the cache layer keeps the window ``[previous state | new inputs]`` that
``update_conv_state`` builds anyway, and the state after ``r`` tokens is a slice of it.

A tree forward (:class:`Tree`, handed to each mixer by :func:`enter_mixer`) computes every node from its parent's
state: the recurrence gathers the parent's state from a table (the state before the tree, the nodes of earlier
forwards of the same tree, then this forward's), and so does the convolution (:func:`tree_conv_states`, with
``causal_conv1d_fn`` reading the nodes' windows, :func:`tree_conv`). Nodes come after their parents.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

_local = threading.local()
_PATCHED = "_specdec_positions"  # set on a dispatcher that already wraps a transformers scan


def _capturing() -> bool:
    return getattr(_local, "depth", 0) > 0


def begin() -> None:
    """From now on (until the matching :func:`end`) the hybrid scans of this thread keep a state per position."""
    _local.depth = getattr(_local, "depth", 0) + 1


def end() -> None:
    _local.depth = max(getattr(_local, "depth", 0) - 1, 0)
    if not _local.depth:
        _local.stash = _local.initial = _local.tree = _local.conv_nodes = None


@contextlib.contextmanager
def capture() -> Iterator[None]:
    """Within: the hybrid scans of this thread keep a state per position."""
    begin()
    try:
        yield
    finally:
        end()


@dataclass
class Tree:
    """One recurrent layer's inputs for a tree forward: each new node's parent as an index into the table (0: the
    state before the tree; then the nodes of earlier forwards of the tree; then this forward's nodes, each after its
    parent), and the table's first entries, per state index: conv ``[entries, batch, channels, kernel]``, recurrent
    ``[entries, batch, ...]``."""

    parents: torch.Tensor  # [batch, width] long
    conv: dict[int, torch.Tensor]
    recurrent: dict[int, torch.Tensor]


def enter_mixer(initial: torch.Tensor | None, tree: Tree | None = None) -> None:
    """A mixer is about to run: ``initial`` is its layer's recurrent state (None: none yet), for a scan whose caller
    passes none (Mamba-1); ``tree``: this forward is a tree's."""
    _local.initial, _local.tree = initial, tree


def _tree() -> Tree | None:
    return getattr(_local, "tree", None)


def _walk(initial: torch.Tensor, width: int, step: Callable[[torch.Tensor, int], torch.Tensor]) -> list[torch.Tensor]:
    """The state after each of ``width`` tokens, ``step(state before, t)`` computing token ``t``'s: a chain
    continues from the previous token's, a tree node from its parent's (:class:`Tree`)."""
    tree, states = _tree(), []
    if tree is None:
        state = initial
        for t in range(width):
            state = step(state, t)
            states.append(state)
        return states
    return list(_grow(tree.recurrent[0].to(initial), tree.parents, width, step).unbind(0))


def _grow(table: torch.Tensor, parents: torch.Tensor, width: int,
          step: Callable[[torch.Tensor, int], torch.Tensor]) -> torch.Tensor:
    """A tree's ``width`` new entries ``[width, batch, ...]``: entry ``t`` is ``step(its parent's entry, t)``, the
    parent found by ``parents [batch, width]`` in ``table [entries, batch, ...]`` followed by the new entries."""
    table = torch.cat([table, table.new_empty(width, *table.shape[1:])])
    first, rows = table.shape[0] - width, torch.arange(table.shape[1], device=table.device)
    for t in range(width):
        table[first + t] = step(table[parents[:, t], rows], t)
    return table[first:]


def tree_conv_states(inputs: torch.Tensor, tree: Tree, state_idx: int) -> torch.Tensor:
    """Each new node's conv state ``[width, batch, channels, kernel]``: its parent's shifted by one, then the node's
    own input (``inputs [batch, channels, width]``)."""
    nodes = _grow(tree.conv[state_idx].to(inputs.dtype), tree.parents, inputs.shape[-1],
                  lambda parent, t: torch.cat([parent[..., 1:], inputs[:, :, t : t + 1]], dim=-1))
    _local.conv_nodes = nodes
    return nodes


def tree_conv(hidden_states: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              activation: str | None = None, **kwargs) -> torch.Tensor:
    """``causal_conv1d_fn`` of a tree forward: each node's output from its own window (:func:`tree_conv_states`),
    ``[batch, channels, width]``."""
    nodes, _local.conv_nodes = _local.conv_nodes, None
    if nodes.shape[0] != hidden_states.shape[-1]:
        raise RuntimeError(f"a tree convolution over {hidden_states.shape[-1]} tokens got {nodes.shape[0]} windows")
    out = (nodes.to(weight.dtype) * weight).sum(dim=-1)
    if bias is not None:
        out = out + bias
    out = out.permute(1, 2, 0)
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)


def _stash(final: torch.Tensor, states: list[torch.Tensor]) -> None:
    _local.stash = (final, states)


def take(final: torch.Tensor) -> list[torch.Tensor] | None:
    """The states after each token (``[batch, ...]`` each; the loop's own tensors, no copy) of the scan that returned
    ``final`` (None: that state did not come from a capturing scan, e.g. a prefill or a one-token decode step)."""
    stash = getattr(_local, "stash", None)
    if stash is None or stash[0] is not final:
        return None
    _local.stash = None
    return stash[1]


def gated_delta_scan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                     use_qk_l2norm_in_kernel: bool = False, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' recurrent gated delta rule (``torch_recurrent_gated_delta_rule``), keeping every state."""
    dtype = query.dtype
    num_k, num_v = key.shape[2], value.shape[2]
    if num_k != num_v:  # each query/key head serves num_v // num_k value heads
        query = query.repeat_interleave(num_v // num_k, dim=2)
        key = key.repeat_interleave(num_v // num_k, dim=2)
    query, key, value, beta, decay = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                                      for x in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query = query * torch.rsqrt((query * query).sum(dim=-1, keepdim=True) + 1e-6)
        key = key * torch.rsqrt((key * key).sum(dim=-1, keepdim=True) + 1e-6)
    query = query / (query.shape[-1] ** 0.5)
    width = key.shape[2]
    out = torch.zeros_like(value)

    def step(state: torch.Tensor, i: int) -> torch.Tensor:
        q_t, k_t, v_t = query[:, :, i], key[:, :, i], value[:, :, i]
        state = state * decay[:, :, i].exp()[..., None, None]
        kv_mem = (state * k_t.unsqueeze(-1)).sum(dim=-2)
        delta = (v_t - kv_mem) * beta[:, :, i].unsqueeze(-1)
        state = state + k_t.unsqueeze(-1) * delta.unsqueeze(-2)
        out[:, :, i] = (state * q_t.unsqueeze(-1)).sum(dim=-2)
        return state

    states = _walk(initial_state.to(value), width, step)
    final = states[-1]
    _stash(final, states)
    return out.transpose(1, 2).contiguous().to(dtype), final


def ssd_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             chunk_size: int, D: torch.Tensor | None = None, dt_bias: torch.Tensor | None = None,
             initial_states: torch.Tensor | None = None, dt_softplus: bool = False,
             dt_limit: tuple[float, float] = (0.0, float("inf")), return_final_states: bool = False, **kwargs):
    """transformers' Mamba-2 scan (``mamba2_chunk_scan``: the same arguments and results) as its one-token update
    (``mamba2_selective_state_update``) token by token, keeping every state ``[batch, heads, head_dim, state]``."""
    batch, width, heads, head_dim = hidden_states.shape
    repeat = heads // B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    x = hidden_states.float()
    B = B.float().repeat_interleave(repeat, dim=2, output_size=heads)
    C = C.float().repeat_interleave(repeat, dim=2, output_size=heads)
    decay = torch.exp(dt * A.float())  # [batch, width, heads]
    out = x.new_empty(batch, width, heads, head_dim)

    def step(state: torch.Tensor, t: int) -> torch.Tensor:
        state = state * decay[:, t, :, None, None] + (dt[:, t, :, None, None] * B[:, t, :, None, :]) * x[:, t, ..., None]
        out[:, t] = torch.matmul(state, C[:, t, :, :, None]).squeeze(-1)
        return state

    states = _walk(initial_states.float(), width, step)
    if D is not None:
        out = out + x * D[:, None]
    final = states[-1]
    _stash(final, states)
    return (out, final) if return_final_states else out


def selective_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None = None, z: torch.Tensor | None = None, delta_bias: torch.Tensor | None = None,
                   delta_softplus: bool = False, return_last_state: bool = False, **kwargs):
    """transformers' Mamba-1 scan (``mamba_selective_scan``: the same arguments and results), continuing from the
    mixer's cached state (:func:`enter_mixer`) instead of zero, keeping every state ``[batch, channels, state]``."""
    dtype = hidden_states.dtype
    batch, channels, width = hidden_states.shape
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2), C.transpose(1, 2)  # [batch, width, state]
    decay = torch.exp(A[None, :, None, :] * dt[:, :, :, None])
    update = dt[:, :, :, None] * B[:, None, :, :].float() * hidden_states[:, :, :, None].float()
    scan = update.new_empty(batch, channels, width, dtype=dtype)

    def step(state: torch.Tensor, t: int) -> torch.Tensor:
        state = decay[:, :, t] * state + update[:, :, t]
        scan[:, :, t] = torch.matmul(state.to(dtype), C[:, t, :].unsqueeze(-1))[:, :, 0]
        return state

    states = _walk(_local.initial.float(), width, step)
    if D is not None:
        scan = scan + hidden_states * D[None, :, None]
    if z is not None:
        scan = scan * F.silu(z)
    final = states[-1]
    _stash(final, states)
    return (scan, final) if return_last_state else scan


# transformers' name of each multi-token scan -> (ours, whether it applies to this call)
SCANS: dict[str, tuple[Callable, Callable[[dict], bool]]] = {
    "torch_chunk_gated_delta_rule": (gated_delta_scan, lambda kw: kw.get("initial_state") is not None),
    "mamba2_chunk_scan": (ssd_scan, lambda kw: kw.get("initial_states") is not None),
    "mamba_selective_scan": (selective_scan, lambda kw: getattr(_local, "initial", None) is not None),
    "causal_conv1d_fn": (tree_conv, lambda kw: getattr(_local, "conv_nodes", None) is not None),
}


def install(mixer: torch.nn.Module) -> set[str]:
    """Route the scans of ``mixer``'s transformers module through :data:`SCANS` (once per module); the names that
    module has."""
    module = sys.modules.get(type(mixer).__module__)
    found = set()
    for name, (ours, applies) in SCANS.items():
        original = getattr(module, name, None)
        if original is None:
            continue
        found.add(name)
        if not getattr(original, _PATCHED, False):
            setattr(module, name, _dispatcher(original, ours, applies))
    return found


def _dispatcher(original: Callable, ours: Callable, applies: Callable[[dict], bool]) -> Callable:
    def scan(*args, **kwargs):
        return ours(*args, **kwargs) if _capturing() and applies(kwargs) else original(*args, **kwargs)

    setattr(scan, _PATCHED, True)
    scan.__wrapped__ = original
    return scan
