"""Measuring one generation: run a method on a prompt (or a left-padded batch) and time what it produced.

A :class:`Runner` per method: a baseline's ``generate`` (its declaration in :mod:`specdec.eval.baselines`) with a
streamer that timestamps each step (time to first token; tokens per assisted step) and, for baselines that draft,
a count of the candidates proposed per step; specdec's own statistics for :class:`specdec.SpeculativeModel`.
:func:`build_runners` builds every drafter once and shares it between its methods.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import torch
from transformers.generation.streamers import BaseStreamer

from specdec.eval.baselines import BaselineSetup, compile_decode_step, static_cache_kwargs
from specdec.eval.methods import (
    DEFAULT_PROMPT_LOOKUP_TOKENS,
    SPECDEC,
    MethodSpec,
    ResolvedDraft,
    resolve_draft,
)

#: tokens of the untimed warm-up generation
WARMUP_TOKENS = 8
#: the ``generate`` state transformers' auto-compile leaves on the model (restored after a run)
_COMPILE_STATE = ("_compiled_call", "_last_compile_config", "_previous_max_cache_length")


@dataclass
class Measurement:
    """What one generation of one prompt by one method produced and cost."""

    output_ids: list[int]
    seconds: float
    time_to_first_token: float
    time_per_output_token: float
    proposed_per_position: list[int] | None = None
    accepted_per_position: list[int] | None = None
    committed_tokens: int | None = None
    verifier_passes: int | None = None
    proposed: int | None = None  # draft tokens the verifier scored (a tree's nodes; a chain's drafts)
    tree: dict | None = None  # the tree configuration used (None: chains)
    compiled_graphs: int | None = None  # hf-compiled: graphs torch.compile built during this (timed) call
    verifier_graphs_in_call: int | None = None  # compile_verifier: verify-pass graphs compiled during this (timed) call
    draft_choice: dict | None = None  # draft="auto": what it chose and the ranking it measured (before any timed call)


class _StepTimer(BaseStreamer):
    """A streamer that timestamps each step's tokens: the first gives HF's time to first token, and
    the number of tokens per step is what a verifier pass committed in assisted generation."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.sizes: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() streams the prompt first
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.sizes.append(int(value.numel()))

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _count_candidates(model: Any) -> Iterator[list[int] | None]:
    """Record how many candidate tokens HF's candidate generator proposes at each assisted step.

    transformers exposes no draft statistics, so this wraps the (private) ``_get_candidate_generator``
    on the instance for one call; if it is missing the list stays ``None`` and acceptance is unknown.
    """
    original = getattr(model, "_get_candidate_generator", None)
    if original is None:
        yield None
        return
    proposals: list[int] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        generator = original(*args, **kwargs)
        get = generator.get_candidates

        def get_candidates(input_ids: torch.Tensor, *a: Any, **kw: Any) -> Any:
            candidates, logits = get(input_ids, *a, **kw)
            proposals.append(int(candidates.shape[-1] - input_ids.shape[-1]))
            return candidates, logits

        generator.get_candidates = get_candidates
        return generator

    model._get_candidate_generator = wrapped
    try:
        yield proposals
    finally:
        del model._get_candidate_generator


def _positions(proposed: Sequence[int], committed: Sequence[int]) -> tuple[list[int], list[int]]:
    """Per-position proposed / accepted counts from per-step proposal sizes and committed tokens."""
    width = max(proposed, default=0)
    prop, acc = [0] * width, [0] * width
    for p, c in zip(proposed, committed):
        for i in range(p):
            prop[i] += 1
        for i in range(min(max(c - 1, 0), p)):  # a step commits its accepted drafts + one verifier token
            acc[i] += 1
    return prop, acc


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode_stats(seconds: float, ttft: float, new_tokens: int) -> float:
    return (seconds - ttft) / (new_tokens - 1) if new_tokens > 1 else 0.0


def _row_outputs(out: torch.Tensor, width: int, eos: set[int]) -> list[list[int]]:
    """Each row's new tokens, up to and including its first EOS (what follows is padding)."""
    rows = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


def _split(outputs: list[list[int]], seconds: float, ttft: float) -> list[Measurement]:
    """One measurement per row of a batch; the batch's wall time is apportioned to rows by their tokens,
    so that summed seconds (and so throughput) are the batch's own."""
    total = sum(len(o) for o in outputs)
    tpot = _decode_stats(seconds, ttft, max((len(o) for o in outputs), default=0))
    share = [(len(o) / total if total else 1 / len(outputs)) for o in outputs]
    return [Measurement(o, seconds * f, ttft, tpot) for o, f in zip(outputs, share)]


def _eos_ids(model: Any, gen_kwargs: Mapping[str, Any]) -> set[int]:
    eos = gen_kwargs.get("eos_token_id", getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    return set() if eos is None else {int(e) for e in ([eos] if isinstance(eos, int) else eos)}


class Runner:
    """Runs one method on one prompt, or on a left-padded batch of prompts."""

    def __init__(self, method: MethodSpec, model: Any, extra: Mapping[str, Any] | None = None, spec: Any = None,
                 seeding: str = "generator"):
        self.method, self.model, self.extra, self.spec = method, model, dict(extra or {}), spec
        self.baseline = method.baseline  # its declaration (None: specdec)
        if self.baseline is None and method.kind != SPECDEC:
            raise ValueError(f"method {method.name!r}: no baseline {method.kind!r} is registered")
        self.prepared: dict[str, Any] | None = None  # the fields its baseline's prepare step added to its records
        self.verifier_compile_seconds: float | None = None  # compile_verifier: priming this method's graphs took
        self.seeding = seeding  # specdec under sampling: a seeded generator per call, or "global" (none; SEEDING)

    def __call__(self, ids: torch.Tensor, gen_kwargs: Mapping[str, Any], seed: int | None,
                 mask: torch.Tensor | None = None) -> list[Measurement]:
        """One :class:`Measurement` per row of ``ids``."""
        mask = torch.ones_like(ids) if mask is None else mask
        if self.method.kind == SPECDEC:
            return self._specdec(ids, mask, gen_kwargs, seed)
        if self.baseline.prepare is None:
            return self._baseline_call(ids, mask, gen_kwargs, seed)
        before = _compiled_frames()  # prepared (compiled) before timing: a graph compiled inside this call is counted
        results = self._baseline_call(ids, mask, gen_kwargs, seed)
        compiled = _compiled_frames() - before
        for result in results:
            result.compiled_graphs = compiled
        return results

    def prepare(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], gen_kwargs: Mapping[str, Any],
                seed: int | None) -> None:
        """Run the baseline's prepare step (``hf-compiled``: compile) for ``batches``, untimed; what it returns is
        added to each of the method's records."""
        self.prepared = dict(self.baseline.prepare(self, batches, gen_kwargs, seed) or {})

    def _baseline_call(self, ids: torch.Tensor, mask: torch.Tensor, gen_kwargs: Mapping[str, Any],
                       seed: int | None) -> list[Measurement]:
        """The baseline's ``generate`` on one batch, timed, its steps timestamped by a streamer (and, for a baseline
        that drafts, the candidates transformers proposed counted per step)."""
        timer = _StepTimer()
        counter = _count_candidates(self.model) if self.method.speculative else contextlib.nullcontext(None)
        if seed is not None:
            torch.manual_seed(seed)
        with counter as proposals:
            start = time.perf_counter()
            out = self.baseline.generate(self.model, ids, attention_mask=mask, streamer=timer, **gen_kwargs,
                                         **self.extra)
            _sync(ids.device)
            seconds = time.perf_counter() - start
        ttft = (timer.times[0] - start) if timer.times else seconds
        results = _split(_row_outputs(out, ids.shape[1], _eos_ids(self.model, gen_kwargs)), seconds, ttft)
        if self.method.speculative:  # transformers speculates for one row only
            result = results[0]
            result.committed_tokens, result.verifier_passes = sum(timer.sizes), len(timer.sizes)
            if proposals is not None and len(proposals) == len(timer.sizes):
                result.proposed_per_position, result.accepted_per_position = _positions(proposals, timer.sizes)
        return results

    def _specdec(self, ids: torch.Tensor, mask: torch.Tensor, gen_kwargs: Mapping[str, Any], seed: int | None) -> list[Measurement]:
        generator = None
        if seed is not None and self.seeding == "global":  # the call users make without a generator
            torch.manual_seed(seed)
        elif seed is not None:
            generator = torch.Generator(device=ids.device).manual_seed(seed)
        # an adaptive method has a SpeculativeModel of its own, built with max k = method.k: passing k per call
        # is only needed for the fixed-k methods, which share one SpeculativeModel per drafter
        k = None if self.method.adaptive else self.method.k
        graphs = self.spec.compiled_graphs
        start = time.perf_counter()
        out = self.spec.generate(ids, attention_mask=mask, num_draft_tokens=k, generator=generator, **gen_kwargs)
        _sync(ids.device)
        seconds = time.perf_counter() - start
        stats = self.spec.last_stats
        results = _split(_row_outputs(out, ids.shape[1], _eos_ids(self.model, gen_kwargs)), seconds,
                         stats.time_to_first_token)
        for result, row in zip(results, stats.rows):
            result.proposed_per_position = list(row.proposed_per_position)
            result.accepted_per_position = list(row.accepted_per_position)
            result.committed_tokens, result.verifier_passes = row.committed, row.verifier_passes
            result.proposed, result.tree, result.draft_choice = row.proposed, stats.tree, stats.draft_choice
            if graphs is not None:  # counted once per call, on its first row
                result.verifier_graphs_in_call = 0 if result is not results[0] else self.spec.compiled_graphs - graphs
        return results


class CompiledRunner(Runner):
    """``hf-compiled`` driven step by step, for scripts that time it outside ``specdec eval``
    (``benchmarks/gpu_check.py``): :meth:`configure`, then :meth:`compile` (``specdec eval`` runs both as the
    baseline's prepare step)."""

    def __init__(self, method: MethodSpec, model: Any) -> None:
        super().__init__(method, model)
        self.compile_seconds: float | None = None
        self.max_cache_len: int | None = None

    def configure(self, max_cache_len: int) -> None:
        """Fix the static cache length of every call (the largest prompt width + ``max_new_tokens``)."""
        self.max_cache_len = max_cache_len
        self.extra = static_cache_kwargs(self.model, max_cache_len)

    def compile(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], gen_kwargs: Mapping[str, Any],
                seed: int | None) -> float:
        """Compile the decode step for each batch shape in ``batches``, untimed; returns the compile seconds."""
        if self.max_cache_len is None:
            raise RuntimeError("hf-compiled: configure(max_cache_len) before compiling")
        self.compile_seconds = compile_decode_step(self, batches, gen_kwargs, seed)
        return self.compile_seconds


def _compiled_frames() -> int:
    """Frames torch.compile has compiled in this process so far (to catch a compile inside a timed call)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


@contextlib.contextmanager
def restore_compile_state(model: Any) -> Iterator[None]:
    """Leave the model as it was: drop the compiled call (and cache sizing) ``hf-compiled`` made ``generate`` keep."""
    saved = {name: vars(model)[name] for name in _COMPILE_STATE if name in vars(model)}
    try:
        yield
    finally:
        for name in _COMPILE_STATE:
            if name in saved:
                setattr(model, name, saved[name])
            elif name in vars(model):
                delattr(model, name)


def build_runners(
    methods: Sequence[MethodSpec], model: Any, tokenizer: Any, prompt_lookup_num_tokens: int = DEFAULT_PROMPT_LOOKUP_TOKENS,
    compile_drafter: bool = False, seeding: str = "generator", draft_tokenizer: Any = None,
) -> dict[str, Runner]:
    """One runner per method; each drafter is built once and shared by its specdec and HF-assisted methods.

    ``compile_drafter`` compiles specdec's model drafters (not the module HF assisted generation uses:
    the compiled forward belongs to the drafter, the module is left as it is). Methods with ``compiled`` get
    compiled verify passes (:func:`prime_verifiers` compiles them). ``seeding`` (:data:`SEEDING`): how specdec's
    sampled calls are seeded. ``draft_tokenizer``: the drafters' tokenizer where it is not the verifier's and not
    beside the drafter's model.
    """
    from specdec.api import SpeculativeModel

    drafts: dict[Any, ResolvedDraft] = {}
    specs: dict[tuple[str, int | None, str | None], Any] = {}
    runners: dict[str, Runner] = {}
    for m in methods:
        if m.draft is not None and m.draft not in drafts:
            drafts[m.draft] = resolve_draft(m.draft, model, tokenizer, draft_tokenizer)
        if m.baseline is not None:  # its own generate arguments, as its declaration builds them
            draft = drafts.get(m.draft)
            setup = BaselineSetup(model, tokenizer, m.draft, draft.assistant if draft else None,
                                  prompt_lookup_num_tokens, draft.draft.draft_tokenizer if draft else None)
            extra = m.baseline.generate_kwargs(setup) if m.baseline.generate_kwargs is not None else None
            runners[m.name] = Runner(m, model, extra)
        else:
            key = (m.draft, m.k if m.adaptive else None, m.tree, m.compiled, m.cache, m.verify)  # adaptive k learns per method
            if key not in specs:
                drafter = drafts[m.draft].draft if m.cache is None else _cache_drafter(drafts, m, model, tokenizer, draft_tokenizer)
                if compile_drafter and drafter.compilable and not any(s.drafter is drafter for s in specs.values()):
                    drafter.compile()  # once per drafter: its SpeculativeModels share it
                specs[key] = SpeculativeModel(model, drafter, num_draft_tokens=m.k, tokenizer=tokenizer,
                                              adaptive=m.adaptive, tree=m.tree, compile_verifier=m.compiled,
                                              verify=m.verify)
            runners[m.name] = Runner(m, model, spec=specs[key], seeding=seeding)
    return runners


def _cache_drafter(drafts: dict[Any, ResolvedDraft], m: MethodSpec, model: Any, tokenizer: Any,
                   draft_tokenizer: Any = None) -> Any:
    """The drafter of a method with a cross-call cache: one per method, so no two methods share a cache (a warm
    method run after another on the same prompt would find that prompt's output in a shared one); a cold one's never
    learns (it stays empty), a warm one's learns from each call."""
    from specdec.drafters.suffix import cross_call_cache

    key = ("cross-call cache", m.name)
    if key not in drafts:
        drafts[key] = resolve_draft(m.draft, model, tokenizer, draft_tokenizer)
        cache = cross_call_cache(drafts[key].draft)
        if cache is not None:
            cache.learning = m.cache == "warm"
    return drafts[key].draft


def clear_cross_call_caches(runners: Mapping[str, Runner]) -> None:
    """Empty every specdec drafter's cross-call cache (after the untimed warm-up, which must teach it nothing)."""
    from specdec.drafters.suffix import cross_call_cache

    for runner in runners.values():
        cache = None if runner.spec is None else cross_call_cache(runner.spec.drafter)
        if cache is not None:
            cache.clear()


def measure_before_timing(runners: Mapping[str, Runner]) -> None:
    """Measure now, once per :class:`~specdec.SpeculativeModel`, what its first call would otherwise measure inside
    a timed call, warm-up or not: ``draft="auto"``'s choice of drafter and every ``tree=auto`` method's verifier cost
    curve."""
    from specdec.drafters.auto import AutoDrafter

    specs = {id(r.spec): r.spec for r in runners.values() if r.spec is not None}
    for spec in specs.values():
        if isinstance(spec.drafter, AutoDrafter):
            spec.drafter.choose()
        spec.measure_tree_cost()


def prime_verifiers(runners: Mapping[str, Runner], batches: Sequence[tuple[tuple[torch.Tensor, torch.Tensor], Sequence[Any]]],
                    max_new_tokens: int, progress: bool = True) -> None:
    """Compile every verify-pass graph the specdec methods of ``runners`` will meet on ``batches`` (encoded
    ``(ids, mask)`` with the methods pending on them), untimed; each runner's ``verifier_compile_seconds`` is the
    priming of its own shapes (graphs another method compiled first are shared, so they cost it little)."""
    from tqdm.auto import tqdm

    todo = [r for r in runners.values() if r.spec is not None and r.spec.compile_verifier]
    bar = tqdm(total=len(todo), desc="compiling verify passes", unit="method", disable=not progress, file=sys.stderr)
    try:
        for runner in todo:
            mine = [ids for (ids, _), pending in batches if runner.method in pending]
            lengths_by_batch: dict[int, set[int]] = {}
            for ids in mine:
                lengths_by_batch.setdefault(ids.shape[0], set()).add(ids.shape[1])
            k = None if runner.method.adaptive else runner.method.k
            runner.verifier_compile_seconds = sum(
                runner.spec.prime_verifier(max_new_tokens, lengths, batch_size=batch, num_draft_tokens=k)
                for batch, lengths in sorted(lengths_by_batch.items()))
            bar.set_postfix_str(f"{runner.method.name}: {runner.verifier_compile_seconds:.0f}s")
            bar.update(1)
    finally:
        bar.close()


def prime_drafters(runners: Mapping[str, Runner], progress: bool = True) -> None:
    """Compile every specdec drafter of ``runners`` for each input shape class now, not inside a timed call
    (a tqdm bar on stderr: a drafter compiles for a minute or more on a CPU)."""
    from tqdm.auto import tqdm

    drafters = {id(r.spec.drafter): r.spec.drafter for r in runners.values() if r.spec is not None}
    for drafter in tqdm(drafters.values(), desc="compiling drafters", unit="drafter", disable=not progress,
                        file=sys.stderr):
        drafter.prime()
