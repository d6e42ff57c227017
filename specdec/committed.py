"""The committed rows of one ``generate`` call, in transformers' layout, with its exact stop rules."""

from __future__ import annotations

import torch
from transformers.generation.streamers import BaseStreamer

from specdec.arguments import GenerationSetup
from specdec.protocol import Rows


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
        self.lengths = [prompt] * batch  # host-side: the loop reads them every step without a device sync
        self.stopped_at: list[int | None] = [None] * batch
        self.active = list(range(batch))  # original indices of rows still generating
        self.scores = [[] for _ in range(batch)] if keep_scores else None
        self.logits = [[] for _ in range(batch)] if keep_logits else None

    @property
    def done(self) -> bool:
        return not self.active

    def row(self, r: int) -> torch.LongTensor:
        return self.tokens[r, : self.lengths[r]]

    def active_rows(self) -> Rows:
        """The rows still generating, as the drafter sees them."""
        lengths = [self.lengths[r] for r in self.active]
        index = torch.tensor(self.active, dtype=torch.long, device=self.tokens.device)
        return Rows(self.tokens[index, : max(lengths)], torch.tensor(lengths, dtype=torch.long, device="cpu"), self.active)

    def add(self, r: int, tokens: torch.Tensor, scores: torch.Tensor, logits: torch.Tensor) -> int:
        """Commit ``tokens [m]`` to row ``r`` left to right; return how many were taken."""
        taken = tokens.shape[0]
        for j in range(tokens.shape[0]):
            n = self.lengths[r]
            self.tokens[r, n] = tokens[j]
            self.lengths[r] = n + 1
            if self.scores is not None:
                self.scores[r].append(scores[j])
            if self.logits is not None:
                self.logits[r].append(logits[j])
            if self.stopped_at[r] is None and bool(self.setup.stopping(self.row(r).unsqueeze(0), None)[0]):
                self.stopped_at[r] = n + 1
            if self._complete(r):  # nothing after this token is output: not in sequences, scores or streamer
                taken = j + 1
                break
        if self.streamer is not None:  # one put per accepted block, as transformers' assisted generation does
            self.streamer.put(tokens[:taken].cpu())
        return taken

    def add_block(self, tokens: torch.Tensor, counts: list[int], scores: torch.Tensor, logits: torch.Tensor) -> list[int]:
        """Commit ``tokens[b, :counts[b]]`` to each active row ``b``; return how many each took."""
        return [self.add(r, tokens[b, :n], scores[b], logits[b]) for b, (r, n) in enumerate(zip(self.active, counts))]

    def _complete(self, r: int) -> bool:
        """Whether row ``r`` has every token ``generate`` would output.

        With an EOS criterion, a row is complete once it stopped. Without one, rows run on until every
        row has stopped and are then cut at the longest stop, so a row is complete at that length.
        """
        if self.stopped_at[r] is None:
            return False
        if self.setup.has_eos_criteria:
            return True
        return all(s is not None for s in self.stopped_at) and self.lengths[r] >= max(self.stopped_at)

    def retire(self) -> list[int]:
        """Drop finished rows from ``active``; return the positions (in the old active list) that stay."""
        finished = {r for r in self.active if self.lengths[r] >= self.setup.max_length or self._complete(r)}
        stay = [i for i, r in enumerate(self.active) if r not in finished]
        self.active = [self.active[i] for i in stay]
        return stay

    def sequences(self) -> torch.LongTensor:
        if not self.setup.has_eos_criteria:
            return self.tokens[:, : max(s for s in self.stopped_at)]
        return self.tokens[:, : max(self.lengths)]

    def per_step(self, which: list[list[torch.Tensor]] | None) -> tuple[torch.Tensor, ...] | None:
        return None if which is None else tuple(torch.stack(step) for step in zip(*which))
