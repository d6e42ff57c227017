"""The committed rows of one ``generate`` call, in transformers' layout, with its exact stop rules."""

from __future__ import annotations

import torch
from transformers.generation.streamers import BaseStreamer

from specdec.arguments import GenerationSetup
from specdec.protocol import Rows, left_pads
from specdec.stopping import StopRules
from specdec.transfer import upload


class CommittedRows:
    """Row state as tensors: ``tokens [B, max_length]`` (left padding + tokens) and ``lengths [B]``.

    With an EOS criterion a finished row stops and is padded with ``pad_token_id`` at the end, as
    ``generate`` pads it. Without one, ``generate`` keeps extending finished rows until all rows
    have stopped; so do we, and each row is then cut to the length at which the last row stopped.
    """

    def __init__(self, setup: GenerationSetup, streamer: BaseStreamer | None, keep_scores: bool, keep_logits: bool):
        self.setup, self.streamer = setup, streamer
        ids = setup.input_ids
        batch, prompt = ids.shape
        pad = setup.pad_token_id if setup.pad_token_id is not None else 0
        self.tokens = torch.full((batch, max(setup.max_length, prompt)), pad, dtype=torch.long, device=ids.device)
        self.tokens[:, :prompt] = ids
        self.host = ids.tolist()  # host copy of every row (once per call): stop rules and lookups read it, not the device
        self.lengths = [prompt] * batch  # host-side: the loop reads them every step without a device sync
        self.pads = left_pads(setup.attention_mask, batch)  # read once per call, for every drafter (Rows.pads)
        self.rules = StopRules(setup.stopping, pad)
        self.stopped_at: list[int | None] = [None] * batch
        self.active = list(range(batch))  # original indices of rows still generating
        self._index: torch.Tensor | None = None  # the active rows' indices on the device, made when rows leave
        self.scores = [[] for _ in range(batch)] if keep_scores else None
        self.logits = [[] for _ in range(batch)] if keep_logits else None

    @property
    def done(self) -> bool:
        return not self.active

    def row(self, r: int) -> torch.LongTensor:
        return self.tokens[r, : self.lengths[r]]

    def active_rows(self) -> Rows:
        """The rows still generating, as the drafter sees them (no device sync, no upload but after rows left)."""
        lengths = [self.lengths[r] for r in self.active]
        host, pads = [self.host[r] for r in self.active], [self.pads[r] for r in self.active]
        if len(self.active) == self.tokens.shape[0]:
            return Rows(self.tokens[:, : max(lengths)], lengths, self.active, host, pads)
        if self._index is None:
            self._index = upload(self.active, torch.long, self.tokens.device)
        return Rows(self.tokens[self._index, : max(lengths)], lengths, self.active, host, pads)

    def add_block(self, tokens: torch.Tensor, counts: list[int], scores: torch.Tensor, logits: torch.Tensor,
                  block: list[list[int]] | None = None) -> list[int]:
        """Commit ``tokens[b, :counts[b]]`` to each active row ``b``, left to right, up to the token after which
        the row is complete; return how many each took. ``block``: the same tokens as host ints, when the caller
        read them already (else read here)."""
        block = tokens.tolist() if block is None else block
        starts = [self.lengths[r] for r in self.active]
        for r, row, n in zip(self.active, block, counts):
            self.host[r].extend(row[:n])
        stops = self.rules.first_stops([self.host[r] for r in self.active], starts, tokens.device)
        taken = []
        for b, (r, n, stop) in enumerate(zip(self.active, counts, stops)):
            start = starts[b]
            if self.stopped_at[r] is None and stop is not None:
                self.stopped_at[r] = start + stop + 1
            m = self._taken(r, start, n)
            del self.host[r][start + m:]
            self.tokens[r, start : start + m] = tokens[b, :m]
            self.lengths[r] = start + m
            if self.scores is not None:
                self.scores[r].extend(scores[b, :m].unbind(0))
            if self.logits is not None:
                self.logits[r].extend(logits[b, :m].unbind(0))
            if self.streamer is not None:  # one put per accepted block, as transformers' assisted generation does
                self.streamer.put(torch.tensor(self.host[r][start : start + m], dtype=torch.long, device="cpu"))
            taken.append(m)
        return taken

    def _taken(self, r: int, start: int, n: int) -> int:
        """How many of ``n`` new tokens row ``r`` keeps: all, or up to the one after which it is complete."""
        for j in range(n):
            if self._complete(r, start + j + 1):
                return j + 1
        return n

    def _complete(self, r: int, length: int | None = None) -> bool:
        """Whether row ``r`` (at ``length`` tokens; default its length) has every token ``generate`` would output.

        With an EOS criterion, a row is complete once it stopped. Without one, rows run on until every
        row has stopped and are then cut at the longest stop, so a row is complete at that length.
        """
        stopped = self.stopped_at[r]
        length = self.lengths[r] if length is None else length
        if stopped is None or length < stopped:
            return False
        if self.setup.has_eos_criteria:
            return True
        return all(s is not None for s in self.stopped_at) and length >= max(self.stopped_at)

    def retire(self) -> list[int]:
        """Drop finished rows from ``active``; return the positions (in the old active list) that stay."""
        finished = {r for r in self.active if self.lengths[r] >= self.setup.max_length or self._complete(r)}
        stay = [i for i, r in enumerate(self.active) if r not in finished]
        if len(stay) < len(self.active):
            self._index = None
        self.active = [self.active[i] for i in stay]
        return stay

    def sequences(self) -> torch.LongTensor:
        if not self.setup.has_eos_criteria:
            return self.tokens[:, : max(s for s in self.stopped_at)]
        return self.tokens[:, : max(self.lengths)]

    def per_step(self, which: list[list[torch.Tensor]] | None) -> tuple[torch.Tensor, ...] | None:
        return None if which is None else tuple(torch.stack(step) for step in zip(*which))
