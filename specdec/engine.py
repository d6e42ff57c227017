"""The speculative decoding loop (docs/design.md, "The engine loop"), for one row or a ragged batch.

Cache invariant between steps: the verifier's cache holds, for every active row, each committed
token except the newest (whose keys are computed as the first position of the next verify pass);
the drafter holds what it needs of each row and learns from :class:`~specdec.drafters.Commit` what
the verifier kept.

Each row accepts its own number of drafts per pass (rows drift apart; the cache masks the slots a
row did not keep). Rows that finish leave the batch, so they cost no more drafter or verifier work.
All per-call state (the verifier's cache session, the per-call drafter, the rows) lives in this call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer

from specdec.acceptance import greedy_accept, rejection_accept
from specdec.arguments import GenerationSetup
from specdec.committed import CommittedRows
from specdec.draft_length import FixedDraftLength
from specdec.drafters.base import Commit, DraftContext, Drafter, Rows
from specdec.slots import cache_slots
from specdec.stats import SpecStats
from specdec.verifiers.hf import CausalLMRunner
from specdec.verifiers.session import CacheSession


@dataclass
class EngineResult:
    sequences: torch.LongTensor
    stats: SpecStats
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None


def call_slots(setup: GenerationSetup, num_draft_tokens: int) -> int:
    """Slots each managed cache of this call is preallocated with (:func:`specdec.slots.cache_slots`)."""
    batch, prompt = setup.input_ids.shape
    return cache_slots(batch, prompt, setup.max_length, num_draft_tokens)


def _process(setup: GenerationSetup, rows: Rows, drafts: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
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
    out = CommittedRows(setup, streamer, output_scores, output_logits)
    if streamer is not None:
        streamer.put(setup.input_ids.cpu())
    drafter, layers = drafter.for_call(), drafter.hidden_layers  # per call: concurrent calls never share state
    slots = call_slots(setup, k_max)
    cache, prompt = verifier.prefill(setup.input_ids, setup.attention_mask, slots, hidden_layers=layers)
    try:
        drafter.start(setup.input_ids, setup.attention_mask, slots, verifier=cache, hidden=prompt.hidden)
        ctx = DraftContext(setup.processors, setup.do_sample, generator, vocab_size=prompt.logits.shape[-1])
        logits = prompt.logits.float()
        scores = setup.processors(setup.input_ids, logits)
        out.add_block(_choose(setup, scores, generator).unsqueeze(1), [1] * len(out.active), scores[:, None], logits[:, None])
        _retire(out, cache, drafter)
        stats.time_to_first_token = time.perf_counter() - start

        while not out.done:
            rows = out.active_rows()
            room = setup.max_length - max(rows.length(b) for b in range(len(rows))) - 1
            t0 = time.perf_counter()
            proposal = drafter.propose(rows, policy.choose(room), ctx)
            drafts = proposal.tokens
            t1 = time.perf_counter()
            last = torch.stack([row[-1] for row in rows]).unsqueeze(1)
            fed = cache.counts  # real tokens cached per row before this pass
            step = cache.forward(torch.cat([last, drafts], dim=1), hidden_layers=layers)
            logits = step.logits.float()
            t2 = time.perf_counter()
            scores = _process(setup, rows, drafts, logits)
            accepted, tokens = _accept(setup, drafts, proposal.probs, scores, generator)
            added = out.add_block(tokens, (accepted + 1).tolist(), scores, logits)
            added_t = torch.tensor(added, dtype=torch.long, device=fed.device)
            cache.keep(fed + added_t)  # the newest committed token stays unfed
            policy.update(drafts.shape[1], int(accepted.min()), t1 - t0, t2 - t1)
            stats.record_step(drafts.shape[1], accepted.tolist(), added, out.active)
            drafter.commit(Commit(out.active_rows(), accepted, added_t, hidden=step.hidden))
            _retire(out, cache, drafter)
    finally:
        stats.drafter_forwards, stats.drafter_stats = drafter.forwards, drafter.stats()
        drafter.finish()
        cache.release()
    if streamer is not None:
        streamer.end()
    sequences = out.sequences()
    stats.new_tokens = (sequences.shape[1] - setup.input_ids.shape[1]) * sequences.shape[0]
    stats.total_time = time.perf_counter() - start
    return EngineResult(sequences, stats, out.per_step(out.scores), out.per_step(out.logits))


def _retire(out: CommittedRows, cache: CacheSession, drafter: Drafter) -> None:
    """Remove finished rows from both caches so they cost no more compute."""
    before = len(out.active)
    stay = out.retire()
    if stay and len(stay) < before:
        index = torch.tensor(stay, dtype=torch.long, device="cpu")  # each cache moves it to its own device
        cache.keep_rows(index)
        drafter.keep_rows(index)
