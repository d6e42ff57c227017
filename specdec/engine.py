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

from specdec.arguments import GenerationSetup
from specdec.committed import CommittedRows
from specdec.draft_length import FixedDraftLength
from specdec.drafters.base import Commit, DraftContext, Drafter, Rows
from specdec.slots import cache_slots, pass_widths
from specdec.stats import SpecStats
from specdec.trees.plan import TreePlan
from specdec.trees.tree import DraftTree
from specdec.verification import verify_chain, verify_tree
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
    tree: TreePlan | None = None,
) -> EngineResult:
    """Generate with ``drafter`` proposing up to ``num_draft_tokens`` per verifier pass.

    ``num_draft_tokens`` is an int or a draft-length policy (see :mod:`specdec.draft_length`); with
    ``tree`` the drafter proposes trees (:mod:`specdec.trees`) and ``num_draft_tokens`` only sizes caches.
    """
    start = time.perf_counter()
    policy = FixedDraftLength(num_draft_tokens) if isinstance(num_draft_tokens, int) else num_draft_tokens
    k_max = num_draft_tokens if isinstance(num_draft_tokens, int) else policy.max_k
    if tree is not None and not drafter.supports_tree:
        raise ValueError(f"{type(drafter).__name__} cannot draft trees: use tree=None (chains) with this drafter")
    stats = SpecStats(num_draft_tokens=k_max, batch_size=setup.input_ids.shape[0],
                      tree=None if tree is None else tree.config.to_dict())
    out = CommittedRows(setup, streamer, output_scores, output_logits)
    if streamer is not None:
        streamer.put(setup.input_ids.cpu())
    drafter, layers = drafter.for_call(), drafter.hidden_layers  # per call: concurrent calls never share state
    slots = call_slots(setup, k_max) + (0 if tree is None else tree.config.extra_slots)
    widths = pass_widths(k_max, None if tree is None else tree.config.max_nodes)  # compiled passes' shapes
    cache, prompt = verifier.prefill(setup.input_ids, setup.attention_mask, slots, hidden_layers=layers, widths=widths)
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
            t0, forwards = time.perf_counter(), drafter.forwards
            if tree is not None and room > 0:
                proposal = drafter.propose_tree(rows, tree.shape(room), ctx)
            else:
                proposal = drafter.propose(rows, policy.choose(room), ctx)
            t1 = time.perf_counter()
            stats.draft_seconds += t1 - t0
            fed = cache.counts  # real tokens cached per row before this pass
            verify = verify_tree if isinstance(proposal, DraftTree) else verify_chain
            v = verify(cache, rows, proposal, setup, layers, generator)
            t2 = time.perf_counter()
            added = out.add_block(v.tokens, (v.accepted + 1).tolist(), v.scores, v.logits)
            added_t = torch.tensor(added, dtype=torch.long, device=fed.device)
            v.keep(cache, fed, added_t)  # the newest committed token stays unfed
            if isinstance(proposal, DraftTree):
                tree.update(proposal, v.accepted, t1 - t0, drafter.forwards - forwards)
            else:
                policy.update(proposal.num_tokens, int(v.accepted.min()), t1 - t0, t2 - t1)
            stats.record_step(_proposed(proposal), v.accepted.tolist(), added, out.active)
            drafter.commit(Commit(out.active_rows(), v.accepted, added_t, hidden=v.hidden, path=v.path))
            _retire(out, cache, drafter)
    finally:
        stats.drafter_forwards, stats.drafter_stats = drafter.forwards, drafter.stats()
        if tree is not None:
            stats.tree = tree.to_dict()  # with what auto learnt
        drafter.finish()
        cache.release()
    if streamer is not None:
        streamer.end()
    sequences = out.sequences()
    stats.new_tokens = (sequences.shape[1] - setup.input_ids.shape[1]) * sequences.shape[0]
    stats.total_time = time.perf_counter() - start
    return EngineResult(sequences, stats, out.per_step(out.scores), out.per_step(out.logits))


def _proposed(proposal) -> list[tuple[int, int]]:
    """Per row: (drafts scored, positions they span): a chain's ``k`` at ``k`` positions, a tree's nodes over its depth."""
    if not isinstance(proposal, DraftTree):
        return [(proposal.num_tokens, proposal.num_tokens)] * proposal.tokens.shape[0]
    _, valid = proposal.host()
    return [(sum(ok), max((d for d, v in zip(depth, ok) if v), default=0))
            for depth, ok in zip(proposal.depths(), valid)]


def _retire(out: CommittedRows, cache: CacheSession, drafter: Drafter) -> None:
    """Remove finished rows from both caches so they cost no more compute."""
    before = len(out.active)
    stay = out.retire()
    if stay and len(stay) < before:
        index = torch.tensor(stay, dtype=torch.long, device="cpu")  # each cache moves it to its own device
        cache.keep_rows(index)
        drafter.keep_rows(index)
