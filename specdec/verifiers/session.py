"""One ``generate`` call's cache for one model: the managed cache, its valid-slot map and per-row counts.

All rows share one write pointer into the preallocated cache (docs/design.md, "Ragged batches"), and
``valid [batch, max_len]`` says which slots of each row hold real tokens: left padding, rejected
drafts and filler are invalid slots that the attention mask hides. Each row's position ids count its
valid slots, unless a forward passes explicit ``position_ids`` (tree drafts: committed length + depth).

Two ways to drop tokens after a verify pass: :meth:`CacheSession.keep` keeps a prefix of each row
(chains; a pointer move, no copy) and :meth:`CacheSession.keep_slots` keeps any subset of the slots
just written (trees: the accepted path is gathered into place). A prefix is the zero-copy special case.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdec.verifiers.cache import CacheOverflowError, ManagedCache

if TYPE_CHECKING:
    from specdec.verifiers.hf import CausalLMRunner


class StepOutput:
    """What one forward returns: ``logits`` and, when asked, the chosen hidden states concatenated on the
    last axis (``hidden [batch, n, H * len(layers)]``)."""

    __slots__ = ("logits", "hidden")

    def __init__(self, logits: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        self.logits, self.hidden = logits, hidden


class CacheSession:
    """The per-call cache state of one model (verifier or model drafter)."""

    def __init__(self, runner: "CausalLMRunner", batch: int, max_len: int, device: torch.device) -> None:
        self.runner = runner
        self.cache = ManagedCache(runner.num_layers, max_len)
        self.valid = torch.zeros(batch, max_len, dtype=torch.bool, device=device)  # slot holds a real token of that row
        self.counts = torch.zeros(batch, dtype=torch.long, device=device)  # real tokens per row (= next position id)
        self.single_row = batch == 1  # this call started with one row (compiled drafter steps)

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
        start, n = self.length, tokens.shape[1]
        if (self.runner.sliding or start + n > self.cache.max_cache_len) and self._has_holes():
            # Squeeze out holes left by ragged rows: when they use up the slots, and always for
            # sliding-window models, whose window is counted in slots rather than tokens.
            self.compact()
            start = self.length
        if start + n > self.cache.max_cache_len:
            raise CacheOverflowError(
                f"KV cache overflow: {n} more tokens after {start} in a cache preallocated for "
                f"{self.cache.max_cache_len} tokens"
            )
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        self.valid[:, start : start + n] = valid
        if position_ids is None:  # position of a real token = real tokens before it in its row; filler 0 (masked)
            position_ids = (self.counts.unsqueeze(1) + valid.long().cumsum(dim=1) - 1).clamp_min(0)
        elif position_ids.shape != tokens.shape:
            raise ValueError(f"position_ids {tuple(position_ids.shape)} must match tokens {tuple(tokens.shape)}")
        self.counts = self.counts + valid.sum(dim=1)
        seen = self.valid[:, : start + n]
        if tree_mask is not None:
            mask = self._tree_mask(tree_mask, seen, start)
        else:
            mask = None if bool(seen.all()) else seen.long()
        return self.runner.run(self, tuple(hidden_layers), input_ids=tokens, attention_mask=mask,
                               position_ids=position_ids, past_key_values=self.cache, use_cache=True, **extra)

    def _tree_mask(self, tree_mask: torch.Tensor, seen: torch.Tensor, start: int) -> torch.Tensor:
        """The additive 4-D mask ``[batch, 1, n, start + n]``: cached valid slots, then ``tree_mask`` over the
        last ``t`` slots (``t >= n``: earlier nodes of the same tree, written by previous forwards, and the new ones)."""
        self.runner.check_tree_masks()
        batch, n = seen.shape[0], seen.shape[1] - start
        t = tree_mask.shape[-1] if tree_mask.dim() == 3 else -1
        if tree_mask.dim() != 3 or tree_mask.shape[:2] != (batch, n) or not n <= t <= seen.shape[1] \
                or tree_mask.dtype != torch.bool:
            raise ValueError(f"tree_mask must be a bool tensor of shape ({batch}, {n}, t) with {n} <= t <= "
                             f"{seen.shape[1]}, got {tree_mask.dtype} {tuple(tree_mask.shape)}")
        edge = seen.shape[1] - t
        past = seen[:, None, :edge].expand(batch, n, edge)
        allowed = torch.cat([past, tree_mask & seen[:, None, edge:]], dim=-1)
        dtype = self.runner.model.dtype
        zero = torch.zeros((), dtype=dtype, device=seen.device)
        blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=seen.device)
        return torch.where(allowed, zero, blocked).unsqueeze(1)

    def keep(self, counts: torch.Tensor | list[int]) -> None:
        """Keep the first ``counts[r]`` real tokens of each row; later slots become holes, the pointer moves back."""
        counts = torch.as_tensor(counts, dtype=torch.long, device=self.valid.device)
        if bool((counts > self.counts).any()):
            raise ValueError(f"cannot keep {counts.tolist()} tokens: rows hold only {self.counts.tolist()}")
        real_before = self.valid.long().cumsum(dim=1)
        self.valid &= real_before <= counts.unsqueeze(1)
        self.counts = counts
        self._trim()

    @torch.inference_mode()
    def keep_slots(self, keep: torch.Tensor) -> None:
        """Keep, per row, the slots ``keep [batch, n]`` marks among the ``n`` newest, in order, gathered to the
        front of that block; the rest become holes. Kept slots must hold real tokens.

        Keeping a prefix of the block is the chain case: no copy, as :meth:`keep`.
        """
        n = keep.shape[1]
        start = self.length - n
        if start < 0 or keep.dim() != 2 or keep.shape[0] != self.valid.shape[0]:
            raise ValueError(f"keep must be [batch={self.valid.shape[0]}, n <= {self.length}], got {tuple(keep.shape)}")
        keep = keep.to(device=self.valid.device, dtype=torch.bool)
        block = self.valid[:, start : start + n]
        if bool((keep & ~block).any()):
            raise ValueError("keep_slots: a kept slot holds no real token")
        kept = keep.sum(dim=1)
        prefix = torch.arange(n, device=keep.device).unsqueeze(0) < kept.unsqueeze(1)
        if not bool((keep == prefix).all()):
            order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # kept slots first, in order
            for layer in self.cache.layers:
                layer.gather_slots(order, start)
        self.counts = self.counts - block.sum(dim=1) + kept
        self.valid[:, start : start + n] = prefix
        self._trim()

    def _trim(self) -> None:
        """Move the shared pointer back to just after the last valid slot of any row."""
        used = self.valid.any(dim=0).nonzero()
        end = int(used.max()) + 1 if used.numel() else 0
        self.cache.rollback(min(end, self.cache.length))
        self.valid[:, end:] = False

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` slots of every row (all rows aligned)."""
        self.cache.rollback(length)
        self.valid[:, length:] = False
        self.counts = self.valid.sum(dim=1)

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
            layer.gather_slots(order)
        self.valid.zero_()
        self.valid[:, :n] = torch.arange(n, device=self.valid.device).unsqueeze(0) >= (n - self.counts).unsqueeze(1)

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Drop the batch rows not listed in ``rows`` (finished sequences stop costing compute)."""
        rows = rows.to(self.valid.device)
        with torch.inference_mode():  # the buffers stay inference tensors, like those a forward allocates
            for layer in self.cache.layers:
                layer.batch_select_indices(rows)
        self.valid, self.counts = self.valid[rows], self.counts[rows]
        self._trim()

    def release(self) -> None:
        """Drop the cache (frees its buffers)."""
        self.cache = self.valid = self.counts = None
