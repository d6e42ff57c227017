"""The cache layers of hybrid models' recurrent and convolutional state (docs/design.md, "Hybrid models").

:class:`RecurrentLayer` holds a layer's conv/recurrent states through transformers' ``LinearAttentionLayer`` API (the
mixers read and write them by ``layer_idx``) and moves its slot pointer with the managed cache's. A multi-token
forward replaces its states with new tensors instead of writing into them, and leaves what selects the state after
each of its tokens (:class:`PerPosition`: the conv window and the scans' states, :mod:`specdec.runners.scans`), so the
session's history (:mod:`specdec.runners.recurrent`) rolls back by selecting, and keeps the states before a forward
by reference (:class:`Snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import LinearAttentionLayer

from specdec.runners import scans
from specdec.runners.cache import ManagedLayer


class RecurrentLayer(ManagedLayer, LinearAttentionLayer):
    """A managed layer that also holds ``number_of_states`` conv/recurrent states per row (transformers'
    ``LinearAttentionLayer`` API). Its slot pointer moves with the cache's; keys and values are allocated only if
    the model writes some (falcon_h1's hybrid layers)."""

    is_compileable = False

    def __init__(self, max_cache_len: int, number_of_states: int = 1, **kwargs) -> None:
        ManagedLayer.__init__(self, max_cache_len)
        LinearAttentionLayer.__init__(self, number_of_states=number_of_states)
        self.at_positions = PerPosition()  # what the running forward left per position (scans.py)
        self.tree: scans.Tree | None = None  # set for a tree forward: its nodes' parents and the states they start from
        # static passes (compile_verifier): states written in place, and each state per position into buffers of
        # fixed address (index 0: before the pass), what a graph replays (:meth:`static_positions`)
        self.static = False
        self.pos_conv: dict[int, torch.Tensor] = {}  # [batch, channels, 1 + width, kernel]
        self.pos_recurrent: dict[int, torch.Tensor] = {}  # [batch, 1 + width, ...]

    def lazy_initialization(self, *args, **kwargs) -> None:
        if args:  # keys and values (an attention update): the managed buffers
            ManagedLayer.lazy_initialization(self, *args)
        else:  # conv_states= / recurrent_states= (a mixer's first write)
            LinearAttentionLayer.lazy_initialization(self, **kwargs)

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None,
                          **kwargs) -> torch.Tensor:
        if self.is_conv_states_initialized[state_idx] and conv_states.dtype != self.conv_states[state_idx].dtype:
            self.conv_states[state_idx] = self.conv_states[state_idx].to(conv_states.dtype)  # adopted across dtypes
        if not (self.has_previous_state[state_idx] and self.is_conv_states_initialized[state_idx]):
            return LinearAttentionLayer.update_conv_state(self, conv_states, state_idx, conv_kernel_size, **kwargs)
        if self.tree is not None:  # each node's window from its parent's; the live state stays the tree's base
            nodes = scans.tree_conv_states(conv_states, self.tree, state_idx)
            base = self.conv_states[state_idx].unsqueeze(2)
            self.at_positions.conv[state_idx] = torch.cat([base, nodes.permute(1, 2, 0, 3)], dim=2)
            return conv_states
        # [state before | the new inputs]: the state after r of them is window[..., r : r + kernel]
        window = torch.cat([self.conv_states[state_idx], conv_states], dim=-1)
        kernel = self.conv_kernel_size[state_idx]
        if self.static:  # in place, and every window into the fixed buffer
            self.pos_conv[state_idx][:, :, : conv_states.shape[-1] + 1].copy_(window.unfold(-1, kernel, 1))
            self.conv_states[state_idx].copy_(window[..., -kernel:])
        else:  # a new tensor, so the one before stays as it was (the history's checkpoint of a multi-token forward)
            self.conv_states[state_idx] = window[..., -kernel:].contiguous()
            self.at_positions.conv[state_idx] = window.unfold(-1, kernel, 1)  # [batch, channels, width + 1, kernel]
        return window

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        if not (self.is_recurrent_states_initialized[state_idx] and self.has_previous_state[state_idx]):
            return LinearAttentionLayer.update_recurrent_state(self, recurrent_states, state_idx, **kwargs)
        stack = scans.take(recurrent_states)
        dtype = self.recurrent_states[state_idx].dtype
        if self.static:  # in place; a multi-token pass's states into the fixed buffer, after the state before it
            live = self.recurrent_states[state_idx]
            if stack is not None:
                buffer = self.pos_recurrent[state_idx]
                buffer[:, 0].copy_(live)
                buffer[:, 1 : len(stack) + 1].copy_(torch.stack(stack, dim=1))
            live.copy_(recurrent_states)
            return live
        if self.tree is not None:  # the live state stays the tree's base
            if stack is None:
                raise RuntimeError("a tree forward's recurrent state did not come from specdec's scans")
            self.at_positions.recurrent[state_idx] = stack
            return self.recurrent_states[state_idx]
        if stack is not None:  # the scan's own last state: nothing reads it in place later (rollbacks pick r < width)
            self.at_positions.recurrent[state_idx] = stack
            self.recurrent_states[state_idx] = recurrent_states.to(dtype)
        else:  # a new tensor, as for the conv state
            self.recurrent_states[state_idx] = recurrent_states.to(dtype, copy=True)
        return self.recurrent_states[state_idx]

    def reserve_positions(self, width: int) -> None:
        """Make the fixed per-position buffers hold passes of ``width`` tokens (zeroed: a graph's first pass may read
        rows no scan wrote). A reallocation moves them: a captured graph then recaptures (static.py lists them)."""
        have = next(iter(self.pos_conv.values()), None)
        if have is not None and have.shape[2] > width:
            return
        for s, state in self.conv_states.items():
            if state is not None and self.is_conv_states_initialized[s]:
                self.pos_conv[s] = state.new_zeros(*state.shape[:-1], width + 1, state.shape[-1])
        for s, state in self.recurrent_states.items():
            if state is not None and self.is_recurrent_states_initialized[s]:
                self.pos_recurrent[s] = state.new_zeros(state.shape[0], width + 1, *state.shape[1:])

    def static_positions(self, width: int) -> tuple[Snapshot, PerPosition]:
        """After a static pass of which ``width`` tokens are real: the states before it and after each of them, views
        of the fixed buffers (valid until the next pass)."""
        before = Snapshot({s: w[:, :, 0] for s, w in self.pos_conv.items()},
                          {s: r[:, 0] for s, r in self.pos_recurrent.items()}, dict(self.has_previous_state))
        return before, PerPosition({s: w[:, :, : width + 1] for s, w in self.pos_conv.items()},
                                   {s: list(r[:, 1 : width + 1].unbind(1)) for s, r in self.pos_recurrent.items()})

    def static_buffers(self) -> list[torch.Tensor]:
        """Every tensor a static pass writes in place (what a captured graph must find at the same address)."""
        held = [t for d in (self.conv_states, self.recurrent_states) for t in d.values() if t is not None]
        return held + list(self.pos_conv.values()) + list(self.pos_recurrent.values())

    def take_positions(self) -> PerPosition:
        """What the forward that just ran left per position (and forget it here)."""
        taken, self.at_positions = self.at_positions, PerPosition()
        return taken

    @property
    def is_croppable(self) -> bool:  # a crop cannot bring back an overwritten state; the session's history can
        return False

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("a recurrent layer's state cannot be cropped; roll back through its CacheSession")

    def reset(self) -> None:
        ManagedLayer.reset(self)
        LinearAttentionLayer.reset(self)

    def states(self, copy: bool = True) -> Snapshot:
        """The states now (a checkpoint). ``copy=False``: the tensors themselves, for a forward that replaces them
        instead of writing into them (a multi-token forward: :meth:`update_conv_state`, :meth:`update_recurrent_state`;
        one-token decode paths update the conv and Mamba states in place)."""
        keep = (lambda s: s.clone()) if copy else (lambda s: s)
        return Snapshot(
            {i: keep(s) for i, s in self.conv_states.items() if s is not None and self.has_previous_state[i]},
            {i: keep(s) for i, s in self.recurrent_states.items() if s is not None and self.has_previous_state[i]},
            dict(self.has_previous_state))

    def write_rows(self, rows: torch.Tensor, conv: dict[int, torch.Tensor], recurrent: dict[int, torch.Tensor]) -> None:
        """Overwrite the states of batch ``rows`` (in place: the buffers keep their address)."""
        for mine, new in ((self.conv_states, conv), (self.recurrent_states, recurrent)):
            for i, value in new.items():
                if mine[i] is not None:
                    mine[i][rows.to(mine[i].device)] = value.to(mine[i].dtype)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        ManagedLayer.batch_select_indices(self, indices)
        for states in (self.conv_states, self.recurrent_states):
            for i, s in states.items():
                if s is not None:
                    states[i] = s[indices.to(s.device)].contiguous()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)

    def adopt(self, other: ManagedLayer, dtype: torch.dtype | None = None, rows: torch.Tensor | None = None) -> None:
        """Start from ``other``'s slots and states (a drafter adopting the verifier's prompt cache)."""
        if other.is_initialized:
            ManagedLayer.adopt(self, other, dtype, rows)
        self.length = other.length
        if not isinstance(other, RecurrentLayer):
            return
        for name in ("conv_states", "recurrent_states"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for i, s in theirs.items():
                if s is not None:
                    mine[i] = (s if rows is None else s[rows]).clone()
        self.conv_kernel_size = dict(other.conv_kernel_size)
        self.has_previous_state = dict(other.has_previous_state)
        self.is_conv_states_initialized = dict(other.is_conv_states_initialized)
        self.is_recurrent_states_initialized = dict(other.is_recurrent_states_initialized)
        self.device, self.dtype = other.device, other.dtype

    @property
    def nbytes(self) -> int:
        held = [s for d in (self.conv_states, self.recurrent_states) for s in d.values() if s is not None]
        return ManagedLayer.nbytes.fget(self) + sum(s.numel() * s.element_size() for s in held)


class StatelessLayer(ManagedLayer):
    """A layer that keeps nothing (an MLP- or MoE-only block, transformers' "dummy" cache layer): its slot pointer
    moves with the others'."""

    def adopt(self, other: ManagedLayer, dtype: torch.dtype | None = None, rows: torch.Tensor | None = None) -> None:
        if other.is_initialized:
            ManagedLayer.adopt(self, other, dtype, rows)
        self.length = other.length


@dataclass
class PerPosition:
    """One recurrent layer's states after every token of one multi-token forward (a chain's tokens, or a tree's nodes,
    each after its parent): each conv state ``[batch, channels, 1 + width, kernel]`` (index 0: before the forward)
    and each recurrent state's ``width`` states ``[batch, ...]``."""

    conv: dict[int, torch.Tensor] = field(default_factory=dict)
    recurrent: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def covers(self, snapshot: Snapshot) -> bool:
        """Whether every state that existed before the forward (``snapshot``) has its per-position values."""
        return bool(snapshot.had_state) and set(snapshot.conv) <= set(self.conv) \
            and set(snapshot.recurrent) <= set(self.recurrent)

    def at(self, slot: int, index: torch.Tensor) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Rows ``index``'s conv and recurrent states after the forward's token ``slot`` (0-based)."""
        conv = {s: w[index.to(w.device), :, slot + 1] for s, w in self.conv.items()}
        recurrent = {s: st[slot][index.to(st[0].device)] for s, st in self.recurrent.items()}
        return conv, recurrent

    def nodes(self) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """Every token's states as a table: conv ``[width, batch, channels, kernel]``, recurrent ``[width, batch,
        ...]`` (the entries a later forward of the same tree starts from)."""
        return ({s: w[:, :, 1:].permute(2, 0, 1, 3) for s, w in self.conv.items()},
                {s: torch.stack(st) for s, st in self.recurrent.items()})

    def select(self, rows: torch.Tensor) -> PerPosition:
        return PerPosition({i: w[rows.to(w.device)] for i, w in self.conv.items()},
                           {i: [s[rows.to(s.device)] for s in st] for i, st in self.recurrent.items()})


@dataclass
class Snapshot:
    """One recurrent layer's states at one moment (only states that existed)."""

    conv: dict[int, torch.Tensor]
    recurrent: dict[int, torch.Tensor]
    had_state: dict[int, bool]

    def select(self, rows: torch.Tensor) -> Snapshot:
        """The states of batch ``rows`` only."""
        pick = lambda states: {i: s[rows.to(s.device)] for i, s in states.items()}
        return Snapshot(pick(self.conv), pick(self.recurrent), dict(self.had_state))
