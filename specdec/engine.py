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

import torch
from transformers.generation.streamers import BaseStreamer

from specdec.arguments import GenerationSetup
from specdec.committed import CommittedRows
from specdec.drafters.base import Drafter
from specdec.protocol import Commit, DraftContext, DraftPlan
from specdec.slots import CallSlots
from specdec.stats import SpecStats
from specdec.verification import verify
from specdec.runners.hf import CausalLMRunner
from specdec.runners.session import CacheSession


@dataclass
class EngineResult:
    sequences: torch.LongTensor
    stats: SpecStats
    scores: tuple[torch.Tensor, ...] | None = None
    logits: tuple[torch.Tensor, ...] | None = None


def _choose(setup: GenerationSetup, scores: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    if setup.do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator).squeeze(-1)
    return scores.argmax(dim=-1)


def speculative_generate(
    verifier: CausalLMRunner,
    drafter: Drafter,
    setup: GenerationSetup,
    plan: DraftPlan,
    streamer: BaseStreamer | None = None,
    generator: torch.Generator | None = None,
    output_scores: bool = False,
    output_logits: bool = False,
    slots: CallSlots | None = None,
) -> EngineResult:
    """Generate with ``drafter`` proposing what ``plan`` asks for each verifier pass: chains of a fixed or
    adaptive ``k`` (:class:`~specdec.chains.ChainPlan`) or trees (:class:`~specdec.trees.plan.TreePlan`).
    ``slots``: the call's cache sizes as its memory check counted them (by default the plan's for this shape)."""
    start = time.perf_counter()
    plan.check(drafter)
    stats = SpecStats(num_draft_tokens=plan.num_draft_tokens, batch_size=setup.input_ids.shape[0], tree=plan.to_dict(),
                      draft_choice=drafter.choice, verify=plan.rule)
    out = CommittedRows(setup, streamer, output_scores, output_logits)
    if streamer is not None:
        streamer.put(setup.input_ids.cpu())
    drafter, layers = drafter.for_call(), drafter.hidden_layers  # per call: concurrent calls never share state
    if slots is None:
        slots = plan.call_slots(*setup.input_ids.shape, setup.max_length, static=verifier.static is not None)
    cache, prompt = verifier.prefill(setup.input_ids, setup.attention_mask, slots.verifier, hidden_layers=layers,
                                     widths=slots.widths)  # widths: the shapes of compiled passes
    try:
        drafter.start(setup.input_ids, setup.attention_mask, slots.rows, verifier=cache, hidden=prompt.hidden)
        ctx = DraftContext(setup.processors, setup.do_sample, generator, vocab_size=prompt.logits.shape[-1])
        logits = prompt.logits.float()
        scores = setup.processors(setup.input_ids, logits)
        first = _choose(setup, scores, generator).unsqueeze(1)
        out.add_block(first, [1] * len(out.active), scores[:, None], logits[:, None])
        _retire(out, cache, drafter)
        stats.time_to_first_token = time.perf_counter() - start

        while not out.done:
            rows = out.active_rows()
            room = setup.max_length - max(rows.length(b) for b in range(len(rows))) - 1
            t0, forwards = time.perf_counter(), drafter.forwards
            drafts = plan.propose(drafter, rows, room, ctx)
            t1 = time.perf_counter()
            stats.draft_seconds += t1 - t0
            v = verify(cache, rows, drafts, setup, layers, generator, plan.rule)
            accepted, block = v.read()  # the pass's one device read: everything below runs on these host ints
            t2 = time.perf_counter()
            added = out.add_block(v.tokens, [a + 1 for a in accepted], v.scores, v.logits, block)
            update = Commit(out.active_rows(), v.accepted, hidden=v.hidden, path=v.path, accepted_host=accepted,
                            added_host=added, path_host=v.path_host)
            v.keep(cache, update)  # the newest committed token stays unfed
            plan.update(drafts, accepted, t1 - t0, t2 - t1, drafter.forwards - forwards, update.path_host)
            stats.record_step(drafts.scored(), accepted, added, out.active)
            drafter.commit(update)
            _retire(out, cache, drafter)
    finally:
        stats.drafter_forwards, stats.drafter_stats = drafter.forwards, drafter.stats()
        stats.tree = plan.to_dict()  # trees: with what auto learnt
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
        index = torch.tensor(stay, dtype=torch.long, device="cpu")  # host data: each drafter uploads it to its device
        cache.keep_rows(stay)  # uploaded without blocking; the pointer stays (no device read)
        drafter.keep_rows(index)
