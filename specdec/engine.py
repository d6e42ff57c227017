"""The speculative decoding loop (DESIGN.md section 1), for one row or a ragged batch.

Cache invariant between steps: the verifier's cache holds, for every active row, each committed
token except the newest (whose keys are computed as the first position of the next verify pass);
the drafter holds the longest prefix of each row that it has seen and that was committed.

Each row accepts its own number of drafts per pass (rows drift apart; the runner masks the slots a
row did not keep). Rows that finish leave the batch, so they cost no more drafter or verifier work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from specdec.acceptance import greedy_accept, rejection_accept
from specdec.arguments import GenerationSetup
from specdec.draft_length import FixedDraftLength
from specdec.drafters.base import DraftContext, Drafter
from specdec.stats import SpecStats
from specdec.verifiers.hf import CausalLMRunner


@dataclass
class EngineResult:
    sequences: torch.LongTensor
    stats: SpecStats
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None


def cache_slots(setup: GenerationSetup, num_draft_tokens: int) -> int:
    """Slots each managed cache is preallocated with.

    One row never needs more than ``max_length``. Ragged rows leave holes (slots a row did not keep);
    some slack makes the compaction that squeezes them out rare.
    """
    batch, prompt = setup.input_ids.shape
    slack = 0 if batch == 1 else (setup.max_length - prompt) // 4 + 2 * (num_draft_tokens + 1)
    return setup.max_length + slack


class _Rows:
    """Committed rows in transformers' layout (left padding + tokens), with its exact stop rules.

    With an EOS criterion a finished row stops and is padded with ``pad_token_id`` at the end, as
    ``generate`` pads it. Without one, ``generate`` keeps extending finished rows until all rows
    have stopped; so do we, and each row is then cut to the length at which the last row stopped.
    """

    def __init__(self, setup: GenerationSetup, streamer: BaseStreamer | None, keep_scores: bool, keep_logits: bool):
        self.setup, self.streamer = setup, streamer
        self.rows = list(setup.input_ids)
        self.stopped_at: list[int | None] = [None] * len(self.rows)
        self.active = list(range(len(self.rows)))  # original indices of rows still generating
        self.scores = [[] for _ in self.rows] if keep_scores else None
        self.logits = [[] for _ in self.rows] if keep_logits else None

    @property
    def done(self) -> bool:
        return not self.active

    def add(self, r: int, tokens: torch.Tensor, scores: torch.Tensor, logits: torch.Tensor) -> int:
        """Commit ``tokens [m]`` to row ``r`` left to right; return how many were taken."""
        taken = tokens.shape[0]
        for j in range(tokens.shape[0]):
            self.rows[r] = torch.cat([self.rows[r], tokens[j : j + 1]])
            if self.scores is not None:
                self.scores[r].append(scores[j])
            if self.logits is not None:
                self.logits[r].append(logits[j])
            if self.stopped_at[r] is None and bool(self.setup.stopping(self.rows[r].unsqueeze(0), None)[0]):
                self.stopped_at[r] = len(self.rows[r])
            if self._complete(r):  # nothing after this token is output: not in sequences, scores or streamer
                taken = j + 1
                break
        if self.streamer is not None:  # one put per accepted block, as transformers' assisted generation does
            self.streamer.put(tokens[:taken].cpu())
        return taken

    def _complete(self, r: int) -> bool:
        """Whether row ``r`` has every token ``generate`` would output.

        With an EOS criterion, a row is complete once it stopped. Without one, rows run on until every
        row has stopped and are then cut at the longest stop, so a row is complete at that length.
        """
        if self.stopped_at[r] is None:
            return False
        if self.setup.has_eos_criteria:
            return True
        return all(s is not None for s in self.stopped_at) and len(self.rows[r]) >= max(self.stopped_at)

    def retire(self) -> list[int]:
        """Drop finished rows from ``active``; return the positions (in the old active list) that stay."""
        finished = {r for r in self.active if len(self.rows[r]) >= self.setup.max_length or self._complete(r)}
        stay = [i for i, r in enumerate(self.active) if r not in finished]
        self.active = [self.active[i] for i in stay]
        return stay

    def sequences(self) -> torch.LongTensor:
        if not self.setup.has_eos_criteria:
            last = max(s for s in self.stopped_at)
            return torch.stack([row[:last] for row in self.rows])
        width = max(len(row) for row in self.rows)
        pad = self.setup.pad_token_id if self.setup.pad_token_id is not None else 0
        return torch.stack([torch.nn.functional.pad(row, (0, width - len(row)), value=pad) for row in self.rows])

    def per_step(self, which: list[list[torch.Tensor]] | None) -> tuple[torch.Tensor, ...] | None:
        return None if which is None else tuple(torch.stack(step) for step in zip(*which))


def _process(setup: GenerationSetup, rows: list[torch.Tensor], drafts: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Apply the logits processors at each verify position of each row, with the context that position sees."""
    if not setup.processors:
        return logits
    out = torch.empty_like(logits)
    for b, row in enumerate(rows):
        ids = torch.cat([row, drafts[b]]).unsqueeze(0)
        for j in range(logits.shape[1]):
            out[b, j] = setup.processors(ids[:, : len(row) + j], logits[b : b + 1, j])[0]
    return out


def _choose(setup: GenerationSetup, scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    if setup.do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(-1)
    return scores.argmax(dim=-1)


def _accept(setup: GenerationSetup, drafts: torch.Tensor, q: torch.Tensor | None, scores: torch.Tensor,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    if not setup.do_sample:
        return greedy_accept(drafts, scores)
    p = torch.softmax(scores, dim=-1)
    if q is None:  # deterministic drafter: one-hot q
        q = torch.nn.functional.one_hot(drafts, p.shape[-1]).to(p.dtype)
    return rejection_accept(drafts, q, p, generator)


def speculative_generate(
    verifier: CausalLMRunner,
    drafter: Drafter,
    setup: GenerationSetup,
    num_draft_tokens: int | Any,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    output_scores: bool = False,
    output_logits: bool = False,
) -> EngineResult:
    """Generate with ``drafter`` proposing up to ``num_draft_tokens`` per verifier pass.

    ``num_draft_tokens`` is an int or a draft-length policy (see :mod:`specdec.draft_length`).
    """
    start = time.perf_counter()
    policy = FixedDraftLength(num_draft_tokens) if isinstance(num_draft_tokens, int) else num_draft_tokens
    k_max = num_draft_tokens if isinstance(num_draft_tokens, int) else policy.max_k
    stats = SpecStats(num_draft_tokens=k_max, batch_size=setup.input_ids.shape[0])
    out = _Rows(setup, streamer, output_scores, output_logits)
    if streamer is not None:
        streamer.put(setup.input_ids.cpu())

    slots = cache_slots(setup, k_max)
    logits = verifier.prefill(setup.input_ids, setup.attention_mask, slots).float()
    if hasattr(drafter, "share_prompt"):  # drafters derived from the verifier may adopt its prompt cache
        drafter.share_prompt(verifier)
    drafter.start(setup.input_ids, setup.attention_mask, slots)
    ctx = DraftContext(setup.processors, setup.do_sample, generator, vocab_size=logits.shape[-1])
    scores = setup.processors(setup.input_ids, logits)
    first = _choose(setup, scores, generator)
    for r in range(len(out.rows)):
        out.add(r, first[r : r + 1], scores[r : r + 1], logits[r : r + 1])
    _retire(out, verifier, drafter)
    stats.time_to_first_token = time.perf_counter() - start

    try:
        while not out.done:
            rows = [out.rows[r] for r in out.active]
            room = setup.max_length - max(len(row) for row in rows) - 1
            t0 = time.perf_counter()
            proposal = drafter.propose(rows, policy.choose(room), ctx)
            drafts = proposal.tokens
            t1 = time.perf_counter()
            last = torch.stack([row[-1] for row in rows]).unsqueeze(1)
            fed = verifier.counts  # real tokens cached per row before this pass
            logits = verifier.forward(torch.cat([last, drafts], dim=1)).float()
            t2 = time.perf_counter()
            scores = _process(setup, rows, drafts, logits)
            accepted, tokens = _accept(setup, drafts, proposal.probs, scores, generator)
            added = [out.add(r, tokens[b, : n + 1], scores[b], logits[b]) for b, (r, n) in enumerate(zip(out.active, accepted.tolist()))]
            verifier.keep(fed + torch.tensor(added, device=fed.device))  # the newest committed token stays unfed
            policy.update(drafts.shape[1], int(accepted.min()), t1 - t0, t2 - t1)
            stats.record_step(drafts.shape[1], accepted.tolist(), added, out.active)
            _retire(out, verifier, drafter)
            if not out.done:
                drafter.commit([out.rows[r] for r in out.active])
    finally:
        stats.drafter_forwards = getattr(drafter, "forwards", 0)
        drafter.finish()
        verifier.release()
    if streamer is not None:
        streamer.end()
    sequences = out.sequences()
    stats.new_tokens = (sequences.shape[1] - setup.input_ids.shape[1]) * sequences.shape[0]
    stats.total_time = time.perf_counter() - start
    return EngineResult(sequences, stats, out.per_step(out.scores), out.per_step(out.logits))


def _retire(out: _Rows, verifier: CausalLMRunner, drafter: Drafter) -> None:
    """Remove finished rows from both caches so they cost no more compute."""
    before = len(out.active)
    stay = out.retire()
    if stay and len(stay) < before:
        index = torch.tensor(stay, dtype=torch.long, device="cpu")  # each cache moves it to its own device
        verifier.keep_rows(index)
        drafter.keep_rows(index)
