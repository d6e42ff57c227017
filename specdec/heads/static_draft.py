"""A head's whole chain draft (the feed of the verifier's features, then ``k`` draft steps) as one region of fixed
shapes, so that a CUDA graph can capture it once per (batch size, ``k``) and replay it every pass.

What makes it capturable (docs/design.md, "Drafting on a GPU"):

- the feed is always ``k + 1`` wide (a chain pass commits at most ``k + 1`` tokens), masked per row by its count;
- every pass attends over all of the head cache's slots under a mask built on the device from the row lengths,
  instead of a span read back from the device;
- positions, lengths and the gather of each row's last fed output are device arithmetic: no host read, no Python
  branch on data, no tensor whose shape depends on acceptance.

Slots past a row's length get the feed's filler and the draft steps' keys; they are overwritten later, as rolled
back slots of the verifier's cache are. As in SGLang's EAGLE draft CUDA-graph runner, the region's inputs are the
head cache (updated in place: static addresses) and small per-pass tensors; it returns the drafts and the lengths.
"""

from __future__ import annotations

import torch

from specdec.heads.modules import EagleHead, KeyValues


class StaticKeyValues(KeyValues):
    """Write a pass at ``positions [B, n]`` of each row and attend over every slot, a slot visible to a query when
    it is at or before the query's position (the committed slots, earlier tokens of the pass and itself)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], positions: torch.Tensor) -> None:
        self.keys, self.values, self.positions = keys, values, positions
        device = positions.device
        self.rows = torch.arange(positions.shape[0], device=device).unsqueeze(1).expand_as(positions)
        self.mask = torch.arange(keys[0].shape[1], device=device).view(1, 1, -1) <= positions.unsqueeze(-1)

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer], self.values[layer]
        keys.index_put_((self.rows, self.positions), k.to(keys.dtype))
        values.index_put_((self.rows, self.positions), v.to(values.dtype))
        return keys, values, self.mask


def draft_chain(head: EagleHead, keys: list[torch.Tensor], values: list[torch.Tensor], lengths: torch.Tensor,
                tokens: torch.Tensor, feats: torch.Tensor, counts: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Feed ``counts[b]`` (feature, next token) pairs of row ``b`` (``tokens [B, W]``, ``feats [B, W, F]``, filler
    past the count) at its slots ``lengths[b]..``, then draft ``k`` tokens greedily. Returns the drafts ``[B, k]``
    (verifier ids) and the lengths after the feed (the committed slots: draft slots are dropped at the commit)."""
    batch, width = tokens.shape
    device = tokens.device
    positions = lengths.unsqueeze(1) + torch.arange(width, device=device)
    out = _pass(head, tokens, feats, False, StaticKeyValues(keys, values, positions))
    lengths = lengths + counts
    hidden = out.gather(1, (counts - 1).view(batch, 1, 1).expand(batch, 1, out.shape[-1]))  # [B, 1, H]
    drafts = []
    for i in range(k):
        token = head.to_target(head.logits(hidden[:, 0]).argmax(dim=-1))
        drafts.append(token)
        if i < k - 1:
            step = (lengths + i).unsqueeze(1)
            hidden = _pass(head, token.unsqueeze(1), hidden, True, StaticKeyValues(keys, values, step))
    return torch.stack(drafts, dim=1), lengths


def _pass(head: EagleHead, tokens: torch.Tensor, feats: torch.Tensor, own: bool, kv: StaticKeyValues) -> torch.Tensor:
    embeds = head.embed(tokens)
    return head(embeds, head.input_hidden(embeds, feats.to(embeds.dtype), own=own), kv.positions, kv)


def region_steps(k: int) -> int:
    """The ``k`` a region drafts for a pass that asks for ``k``: the next power of two, so that an adaptive ``k`` or
    the shorter passes at the end of a call meet a handful of graphs, not one per ``k`` (extra drafts are dropped)."""
    return 1 << max(k - 1, 0).bit_length()
