"""The speculative decoding loop (DESIGN.md section 1).

Cache invariant between steps: the verifier's cache holds every committed token except the newest
(whose keys are computed as the first position of the next verify pass); the drafter holds the
longest prefix of the committed tokens it has seen.

Batches share one cache pointer, so each step commits the same number of tokens in every active
row: the smallest accepted prefix plus one verifier token. Accepting fewer drafts than allowed is
still exact (greedy: the verifier's token at that position *is* the next draft; sampling: each
committed token is a valid draw from p at its position), it only costs speed on ragged batches.
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


class _Committer:
    """Appends tokens one at a time with transformers' exact stop, padding and streaming rules."""

    def __init__(self, setup: GenerationSetup, streamer: BaseStreamer | None, keep_scores: bool, keep_logits: bool):
        self.setup, self.streamer = setup, streamer
        self.sequences = setup.input_ids
        self.unfinished = torch.ones(setup.input_ids.shape[0], dtype=torch.long, device=setup.input_ids.device)
        self.scores: list[torch.Tensor] | None = [] if keep_scores else None
        self.logits: list[torch.Tensor] | None = [] if keep_logits else None

    @property
    def done(self) -> bool:
        return not bool(self.unfinished.any())

    def add(self, tokens: torch.Tensor, scores: torch.Tensor, logits: torch.Tensor) -> int:
        """Commit ``tokens [batch, m]`` left to right until every row stops; return how many were added."""
        for j in range(tokens.shape[1]):
            token = tokens[:, j]
            if self.setup.has_eos_criteria and self.setup.pad_token_id is not None:
                token = token * self.unfinished + self.setup.pad_token_id * (1 - self.unfinished)
            self.sequences = torch.cat([self.sequences, token.unsqueeze(-1)], dim=-1)
            if self.scores is not None:
                self.scores.append(scores[:, j])
            if self.logits is not None:
                self.logits.append(logits[:, j])
            if self.streamer is not None:
                self.streamer.put(token.cpu())
            self.unfinished = self.unfinished & ~self.setup.stopping(self.sequences, None).to(self.unfinished.device)
            if self.done:
                return j + 1
        return tokens.shape[1]


def _process(setup: GenerationSetup, sequences: torch.Tensor, drafts: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Apply the logits processors at each verify position with the context that position sees."""
    ids = torch.cat([sequences, drafts], dim=-1)
    base = sequences.shape[1]
    return torch.stack([setup.processors(ids[:, : base + j], logits[:, j]) for j in range(logits.shape[1])], dim=1)


def _choose(setup: GenerationSetup, scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    if setup.do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(-1)
    return scores.argmax(dim=-1)


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
    out = _Committer(setup, streamer, output_scores, output_logits)
    max_len = setup.max_length
    if streamer is not None:
        streamer.put(setup.input_ids.cpu())

    logits = verifier.prefill(setup.input_ids, setup.attention_mask, max_len).float()
    drafter.start(setup.input_ids, setup.attention_mask, max_len)
    ctx = DraftContext(setup.processors, setup.do_sample, generator, vocab_size=logits.shape[-1])
    scores = setup.processors(setup.input_ids, logits)
    out.add(_choose(setup, scores, generator).unsqueeze(-1), scores.unsqueeze(1), logits.unsqueeze(1))
    stats.time_to_first_token = time.perf_counter() - start

    try:
        while not out.done and out.sequences.shape[1] < max_len:
            seq = out.sequences
            t0 = time.perf_counter()
            proposal = drafter.propose(seq, policy.choose(max_len - seq.shape[1] - 1), ctx)
            drafts = proposal.tokens
            t1 = time.perf_counter()
            logits = verifier.forward(torch.cat([seq[:, verifier.length :], drafts], dim=-1)).float()
            t2 = time.perf_counter()
            scores = _process(setup, seq, drafts, logits)
            if setup.do_sample:
                p = torch.softmax(scores, dim=-1)
                q = proposal.probs
                if q is None:  # deterministic drafter: one-hot q
                    q = torch.nn.functional.one_hot(drafts, p.shape[-1]).to(p.dtype)
                accepted, tokens = rejection_accept(drafts, q, p, generator)
            else:
                accepted, tokens = greedy_accept(drafts, scores)
            active = out.unfinished.bool()
            n = int(accepted[active].min())
            added = out.add(tokens[:, : n + 1], scores, logits)
            policy.update(drafts.shape[1], n, t1 - t0, t2 - t1)
            stats.record_step(drafts.shape[1], accepted[active].tolist(), added, int(active.sum()))
            verifier.rollback(out.sequences.shape[1] - 1)
            drafter.commit(out.sequences)
    finally:
        stats.drafter_forwards = getattr(drafter, "forwards", 0)
        drafter.finish()
        verifier.release()
    if streamer is not None:
        streamer.end()
    stats.new_tokens = (out.sequences.shape[1] - setup.input_ids.shape[1]) * out.sequences.shape[0]
    stats.total_time = time.perf_counter() - start
    return EngineResult(
        out.sequences,
        stats,
        tuple(out.scores) if out.scores is not None else None,
        tuple(out.logits) if out.logits is not None else None,
    )
