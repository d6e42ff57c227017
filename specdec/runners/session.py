"""One ``generate`` call's cache for one model: the managed cache, its valid-slot map and per-row counts.

All rows share one write pointer into the preallocated cache (docs/design.md, "Ragged batches"), and
``valid [batch, max_len]`` says which slots of each row hold real tokens: left padding, rejected
drafts and filler are invalid slots that the attention mask hides. Each row's position ids count its
valid slots, unless a forward passes explicit ``position_ids`` (tree drafts: committed length + depth).
Models with sliding-window (or chunked) layers also keep each slot's position id (``positions``): their masks,
one per layer type (:mod:`specdec.runners.masks`), count the window in positions, so holes do not shift it.

Two ways to drop tokens after a verify pass: :meth:`CacheSession.keep` keeps a prefix of each row
(chains; a pointer move, no copy) and :meth:`CacheSession.keep_slots` keeps any subset of the slots
just written (trees: the accepted path is gathered into place). A prefix is the zero-copy special case.

With ``compile_verifier`` the verifier's session is *static* after its prefill (:mod:`specdec.runners.static`):
every pass is padded to a fixed width and attends over the whole buffer, and rows that finish stay in the
buffers as masked dummies (:attr:`CacheSession.live` maps active rows to buffer rows). Callers see no difference.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol

import torch

from specdec.transfer import upload
from specdec.runners.cache import CacheOverflowError, ManagedCache
from specdec.runners.recurrent import RecurrentHistory
from specdec.runners.masks import MaskLayout, additive, positions_of

if TYPE_CHECKING:
    from specdec.runners.static import StaticVerifier


class StepOutput:
    """What one forward returns: ``logits`` and, when asked, the chosen hidden states concatenated on the
    last axis (``hidden [batch, n, H * len(layers)]``)."""

    __slots__ = ("logits", "hidden")

    def __init__(self, logits: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        self.logits, self.hidden = logits, hidden


class Runner(Protocol):
    """What a session needs of the model runner that made it (:class:`specdec.runners.hf.CausalLMRunner`)."""

    model: Any
    sliding: bool  # some layers see a window (or chunk) of positions: transformers' own masks count it in slots
    custom_masks: bool  # the model takes custom 4-D masks as is (eager/sdpa attention; masks.py adds windows)
    mask_layout: MaskLayout  # which masks it takes (one per layer type, windows)
    cache_arg: str  # the keyword the model's forward takes its cache by
    num_layers: int

    def run(self, session: "CacheSession", hidden_layers: tuple[int, ...], **inputs: Any) -> "StepOutput": ...

    def run_static(self, session: "CacheSession", hidden_layers: tuple[int, ...], **inputs: Any) -> "StepOutput": ...

    def check_tree_masks(self, purpose: str = ...) -> None: ...


class CacheSession:
    """The per-call cache state of one model (verifier or model drafter)."""

    def __init__(self, runner: Runner, batch: int, max_len: int, device: torch.device,
                 static: "StaticVerifier | None" = None, widths: tuple[int, ...] = ()) -> None:
        self.runner = runner
        self.static, self.widths = static, tuple(sorted(widths))  # compiled passes: their engine and widths
        self.cache = ManagedCache(runner.num_layers, max_len) if static is None else static.borrow(runner.num_layers, batch, max_len)
        self.live = torch.arange(batch, device=device)  # buffer row of each active row (static sessions keep retired rows)
        self.live_host = list(range(batch))  # the same, on the host
        self.buffer_rows = batch  # rows the cache's buffers hold
        self.valid = torch.zeros(batch, max_len, dtype=torch.bool, device=device)  # slot holds a real token of that row
        self.counts = torch.zeros(batch, dtype=torch.long, device=device)  # real tokens per row (= next position id)
        self.single_row = batch == 1  # this call started with one row (compiled drafter steps)
        # host knowledge, so a pass needs no device read: every slot before the pointer is real in every row (no
        # left padding, no holes). False only means "unknown": the mask is then built, which is always correct.
        self.dense = True
        # each slot's position id, for windows counted in positions (sliding / chunked layers; None without them)
        layout = getattr(runner, "mask_layout", None)
        self.positions = torch.zeros(batch, max_len, dtype=torch.long, device=device) \
            if layout is not None and layout.restricted else None
        # hybrid models: recurrent layers, and the checkpoints and mixer inputs that roll them back (recurrent.py)
        plan = getattr(runner, "recurrent", None)
        self.recurrent = RecurrentHistory(self.cache, plan) if plan is not None else None

    @property
    def length(self) -> int:
        """The shared write pointer: slots used so far in every row."""
        return self.cache.length

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None, *, position_ids: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None, hidden_layers: tuple[int, ...] = (), **extra) -> "StepOutput":
        """Append ``tokens [batch, n]`` (``valid`` marks real ones; default all) and run the model over them.

        ``position_ids [batch, n]``: explicit positions (default: each real token's count in its row).
        ``tree_mask [batch, n, t]`` (bool, ``t >= n``): which of the last ``t`` slots (this pass's tokens, after
        ``t - n`` earlier tree nodes) each new token may attend to (a tree of drafts; default causal); every
        query still sees the row's valid slots before those. ``hidden_layers``: indices
        into transformers' ``output_hidden_states`` to return, concatenated (see :class:`StepOutput`).
        """
        if self._static_now:
            return self._forward_static(tokens, valid, position_ids, tree_mask, tuple(hidden_layers))
        start, n = self.length, tokens.shape[1]
        custom = getattr(self.runner, "custom_masks", False)
        if ((self.runner.sliding and not custom) or start + n > self.cache.max_cache_len) and not self.dense \
                and self._has_holes():
            # Squeeze out holes left by ragged rows: when they use up the slots, and for sliding-window models
            # whose masks transformers builds (it counts the window in slots; ours count positions).
            self.compact()
            start = self.length
        if start + n > self.cache.max_cache_len:
            raise CacheOverflowError(
                f"KV cache overflow: {n} more tokens after {start} in a cache preallocated for "
                f"{self.cache.max_cache_len} tokens"
            )
        if position_ids is not None and position_ids.shape != tokens.shape:
            raise ValueError(f"position_ids {tuple(position_ids.shape)} must match tokens {tuple(tokens.shape)}")
        if valid is None:  # every token real (the common pass): fewer ops than the general case
            self.valid[:, start : start + n] = True
            if position_ids is None:
                position_ids = self.counts.unsqueeze(1) + torch.arange(n, device=tokens.device)
            self.counts = self.counts + n
        else:
            self.dense = False
            self.valid[:, start : start + n] = valid
            if position_ids is None:  # position of a real token = real tokens before it in its row; filler 0 (masked)
                position_ids = (self.counts.unsqueeze(1) + valid.long().cumsum(dim=1) - 1).clamp_min(0)
            self.counts = self.counts + valid.sum(dim=1)
        if self.positions is not None:
            self.positions[:, start : start + n] = position_ids
        seen = self.valid[:, : start + n]
        if tree_mask is not None:
            mask = self._layer_masks(self._tree_allowed(tree_mask, seen, start), position_ids, start + n)
        elif self.dense:  # transformers' own masks: slots are positions here
            mask = None
        elif custom:
            # a 4-D mask built on the device: transformers takes it as is, where a 2-D padding mask is read back
            # (``bool``) on every 1-token forward to see whether it can be skipped
            mask = self._layer_masks(self._causal_allowed(seen, start, n), position_ids, start + n)
        else:  # other attention kernels (flash, flex): transformers builds the mask from the padding mask
            mask = seen.long()
        with self._recording(n, valid, tree_mask):
            out = self.runner.run(self, tuple(hidden_layers), input_ids=tokens, attention_mask=mask,
                                  position_ids=position_ids, use_cache=True, **{self.runner.cache_arg: self.cache},
                                  **extra)
        if self.static is not None:  # the prefill ran: static passes from now on
            self.static.activate(self.cache)
        return out

    def _recording(self, n: int, valid: torch.Tensor | None, tree_mask: torch.Tensor | None,
                   static: tuple[int, int] | None = None) -> contextlib.AbstractContextManager:
        """Around a forward: the recurrent history records it (hybrid models; else nothing)."""
        if self.recurrent is None:
            return contextlib.nullcontext()
        return self.recurrent.recording(n, valid, tree_mask, static)

    @property
    def _static_now(self) -> bool:
        """Whether passes are static: a static session after its (eager) prefill."""
        return self.static is not None and self.cache.layers[0].write_at is not None

    def _forward_static(self, tokens: torch.Tensor, valid: torch.Tensor | None, position_ids: torch.Tensor | None,
                        tree_mask: torch.Tensor | None, hidden_layers: tuple[int, ...]) -> "StepOutput":
        """:meth:`forward` as a static pass: padded to the next width, over the whole buffer, every buffer row."""
        n = tokens.shape[1]
        width = self.static.width(n, self.widths)
        start = self.length
        if start + width > self.cache.max_cache_len and not self.dense and self._has_holes():
            self.compact()
            start = self.length
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        else:
            self.dense = False
        if position_ids is None:
            position_ids = (self.counts.unsqueeze(1) + valid.long().cumsum(dim=1) - 1).clamp_min(0)
        elif position_ids.shape != tokens.shape:
            raise ValueError(f"position_ids {tuple(position_ids.shape)} must match tokens {tuple(tokens.shape)}")
        self.cache.static_write(start, width, n)  # raises on overflow before any state changes
        self.valid[:, start : start + n] = valid
        self.valid[:, start + n : start + width] = False  # padding: stale slots past the pointer
        self.counts = self.counts + valid.sum(dim=1)
        if self.positions is not None:
            self.positions[:, start : start + n] = position_ids
        seen = self.valid
        if tree_mask is not None:
            allowed = self._tree_allowed(tree_mask, seen[:, : start + n], start)
            allowed = torch.nn.functional.pad(allowed, (0, seen.shape[1] - start - n), value=False)
        else:
            allowed = self._causal_allowed(seen, start, n)
        batch = self.buffer_rows
        diagonal = torch.arange(width, device=seen.device)

        def place(allowed: torch.Tensor) -> torch.Tensor:  # the live rows' view in the whole buffer, padded to width
            # filler and dummy rows see their own slot; built by ops, not by assigning a Python scalar at a tensor
            # index, which on CUDA copies that scalar from pageable host memory (a sync HostTrace cannot see)
            slots = torch.arange(seen.shape[1], device=seen.device)
            full = (slots.view(1, 1, -1) == (start + diagonal).view(1, -1, 1)).expand(batch, width, -1).clone()
            full[self.live, :n] |= allowed
            return self._additive(full)

        mask = self._layer_masks(allowed, position_ids, seen.shape[1], finish=place)
        ids = torch.zeros(batch, width, dtype=tokens.dtype, device=tokens.device)
        ids[self.live, :n] = tokens
        positions = torch.zeros(batch, width, dtype=torch.long, device=tokens.device)
        positions[self.live, :n] = position_ids
        with self._recording(n, None, tree_mask, static=(width, max(self.widths, default=width))):
            out = self.runner.run_static(self, hidden_layers, input_ids=ids, attention_mask=mask,
                                         position_ids=positions, use_cache=True, **{self.runner.cache_arg: self.cache})
        pick = lambda t: None if t is None else t[self.live, :n]  # noqa: E731  (a copy: CUDA graphs reuse outputs)
        return StepOutput(pick(out.logits), pick(out.hidden))

    @staticmethod
    def _causal_allowed(seen: torch.Tensor, start: int, n: int) -> torch.Tensor:
        """``[batch, n, slots]`` over ``seen [batch, slots]``: each of the ``n`` new tokens (written from slot
        ``start``) sees the valid slots up to and including its own."""
        device = seen.device
        slot = torch.arange(seen.shape[1], device=device)
        return seen[:, None, :] & (slot[None, :] <= start + torch.arange(n, device=device)[:, None])

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """``allowed [batch, n, t]`` as the additive mask ``[batch, 1, n, t]`` transformers takes as is."""
        return additive(allowed, self.runner.model.dtype)

    def _layer_masks(self, allowed: torch.Tensor, query_positions: torch.Tensor, slots: int,
                     finish: Any = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """The model's mask argument for ``allowed [batch, n, slots]`` (what each new token may see): one additive
        mask, or one per layer type with windows cut by position (:class:`~specdec.runners.masks.MaskLayout`).
        ``finish``: bool view -> mask passed on (default :meth:`_additive`)."""
        finish = finish or self._additive
        layout = getattr(self.runner, "mask_layout", None)
        if layout is None or not layout.restricted:  # every layer sees its whole causal past: one mask
            return finish(allowed)
        return layout.masks(allowed, query_positions, self.positions[:, :slots], finish)

    def _tree_allowed(self, tree_mask: torch.Tensor, seen: torch.Tensor, start: int) -> torch.Tensor:
        """Which slots each new token sees, ``[batch, n, start + n]``: cached valid slots, then ``tree_mask`` over
        the last ``t`` slots (``t >= n``: earlier nodes of the same tree, written by previous forwards, and the new ones)."""
        self.runner.check_tree_masks()
        batch, n = seen.shape[0], seen.shape[1] - start
        t = tree_mask.shape[-1] if tree_mask.dim() == 3 else -1
        if tree_mask.dim() != 3 or tree_mask.shape[:2] != (batch, n) or not n <= t <= seen.shape[1] \
                or tree_mask.dtype != torch.bool:
            raise ValueError(f"tree_mask must be a bool tensor of shape ({batch}, {n}, t) with {n} <= t <= "
                             f"{seen.shape[1]}, got {tree_mask.dtype} {tuple(tree_mask.shape)}")
        edge = seen.shape[1] - t
        past = seen[:, None, :edge].expand(batch, n, edge)
        return torch.cat([past, tree_mask & seen[:, None, edge:]], dim=-1)

    def keep(self, counts: torch.Tensor | list[int]) -> None:
        """Keep the first ``counts[r]`` real tokens of each row; later slots become holes, the pointer moves back."""
        counts = torch.as_tensor(counts, dtype=torch.long, device=self.valid.device)
        if bool((counts > self.counts).any()):
            raise ValueError(f"cannot keep {counts.tolist()} tokens: rows hold only {self.counts.tolist()}")
        if self.recurrent is not None:
            self.recurrent.keep((self.counts - counts).tolist(), self._recurrent_rows())
        real_before = self.valid.long().cumsum(dim=1)
        self.valid &= real_before <= counts.unsqueeze(1)
        self.counts = counts
        self.dense = False
        self._trim()

    def keep_recent(self, n: int, kept: list[int], kept_device: torch.Tensor | None = None) -> None:
        """Of the ``n`` newest slots of each row (all real: what a forward without ``valid`` wrote), keep the first
        ``kept[b]``; the rest become holes and the pointer moves back past the last kept slot. ``kept_device``:
        ``kept`` on the device if the caller has it there (else uploaded). Host arithmetic only: no device read.
        The slot before the ``n`` is real in some row (every forward ends with a real column)."""
        if self.recurrent is not None:  # each row's recurrent state after its last kept token first
            self.recurrent.keep_recent(n, kept, self._recurrent_rows())
        if n == 0:
            return
        start = self.length - n
        if start < 0 or len(kept) != self.valid.shape[0] or not all(0 <= k <= n for k in kept):
            raise ValueError(f"cannot keep {kept} of the {n} newest slots of a cache holding {self.length}")
        end = start + max(kept)
        if min(kept) == max(kept):  # every row keeps as many (always with one row): host ints, two ops
            self.valid[:, end:] = False
            self.counts = self.counts + (kept[0] - n)
        else:
            if kept_device is None:
                kept_device = upload(kept, torch.long, self.valid.device)
            self.valid[:, start : start + n] &= torch.arange(n, device=self.valid.device) < kept_device.unsqueeze(1)
            self.counts = self.counts - n + kept_device
            self.valid[:, end:] = False
            self.dense = False
        self.cache.rollback(end)

    @torch.inference_mode()
    def keep_slots(self, keep: torch.Tensor | list[list[int]], n: int | None = None) -> None:
        """Keep, per row, some of the ``n`` newest slots, in order, gathered to the front of that block; the rest
        become holes. Keeping a prefix of the block is the chain case: no copy, as :meth:`keep`.

        ``keep``: either a bool mask ``[batch, n]`` (read back once, and checked: kept slots must hold real tokens),
        or, per row, the ascending indices within the block of the slots to keep, with ``n`` (host ints: no device
        read; trees know them). Then the caller vouches that they hold real tokens, and, when no row keeps a slot,
        that the slot before the block is real in some row (every forward ends with a real column), as
        :meth:`keep_recent` does: the pointer moves back from host ints alone.
        """
        if isinstance(keep, torch.Tensor):
            n = keep.shape[1]
            start = self.length - n
            if start < 0 or keep.dim() != 2 or keep.shape[0] != self.valid.shape[0]:
                raise ValueError(f"keep must be [batch={self.valid.shape[0]}, n <= {self.length}], got {tuple(keep.shape)}")
            keep = keep.to(device=self.valid.device, dtype=torch.bool)
            if bool((keep & ~self.valid[:, start : start + n]).any()):
                raise ValueError("keep_slots: a kept slot holds no real token")
            return self._keep_in_block([[i for i, k in enumerate(row) if k] for row in keep.tolist()], n, exact=False)
        if n is None or not 0 <= n <= self.length or len(keep) != self.valid.shape[0] \
                or any(list(row) != sorted(set(row)) or (row and not 0 <= row[0] <= row[-1] < n) for row in keep):
            raise ValueError(f"keep must list, for each of {self.valid.shape[0]} rows, ascending slots among the "
                             f"n={n} newest of a cache holding {self.length}")
        self._keep_in_block(keep, n, exact=True)

    def _keep_in_block(self, rows: list[list[int]], n: int, exact: bool) -> None:
        """:meth:`keep_slots` from host lists; ``exact``: the pointer's new end follows from them (else found on the
        device: a read)."""
        start, device = self.length - n, self.valid.device
        kept = [len(row) for row in rows]
        if self.recurrent is not None:  # a prefix of a chain, or a path of a tree: the state after its last slot
            self.recurrent.keep_last(n, [row[-1] if row else -1 for row in rows],
                                     paths=any(row != list(range(len(row))) for row in rows),
                                     rows=self._recurrent_rows())
        if any(row != list(range(len(row))) for row in rows):  # not a prefix: gather the kept slots to the front
            order = [row + [i for i in range(n) if i not in set(row)] for row in map(list, rows)]
            order = upload(order, torch.long, device).view(len(rows), n)
            for layer in self.cache.layers:
                layer.gather_slots(self._buffer_order(order), start)
            if self.positions is not None:  # positions move with their slots
                self.positions[:, start : start + n] = self.positions[:, start : start + n].gather(1, order)
        kept_device = upload(kept, torch.long, device)
        self.counts = self.counts - self.valid[:, start : start + n].sum(dim=1) + kept_device
        self.valid[:, start : start + n] = torch.arange(n, device=device).unsqueeze(0) < kept_device.unsqueeze(1)
        self.dense = False
        self._trim(start + max(kept, default=0) if exact else None)

    def _trim(self, end: int | None = None) -> None:
        """Move the shared pointer back to just after the last valid slot of any row (``end``: that slot + 1 when
        the caller knows it on the host; else found on the device, a read)."""
        if end is None:
            used = self.valid.any(dim=0).nonzero()
            end = int(used.max()) + 1 if used.numel() else 0
        self.cache.rollback(min(end, self.cache.length))
        self.valid[:, end:] = False

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` slots of every row (all rows aligned)."""
        if self.recurrent is not None:
            self.recurrent.keep((self.counts - self.valid[:, :length].sum(dim=1)).tolist(), self._recurrent_rows())
        self.cache.rollback(length)
        self.valid[:, length:] = False
        self.counts = self.valid.sum(dim=1)

    def adopt_positions(self, source: "CacheSession", width: int) -> None:
        """Take ``source``'s slot positions of its first ``width`` slots (a session adopting its cache)."""
        if self.positions is not None:
            theirs = source.positions if source.positions is not None else positions_of(source.valid)
            self.positions[:, :width] = theirs[:, :width]

    def _has_holes(self) -> bool:
        """Whether some row has an invalid slot after its first real token (left padding is no hole)."""
        used = self.valid[:, : self.length]
        return bool((used.cummax(dim=1).values & ~used).any())

    @torch.inference_mode()
    def compact(self) -> None:
        """Re-lay every row as left padding + its real tokens (one copy of the cache)."""
        n = int(self.counts.max())
        # stable sort puts each row's invalid slots first and its valid slots after, in order
        order = torch.argsort(self.valid[:, : self.length].to(torch.int8), dim=1, stable=True)[:, -n:]
        for layer in self.cache.layers:
            layer.gather_slots(self._buffer_order(order))
        if self.positions is not None:  # positions move with their slots
            self.positions[:, :n] = self.positions.gather(1, order)
        self.dense = False  # rows of fewer tokens are left padded now
        self.valid.zero_()
        self.valid[:, :n] = torch.arange(n, device=self.valid.device).unsqueeze(0) >= (n - self.counts).unsqueeze(1)

    def _recurrent_rows(self) -> list[int] | None:
        """Each row's buffer row for the recurrent history, where retired rows stay in the buffers (static passes)."""
        if self.live_host is None:  # rows were dropped by a device index: read once
            self.live_host = self.live.tolist()
        return self.live_host if self.buffer_rows != len(self.live_host) else None

    def _buffer_order(self, order: torch.Tensor) -> torch.Tensor:
        """A per-active-row slot order as one per buffer row (retired rows of a static session keep theirs)."""
        batch = self.buffer_rows
        if batch == order.shape[0]:
            return order
        full = torch.arange(order.shape[1], device=order.device).expand(batch, -1).clone()
        full[self.live] = order
        return full

    def keep_rows(self, rows: torch.Tensor | list[int]) -> None:
        """Drop the batch rows not listed in ``rows`` (host ints, or a host tensor as the engine builds it;
        finished sequences stop costing compute; a static session keeps their buffers as masked dummies, so its
        passes keep their shape). No device read: the index is uploaded, and the shared pointer stays where it is
        (the slots only a longer row that left held become holes, masked like any other, until a compaction
        re-lays the rows: finding the new end would read the device)."""
        if isinstance(rows, torch.Tensor) and rows.device.type != "cpu":
            kept, rows = None, rows.to(self.valid.device)  # its host copy only if a recurrent history asks
        else:  # host data (the engine's index): a non-blocking upload
            kept = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
            rows = upload(kept, torch.long, self.valid.device)
        if self.positions is not None:
            self.positions = self.positions[rows]
        if self._static_now:
            self.live, self.valid, self.counts = self.live[rows], self.valid[rows], self.counts[rows]
            self.live_host = None if kept is None or self.live_host is None else [self.live_host[r] for r in kept]
            return
        with torch.inference_mode():  # the buffers stay inference tensors, like those a forward allocates
            for layer in self.cache.layers:
                layer.batch_select_indices(rows)
            if self.recurrent is not None:
                self.recurrent.keep_rows(rows)
        self.valid, self.counts, self.live = self.valid[rows], self.counts[rows], self.live[: len(rows)]
        self.live_host, self.buffer_rows = list(range(len(rows))), len(rows)

    def release(self) -> None:
        """Drop the cache (frees its buffers; a static one goes back to its pool)."""
        if self.static is not None and self.cache is not None:
            self.static.give_back(self.cache)
        if getattr(self, "recurrent", None) is not None:
            self.recurrent.clear()
        self.cache = self.valid = self.counts = self.positions = None
