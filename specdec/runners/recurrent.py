"""The rollback of hybrid models' recurrent and convolutional state (docs/design.md, "Hybrid models").

An attention layer's history is a list of slots, so rolling back is a pointer move. A recurrent layer keeps one
state per row that each token overwrites: after a verify pass of ``n`` tokens it holds the state after all ``n``,
and a row that kept ``m < n`` needs the state after its ``m``-th. :class:`RecurrentHistory` (one per session) keeps,
for every forward since the last commit, the layers' states before it and what it kept per position (the scans of
:mod:`specdec.runners.scans`, the conv windows; :mod:`specdec.runners.recurrent_layers`). A commit writes each row the
state after its last kept token, a chain's or a tree path's: a selection, no replay. Only a mixer whose scan keeps
nothing per position, and a drafter's catch-up filler, replay that layer's mixer alone over the recorded inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import Cache, LinearAttentionLayer

from specdec.runners import scans
from specdec.runners.recurrent_layers import PerPosition, RecurrentLayer, Snapshot, StatelessLayer
from specdec.runners.recurrent_layout import DummyLayer, Layout
from specdec.transfer import upload

# A rollback replays at most this many tokens one at a time, through the mixer's decode path: transformers' chunked
# scans (the Gated DeltaNet's torch fallback pads every call to 64 tokens) cost a whole pass for a 2-token replay.
STEPWISE_REPLAY = 8


@dataclass
class _Pass:
    """One forward since the last commit: its width, the recurrent states before it and each mixer's input."""

    width: int
    before: dict[int, Snapshot]
    inputs: dict[int, tuple[str, tuple, dict]] = field(default_factory=dict)
    at: dict[int, PerPosition] = field(default_factory=dict)  # layers whose states after every token were kept
    all_real: bool = True
    filler: dict[tuple[int, ...], list[int]] = field(default_factory=dict)  # real positions -> rows with filler
    tree: bool = False  # a tree's nodes, each after its parent: the live state stays the tree's base
    padded: bool = False  # a static pass with filler after its tokens: the live state is past them
    swapped: dict[int, Snapshot] = field(default_factory=dict)  # a one-node tree forward: each layer's base state


class RecurrentHistory:
    """A session's recurrent layers: the forwards since the last commit, and rollback by restore + replay."""

    def __init__(self, cache: Any, plan: Layout) -> None:
        self.plan = plan
        for i, n in plan.states.items():  # the recurrent layers replace the plain managed ones
            if isinstance(cache.layers[i], RecurrentLayer):  # a pooled static cache: its buffers keep their addresses
                with torch.inference_mode():
                    cache.layers[i].reset()
            else:
                zero_init = cache.layers[i].zero_init  # a static cache's keys (falcon_h1's) start at zero
                cache.layers[i] = RecurrentLayer(cache.max_cache_len, number_of_states=n)
                cache.layers[i].zero_init = zero_init
        for i in plan.stateless:
            cache.layers[i] = StatelessLayer(cache.max_cache_len)
        self.layers: dict[int, RecurrentLayer] = {i: cache.layers[i] for i in plan.states}
        # layers no attention writes to: their slot pointers are moved here, in step with the others
        self._pointers = [cache.layers[i] for i in (*plan.states, *plan.stateless)]
        self._end = 0
        self.passes: list[_Pass] = []
        self._open: _Pass | None = None
        cache.recurrent_history = self

    def record(self, layer_idx: int, cache_name: str, args: tuple, kwargs: dict) -> None:
        """Keep a mixer's input of the open forward: its hidden states (positional or not) and plain options; the
        cache and tensor options (masks: a replay runs real tokens only) are not kept."""
        if self._open is not None and layer_idx in self.layers:
            layer = self.layers[layer_idx]  # the state a scan that takes none continues from (Mamba-1)
            scans.enter_mixer(layer.recurrent_states[0] if layer.has_previous_state.get(0)
                              and layer.is_recurrent_states_initialized.get(0) else None, layer.tree)
            if "hidden_states" in kwargs:
                args = (kwargs["hidden_states"], *args)
            if args and all(not isinstance(a, torch.Tensor) for a in args[1:]):
                kept = {k: v for k, v in kwargs.items() if k not in (cache_name, "hidden_states", "attention_mask")
                        and not isinstance(v, torch.Tensor)}
                self._open.inputs[layer_idx] = (cache_name, args, kept)

    @contextlib.contextmanager
    def recording(self, width: int, valid: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                  static: tuple[int, int] | None = None) -> Iterator[None]:
        """Around one forward: :meth:`before_forward`, then :meth:`after_forward`, or :meth:`abort` if it fails."""
        self.before_forward(width, valid, tree_mask, static)
        try:
            yield
        except BaseException:
            self.abort()
            raise
        self.after_forward()

    def before_forward(self, width: int, valid: torch.Tensor | None = None, tree_mask: torch.Tensor | None = None,
                       static: tuple[int, int] | None = None) -> None:
        """Checkpoint every recurrent layer and start recording a forward of ``width`` tokens. ``valid [batch,
        width]``: which tokens are real; once a row has state, its filler (a drafter's left-aligned catch-up) is
        kept out of every recurrence (:meth:`skip_filler`); the prefill's left padding is part of the sequence, as
        in ``generate``. ``tree_mask [batch, width, t]``: the forward is a tree's (each node from its parent's state;
        the tree's filler nodes are never kept). ``static``: a static pass (``compile_verifier``) of this width
        (filler after the ``width`` tokens) and the widest pass of its call: states in place, per position into
        the layers' fixed buffers."""
        tree = tree_mask is not None
        if static is not None and (tree or valid is not None):
            raise RuntimeError("a static pass over recurrent layers takes a chain of real tokens")
        copy = width == 1 and not tree and (static is None or static[0] == 1)  # one-token paths write in place
        self._open = _Pass(width, {i: layer.states(copy=copy) for i, layer in self.layers.items()},
                           all_real=valid is None or tree, tree=tree, padded=static is not None and static[0] > width)
        if static is not None:
            for layer in self.layers.values():
                layer.static = True
                layer.reserve_positions(static[1])
        scans.begin()
        # a static pass's pointers were moved already (ManagedCache.static_write)
        self._end = self._pointers[0].length + (0 if static else width) if self._pointers else 0
        if tree:
            self._plant_tree(tree_mask)
        elif valid is not None and any(f for snap in self._open.before.values() for f in snap.had_state.values()):
            for b, row in enumerate(valid.tolist()):  # one read, in ragged catch-ups only
                if not all(row):
                    self._open.filler.setdefault(tuple(i for i, v in enumerate(row) if v), []).append(b)

    def _plant_tree(self, tree_mask: torch.Tensor) -> None:
        """Give each layer its tree inputs: every new node's parent (from ``tree_mask``, on the device) in a table of
        the tree's base state (the live one: tree forwards leave it) and the nodes of earlier forwards of the tree."""
        width, t = tree_mask.shape[1], tree_mask.shape[2]
        slots = torch.arange(t, device=tree_mask.device)
        ancestors = tree_mask & (slots.unsqueeze(0) < slots[t - width :].unsqueeze(1))
        parents = (ancestors * (slots + 1)).amax(dim=-1)  # the nearest ancestor's slot + 1; 0: the base
        earlier = self._tree_nodes(t - width)
        for i, layer in self.layers.items():
            base = self._open.before[i]
            if not base.had_state or not all(base.had_state.values()):
                raise RuntimeError("a tree forward needs the recurrent state of the tokens before it (not a prefill)")
            conv = {s: torch.cat([c.unsqueeze(0), *([earlier[i][0][s]] if t > width else [])]) for s, c in
                    base.conv.items()}
            recurrent = {s: torch.cat([r.unsqueeze(0), *([earlier[i][1][s]] if t > width else [])]) for s, r in
                         base.recurrent.items()}
            if width > 1:
                layer.tree = scans.Tree(parents, conv, recurrent)
                continue
            # one node: the mixer's one-token path, which updates its states in place, runs on its parent's (copies)
            rows = torch.arange(parents.shape[0], device=parents.device)
            self._open.swapped[i] = base
            for s, table in conv.items():
                layer.conv_states[s] = table[parents[:, 0], rows]
            for s, table in recurrent.items():
                layer.recurrent_states[s] = table[parents[:, 0], rows]

    def _tree_nodes(self, count: int) -> dict[int, tuple[dict, dict]]:
        """Each layer's states after the ``count`` newest tree nodes (written by the forwards just before), as
        tables ``[count, batch, ...]`` per conv and recurrent state."""
        if count == 0:
            return {}
        trailing = []
        for p in reversed(self.passes):
            if not p.tree or sum(q.width for q in trailing) >= count:
                break
            trailing.insert(0, p)
        if sum(p.width for p in trailing) < count:
            raise RuntimeError(f"a tree forward sees {count} earlier nodes, but the forwards before it wrote "
                               f"{sum(p.width for p in trailing)} tree nodes")
        out = {}
        for i in self.layers:
            tables = [p.at[i].nodes() for p in trailing]
            out[i] = tuple({s: torch.cat([tab[k][s] for tab in tables])[-count:] for s in tables[0][k]} for k in (0, 1))
        return out

    def after_forward(self) -> None:
        """Close the forward: it joins the history."""
        done, self._open = self._open, None
        scans.end()
        if done is None:
            return
        for i, layer in self.layers.items():
            kept = layer.take_positions()
            layer.tree = None
            if layer.static:  # what the pass wrote into the fixed buffers (a replayed graph runs no Python)
                layer.static = False
                if done.padded or done.width > 1:
                    done.before[i], done.at[i] = layer.static_positions(done.width)
                continue
            if i in done.swapped:  # a one-node tree forward: the node's states are what the mixer left; the base returns
                base = done.swapped[i]
                kept = PerPosition({s: torch.stack([c, layer.conv_states[s]], dim=2) for s, c in base.conv.items()},
                                   {s: [layer.recurrent_states[s]] for s in base.recurrent})
                layer.conv_states.update(base.conv)
                layer.recurrent_states.update(base.recurrent)
            if done.tree or (done.all_real and done.width > 1 and kept.covers(done.before[i])):
                done.at[i] = kept
        for layer in self._pointers:
            layer.length = self._end
        self.passes.append(done)

    def skip_filler(self, i: int, output: Any) -> Any:
        """Layer ``i``'s mixer ran over a block with filler: rerun its rows with filler over their real tokens
        from the checkpoint, and put their states and outputs in place (None when there is nothing to redo)."""
        if self._open is None or not self._open.filler or i not in self.layers:
            return None
        if i not in self._open.inputs:
            raise RuntimeError(f"layer {i}'s mixer input was not recorded: its call signature is not one specdec reads")
        name, args, kwargs = self._open.inputs[i]
        out = output[0] if isinstance(output, tuple) else output
        for positions, rows in self._open.filler.items():
            index = self._index(i, rows)
            start = self._open.before[i].select(index)
            if positions:
                conv, recurrent, redone = self._replay(i, start, name, args, kwargs, index, list(positions))
                at = torch.tensor(positions, dtype=torch.long, device=out.device)
                out[index.to(out.device).unsqueeze(1), at.unsqueeze(0)] = redone.to(out.dtype)
            else:
                conv, recurrent = start.conv, start.recurrent
            self.layers[i].write_rows(index, conv, recurrent)
        return output

    def keep_recent(self, n: int, kept: list[int], rows: list[int] | None = None) -> None:
        """Of the ``n`` newest tokens of each row (whole forwards, all real), row ``b`` keeps the first ``kept[b]``;
        the history restarts."""
        self.keep_last(n, [k - 1 for k in kept], rows=rows)

    def keep_last(self, n: int, last: list[int], paths: bool = False, rows: list[int] | None = None) -> None:
        """Of the ``n`` newest slots (whole forwards, all real), row ``b``'s state becomes the state after slot
        ``last[b]`` (-1: before them): a prefix of a chain's tokens, or, with ``paths``, a path of a tree's (whose
        state is its last node's). Selected where the forward kept its states per position, else restored and
        replayed; the history restarts. ``rows``: each row's buffer row (a static session keeps retired rows)."""
        passes, self.passes = self.passes, []
        if n == 0:
            return
        covered, first = 0, len(passes)
        while covered < n and first > 0:
            first -= 1
            covered += passes[first].width
        block = passes[first:]
        if covered != n or not all(p.all_real for p in block):
            raise RuntimeError(f"cannot roll recurrent state back over the {n} newest tokens: they are not whole "
                               "forwards of real tokens since the last commit")
        if paths and not all(p.tree for p in block):
            raise RuntimeError("recurrent layers keep a prefix of a chain's tokens, or a path of a tree's nodes")
        groups: dict[tuple[int, int], list[int]] = {}
        for b, slot in enumerate(last):
            if slot == n - 1 and not (block[-1].tree or block[-1].padded):  # the live state is the one after them all
                continue
            offset, j = 0, first
            while slot >= offset + passes[j].width:
                offset += passes[j].width
                j += 1
            groups.setdefault((j, slot - offset) if slot >= 0 else (first, -1), []).append(b if rows is None else rows[b])
        for (j, slot), rows in groups.items():
            self._restore(passes, j, slot, rows)

    def keep(self, dropped: list[int], rows: list[int] | None = None) -> None:
        """Row ``b`` drops its ``dropped[b]`` newest tokens (all in forwards since the last commit)."""
        width = sum(p.width for p in self.passes)
        if any(dropped) or (self.passes and self.passes[-1].padded):
            self.keep_recent(width, [width - d for d in dropped], rows)
        else:
            self.passes.clear()

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only these batch rows stay (the layers select their own rows)."""
        for p in self.passes:
            p.before = {i: snap.select(rows) for i, snap in p.before.items()}
            p.at = {i: kept.select(rows) for i, kept in p.at.items()}
            p.inputs = {i: (name, _rows_of(args, rows), kw) for i, (name, args, kw) in p.inputs.items()}

    def abort(self) -> None:
        """The open forward failed: it leaves no pass."""
        if self._open is not None:
            scans.end()
        self._open = None

    def clear(self) -> None:
        self.abort()
        self.passes = []

    def _index(self, i: int, rows: list[int]) -> torch.Tensor:
        """``rows`` as an index on layer ``i``'s device."""
        layer = self.layers[i]
        held = [t for t in (*layer.conv_states.values(), *layer.recurrent_states.values()) if t is not None]
        return upload(rows, torch.long, held[0].device if held else "cpu")

    @torch.inference_mode()
    def _restore(self, passes: list[_Pass], j: int, slot: int, rows: list[int]) -> None:
        """Set ``rows``' states to those after token ``slot`` of ``passes[j]`` (-1: before it)."""
        done = passes[j]
        for i, layer in self.layers.items():
            index = self._index(i, rows)
            if slot >= 0 and i in done.at and (done.tree or done.padded or slot < done.width - 1):
                conv, recurrent = done.at[i].at(slot, index)  # kept per position: a selection, no replay
            elif slot == done.width - 1 and j + 1 < len(passes):  # a chain forward's end: the next one's start
                conv, recurrent = (s := passes[j + 1].before[i].select(index)).conv, s.recurrent
            elif slot == done.width - 1:
                continue  # the live state
            elif slot >= 0:
                if i not in done.inputs:
                    raise RuntimeError(f"layer {i}'s mixer input was not recorded: its call signature is not one "
                                       "specdec reads")
                name, args, kwargs = done.inputs[i]
                conv, recurrent, _ = self._replay(i, done.before[i].select(index), name, args, kwargs, index,
                                                  list(range(slot + 1)), stepwise=True)
            else:
                conv, recurrent = (s := done.before[i].select(index)).conv, s.recurrent
            layer.write_rows(index, conv, recurrent)

    def _replay(self, i: int, start: Snapshot, name: str, args: tuple, kwargs: dict, index: torch.Tensor,
                positions: list[int], stepwise: bool = False
                ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], torch.Tensor]:
        """Run layer ``i``'s mixer over its recorded input at ``positions`` for rows ``index``, from ``start``, on a
        proxy cache; return the states it leaves and its output. ``stepwise``: one token at a time (the mixer's
        decode path), when a state exists and there are at most :data:`STEPWISE_REPLAY` tokens."""
        layer = self.layers[i]
        proxy = LinearAttentionLayer(number_of_states=layer.number_of_states)
        for s in range(layer.number_of_states):
            proxy.conv_kernel_size[s] = layer.conv_kernel_size[s]
            proxy.has_previous_state[s] = start.had_state.get(s, False)
            if s in start.conv:
                proxy.conv_states[s], proxy.is_conv_states_initialized[s] = start.conv[s].clone(), True
            if s in start.recurrent:
                proxy.recurrent_states[s], proxy.is_recurrent_states_initialized[s] = start.recurrent[s].clone(), True
        cache = Cache(layers=[DummyLayer() for _ in range(i)] + [proxy])
        at = torch.tensor(positions, dtype=torch.long, device=index.device)
        hidden = args[0].index_select(0, index.to(args[0].device)).index_select(1, at.to(args[0].device))

        def run(h: torch.Tensor) -> torch.Tensor:  # real tokens only: no padding mask
            out = self.plan.mixers[i](h, *args[1:], **{name: cache}, attention_mask=None, **kwargs)
            return out[0] if isinstance(out, tuple) else out

        steps = stepwise and 1 < len(positions) <= STEPWISE_REPLAY and bool(start.had_state) \
            and all(start.had_state.values())
        scans.enter_mixer(start.recurrent.get(0))  # a scan that takes no initial state continues from this one
        with _Unhooked(self), scans.capture():  # no forward of the session: nothing recorded, nothing redone
            out = torch.cat([run(hidden[:, t : t + 1]) for t in range(len(positions))], dim=1) if steps else run(hidden)
        conv = {s: t for s, t in proxy.conv_states.items() if t is not None}
        recurrent = {s: t for s, t in proxy.recurrent_states.items() if t is not None}
        return conv, recurrent, out


class _Unhooked:
    """Within: the history records nothing and redoes nothing (the hooks see the proxy cache anyway; this guards
    a mixer that would reach the session's cache some other way)."""

    def __init__(self, history: RecurrentHistory) -> None:
        self.history = history

    def __enter__(self) -> None:
        self.saved, self.history._open = self.history._open, None

    def __exit__(self, *exc: object) -> None:
        self.history._open = self.saved


def _rows_of(args: tuple, rows: torch.Tensor) -> tuple:
    """Recorded mixer arguments of the rows kept: the hidden states are ``args[0]``, the rest plain values."""
    return (args[0][rows.to(args[0].device)], *args[1:])
