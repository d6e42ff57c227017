"""The evaluation loop: every prompt through every method back to back, one JSON line per (prompt, method).

Methods (:class:`MethodSpec`):

- ``hf``: plain ``model.generate``, the reference for speedups and output identity;
- ``hf-compiled``: ``model.generate(cache_implementation="static")`` with its decode step compiled by
  ``torch.compile`` (transformers' recipe), compiled before timing;
- ``hf-assisted[D]``: ``model.generate(assistant_model=<D's model>)`` with transformers' defaults;
- ``hf-assisted-heuristic[D]``: the same with transformers' ``num_assistant_tokens_schedule="heuristic"``
  (its adaptive draft length);
- ``hf-prompt-lookup``: ``model.generate(prompt_lookup_num_tokens=N)``;
- ``specdec[D,k=K]``: :class:`specdec.SpeculativeModel` with drafter ``D`` drafting ``K`` tokens per pass.

For ``self:SCHEME`` the quantized copy is built once and the same module drafts for specdec and for HF
assisted generation. Methods run in an order rotated per prompt, after one warm-up each, with the same
chat template and generation arguments. Records go to ``records.jsonl`` (``records.rankN.jsonl`` per
process under ``accelerate launch``) as each prompt finishes; a rerun skips recorded pairs, and refuses a
directory recorded with other settings (``eval_config.json``) or other prompt text (each record's hash).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import torch
from transformers.generation.streamers import BaseStreamer

from specdec.eval.datasets import DEFAULT_GROUP, Prompt, rows_to_prompts
from specdec.eval.side_by_side import encode_prompt

HF, HF_ASSISTED, HF_PROMPT_LOOKUP, SPECDEC = "hf", "hf-assisted", "hf-prompt-lookup", "specdec"
HF_ASSISTED_HEURISTIC = "hf-assisted-heuristic"
HF_COMPILED = "hf-compiled"
BASELINE_KINDS = (HF, HF_COMPILED, HF_ASSISTED, HF_ASSISTED_HEURISTIC, HF_PROMPT_LOOKUP)
#: methods that do not draft: no acceptance statistics, but (greedy) compared with ``hf`` token for token
PLAIN_KINDS = (HF, HF_COMPILED)
ASSISTED_KINDS = (HF_ASSISTED, HF_ASSISTED_HEURISTIC)
#: the assistant generation settings of ``hf-assisted-heuristic``: transformers' own heuristic schedule
#: (k + 2 after a fully accepted draft, k - 1 otherwise) from its former default start of 5 tokens
HEURISTIC_ASSISTANT = {"num_assistant_tokens_schedule": "heuristic", "num_assistant_tokens": 5}
DEFAULT_BASELINES = (HF, HF_ASSISTED)
DEFAULT_DRAFT = "self:int8"
DEFAULT_PROMPT_LOOKUP_TOKENS = 10  # the value transformers' docs use
WARMUP_TOKENS = 8
CONFIG_FILE = "eval_config.json"
RECORDS_FILE = "records.jsonl"
#: settings that change what a recorded (prompt, method) pair means: a resume must match them
RESUME_KEYS = ("model", "dataset", "dtype", "device", "device_name", "num_processes", "max_new_tokens", "do_sample",
               "temperature", "top_p", "seed", "chat_template", "prompt_lookup_num_tokens", "batch_size",
               "compile_drafter", "warmup")
#: keys that only matter to some methods: ``None`` (no such method in that run) matches any value
_OPTIONAL_KEYS = ("prompt_lookup_num_tokens",)
_RESUME_DEFAULTS = {"batch_size": 1, "compile_drafter": False}  # runs recorded before these keys existed
#: the ``generate`` state transformers' auto-compile leaves on the model (restored after a run)
_COMPILE_STATE = ("_compiled_call", "_last_compile_config", "_previous_max_cache_length")
#: device types on which ``generate`` compiles a static-cache decode step without being asked
_AUTO_COMPILE_DEVICES = ("cuda", "xpu", "neuron", "tpu")


# --------------------------------------------------------------------------------------------
# methods and drafters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodSpec:
    """One generation method: ``kind`` plus the drafter and draft length where they apply."""

    kind: str
    draft: str | None = None
    k: int | None = None
    adaptive: bool = False  # specdec only: choose the draft length per step, up to k

    def __post_init__(self) -> None:
        if self.kind not in (*BASELINE_KINDS, SPECDEC):
            raise ValueError(f"unknown method {self.kind!r}; choose from {', '.join((*BASELINE_KINDS, SPECDEC))}")
        if self.kind in (*ASSISTED_KINDS, SPECDEC) and not self.draft:
            raise ValueError(f"method {self.kind} needs a drafter")
        if self.kind == SPECDEC and (not isinstance(self.k, int) or self.k < 1):
            raise ValueError(f"specdec needs a draft length k >= 1, got {self.k!r}")

    @property
    def name(self) -> str:
        """Stable name used in records and ``summary.json``: ``hf``, ``hf-assisted[self:int8]``, ``specdec[self:int8,k=4]``."""
        if self.kind == SPECDEC:
            return f"{SPECDEC}[{self.draft},k={self.k}{',adaptive' if self.adaptive else ''}]"
        if self.kind in ASSISTED_KINDS:
            return f"{self.kind}[{self.draft}]"
        return self.kind

    @property
    def speculative(self) -> bool:
        """Whether the method drafts and verifies (and so has acceptance statistics)."""
        return self.kind not in PLAIN_KINDS

    @classmethod
    def parse(cls, name: str) -> "MethodSpec":
        """Inverse of :attr:`name`."""
        m = re.fullmatch(r"(hf-assisted-heuristic|hf-assisted|specdec)\[(.+?)(?:,k=(\d+))?(,adaptive)?\]", name.strip())
        if m:
            return cls(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None, bool(m.group(4)))
        return cls(name.strip())


@dataclass
class ResolvedDraft:
    """A drafter for both sides: what ``SpeculativeModel(draft=...)`` takes, and an HF model for
    ``model.generate(assistant_model=...)`` (``None`` when the drafter is not a causal LM)."""

    name: str
    draft: Any
    assistant: torch.nn.Module | None = None
    draft_tokenizer: Any = None


DrafterBuilder = Callable[[str, Any, Any], Any]
_DRAFTERS: dict[str, tuple[DrafterBuilder, bool]] = {}


def register_drafter(prefix: str, builder: DrafterBuilder, *, hf_assistant: bool = False) -> None:
    """Make ``--draft PREFIX[:ARGS]`` resolve through ``builder(spec, model, tokenizer)``.

    The builder returns a :class:`ResolvedDraft`, a causal LM (used for specdec and, with
    ``hf_assistant=True``, for HF assisted generation) or anything ``SpeculativeModel`` accepts as
    ``draft``. ``hf_assistant`` says whether the drafter can also serve ``hf-assisted``.
    """
    _DRAFTERS[prefix] = (builder, hf_assistant)


def _is_local_model(spec: str) -> bool:
    return os.path.isdir(spec) or (spec.endswith(".gguf") and os.path.isfile(spec))


def has_hf_assistant(spec: str) -> bool:
    """Whether drafter ``spec`` is a causal LM that HF assisted generation can use."""
    prefix = spec.split(":", 1)[0]
    if prefix in _DRAFTERS:
        return _DRAFTERS[prefix][1]
    return spec.startswith("self:") or _is_local_model(spec)


def resolve_draft(spec: str, model: Any, tokenizer: Any = None) -> ResolvedDraft:
    """Build drafter ``spec`` for ``model``: the one place drafter names are turned into objects.

    Order: drafters registered with :func:`register_drafter` (by the part before ``:``), then
    ``self:SCHEME`` (``specdec.quant.quantize(model, SCHEME)``, shared by specdec and HF assisted),
    then a local model directory / ``.gguf`` file; any other name is handed to ``SpeculativeModel``,
    which resolves the drafters specdec itself knows.
    """
    prefix = spec.split(":", 1)[0]
    if prefix in _DRAFTERS:
        builder, hf_ok = _DRAFTERS[prefix]
        built = builder(spec, model, tokenizer)
        if isinstance(built, ResolvedDraft):
            return built
        assistant = built if hf_ok and isinstance(built, torch.nn.Module) else None
        return ResolvedDraft(spec, built, assistant)
    if spec.startswith("self:"):
        from specdec.quant import quantize

        # one module for both sides: specdec recognises it as derived from the verifier (it shares the
        # embedding table) and lets it adopt the verifier's cached prompt, as for draft="self:SCHEME"
        copy = quantize(model, spec.split(":", 1)[1])
        return ResolvedDraft(spec, copy, copy)
    if _is_local_model(spec):
        from specdec.models import load_model

        draft_model, draft_tok = load_model(spec, dtype=model.dtype, device=model.device)
        return ResolvedDraft(spec, draft_model, draft_model, draft_tok)
    return ResolvedDraft(spec, spec, None)


def plan_methods(
    baselines: Iterable[str] = DEFAULT_BASELINES,
    drafts: Iterable[str] = (DEFAULT_DRAFT,),
    num_draft_tokens: Iterable[int] = (4,),
    adaptive: bool = False,
) -> list[MethodSpec]:
    """The methods of a run: ``hf`` (always: it is the reference), ``hf-compiled`` when asked for, the other
    baselines, then specdec per drafter and k
    (and, with ``adaptive``, each of those again with adaptive draft length up to k).

    ``hf-assisted`` is planned for each drafter that is a causal LM; for the others a warning says
    why it is left out.
    """
    baselines, drafts, ks = list(baselines), list(drafts), list(num_draft_tokens)
    unknown = [b for b in baselines if b not in BASELINE_KINDS]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINE_KINDS)}")
    methods = [MethodSpec(HF)]
    if HF_COMPILED in baselines:
        methods.append(MethodSpec(HF_COMPILED))
    for kind in (k for k in ASSISTED_KINDS if k in baselines):
        for d in drafts:
            if has_hf_assistant(d):
                methods.append(MethodSpec(kind, d))
            else:
                warnings.warn(f"{kind} needs a causal LM as assistant; drafter {d!r} is not one, skipped",
                              stacklevel=2)
    if HF_PROMPT_LOOKUP in baselines:
        methods.append(MethodSpec(HF_PROMPT_LOOKUP))
    methods += [MethodSpec(SPECDEC, d, k) for d in drafts for k in ks]
    if adaptive:
        methods += [MethodSpec(SPECDEC, d, k, adaptive=True) for d in drafts for k in ks]
    return list(dict.fromkeys(methods))


# --------------------------------------------------------------------------------------------
# measuring one generation
# --------------------------------------------------------------------------------------------


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
    compiled_graphs: int | None = None  # hf-compiled: graphs torch.compile built during this (timed) call


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


class _Runner:
    """Runs one method on one prompt, or on a left-padded batch of prompts."""

    def __init__(self, method: MethodSpec, model: Any, extra: Mapping[str, Any] | None = None, spec: Any = None,
                 assistant_settings: Mapping[str, Any] | None = None):
        self.method, self.model, self.extra, self.spec = method, model, dict(extra or {}), spec
        self.assistant_settings = dict(assistant_settings or {})

    def __call__(self, ids: torch.Tensor, gen_kwargs: Mapping[str, Any], seed: int | None,
                 mask: torch.Tensor | None = None) -> list[Measurement]:
        """One :class:`Measurement` per row of ``ids``."""
        mask = torch.ones_like(ids) if mask is None else mask
        if self.method.kind == SPECDEC:
            return self._specdec(ids, mask, gen_kwargs, seed)
        return self._hf(ids, mask, gen_kwargs, seed)

    def _hf(self, ids: torch.Tensor, mask: torch.Tensor, gen_kwargs: Mapping[str, Any], seed: int | None) -> list[Measurement]:
        timer = _StepTimer()
        counter = _count_candidates(self.model) if self.method.speculative else contextlib.nullcontext(None)
        if seed is not None:
            torch.manual_seed(seed)
        with counter as proposals, self._assistant_config():
            start = time.perf_counter()
            out = self.model.generate(ids, attention_mask=mask, streamer=timer, **gen_kwargs, **self.extra)
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

    @contextlib.contextmanager
    def _assistant_config(self) -> Iterator[None]:
        """transformers reads the draft schedule from the assistant's own generation config (and the
        heuristic schedule writes its state back there): set it for this call only, so methods sharing
        the assistant module do not leak settings into each other."""
        config = getattr(self.extra.get("assistant_model"), "generation_config", None)
        if not self.assistant_settings or config is None:
            yield
            return
        saved = {k: getattr(config, k, None) for k in self.assistant_settings}
        for k, v in self.assistant_settings.items():
            setattr(config, k, v)
        try:
            yield
        finally:
            for k, v in saved.items():
                setattr(config, k, v)

    def _specdec(self, ids: torch.Tensor, mask: torch.Tensor, gen_kwargs: Mapping[str, Any], seed: int | None) -> list[Measurement]:
        generator = torch.Generator(device=ids.device).manual_seed(seed) if seed is not None else None
        # an adaptive method has a SpeculativeModel of its own, built with max k = method.k: passing k per call
        # is only needed for the fixed-k methods, which share one SpeculativeModel per drafter
        k = None if self.method.adaptive else self.method.k
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
        return results


class _CompiledRunner(_Runner):
    """``hf-compiled``: ``model.generate`` with a static KV cache, whose decode step transformers compiles.

    transformers' own mechanism is used: with ``cache_implementation="static"`` and a ``compile_config``,
    ``generate`` runs the prefill eagerly and each decode step through ``model.get_compiled_call`` (a
    ``torch.compile`` of the model's ``__call__``, kept on the model as ``_compiled_call``); the model's
    ``forward`` is never replaced. It does so by itself on CUDA/XPU; elsewhere (CPU) ``CompileConfig``'s
    private ``_compile_all_devices`` switch turns it on. Every call gets the same ``max_cache_len`` (the
    longest prompt of the run + ``max_new_tokens``), so every decode step has the same shapes whatever
    the prompt length: one graph per batch size, compiled by :meth:`compile` before any timed call.
    On CUDA transformers' default compile mode (``reduce-overhead``, CUDA graphs) is used; elsewhere
    ``mode="default"``, the faster of the two without CUDA graphs.
    """

    def __init__(self, method: MethodSpec, model: Any) -> None:
        super().__init__(method, model)
        self.compile_seconds: float | None = None
        self.max_cache_len: int | None = None

    def configure(self, max_cache_len: int) -> None:
        """Fix the static cache length of every call (the largest prompt width + ``max_new_tokens``)."""
        from transformers import CompileConfig

        config = CompileConfig()  # transformers' defaults: inductor, mode="reduce-overhead", not fullgraph
        if self.model.device.type != "cuda":
            # "reduce-overhead" means CUDA graphs; without them it is slower than eager on a CPU. Measured on
            # SmolLM2, 128 tokens, static cache: eager 5.4 s, reduce-overhead 6.3 s, default mode 5.3 s.
            config.mode = "default"
        if self.model.device.type not in _AUTO_COMPILE_DEVICES:
            config._compile_all_devices = True  # generate compiles on accelerators only unless told so
        self.max_cache_len = max_cache_len
        self.extra = {"cache_implementation": "static", "max_cache_len": max_cache_len, "compile_config": config}

    def compile(self, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], gen_kwargs: Mapping[str, Any],
                seed: int | None) -> float:
        """Compile the decode step for each batch shape in ``batches``, untimed; returns the compile seconds.

        Each shape is generated twice: compile time is the first call's wall time less the second's (the
        same call, already compiled).
        """
        if self.max_cache_len is None:
            raise RuntimeError("hf-compiled: configure(max_cache_len) before compiling")
        new = min(WARMUP_TOKENS, int(gen_kwargs["max_new_tokens"]))
        if new < 2:  # the only new token comes from the (eager) prefill: there is no decode step to compile
            self.compile_seconds = 0.0
            return 0.0
        # min_new_tokens: an early EOS must not end the call before the decode step has run (and compiled)
        kwargs = {**gen_kwargs, "max_new_tokens": new, "min_new_tokens": new}
        total = 0.0
        for ids, mask in {ids.shape[0]: (ids, mask) for ids, mask in batches}.values():
            times = []
            for _ in range(2):
                start = time.perf_counter()
                self._hf(ids, mask, kwargs, seed)
                times.append(time.perf_counter() - start)
            total += max(0.0, times[0] - times[1])
        if getattr(self.model, "_compiled_call", None) is None:
            raise RuntimeError(f"hf-compiled: transformers' generate did not compile the decode step of "
                               f"{type(self.model).__name__} (its auto-compile criteria were not met)")
        self.compile_seconds = total
        return total

    def __call__(self, ids: torch.Tensor, gen_kwargs: Mapping[str, Any], seed: int | None,
                 mask: torch.Tensor | None = None) -> list[Measurement]:
        before = _compiled_frames()
        results = super().__call__(ids, gen_kwargs, seed, mask)
        compiled = _compiled_frames() - before
        for result in results:
            result.compiled_graphs = compiled
        return results


def _compiled_frames() -> int:
    """Frames torch.compile has compiled in this process so far (to catch a compile inside a timed call)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


@contextlib.contextmanager
def _restore_compile_state(model: Any) -> Iterator[None]:
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
    compile_drafter: bool = False,
) -> dict[str, _Runner]:
    """One runner per method; each drafter is built once and shared by its specdec and HF-assisted methods.

    ``compile_drafter`` compiles specdec's model drafters (not the module HF assisted generation uses).
    """
    import specdec

    drafts: dict[str, ResolvedDraft] = {}
    specs: dict[tuple[str, int | None], Any] = {}
    runners: dict[str, _Runner] = {}
    for m in methods:
        if m.draft is not None and m.draft not in drafts:
            drafts[m.draft] = resolve_draft(m.draft, model, tokenizer)
        if m.kind == HF:
            runners[m.name] = _Runner(m, model)
        elif m.kind == HF_COMPILED:
            runners[m.name] = _CompiledRunner(m, model)
        elif m.kind == HF_PROMPT_LOOKUP:
            runners[m.name] = _Runner(m, model, {"prompt_lookup_num_tokens": prompt_lookup_num_tokens})
        elif m.kind in ASSISTED_KINDS:
            assistant = drafts[m.draft].assistant
            if assistant is None:
                raise ValueError(f"drafter {m.draft!r} is not a causal LM: HF assisted generation cannot use it")
            settings = HEURISTIC_ASSISTANT if m.kind == HF_ASSISTED_HEURISTIC else None
            runners[m.name] = _Runner(m, model, {"assistant_model": assistant}, assistant_settings=settings)
        else:
            key = (m.draft, m.k if m.adaptive else None)  # an adaptive policy learns per method
            if key not in specs:
                d = drafts[m.draft]
                specs[key] = specdec.SpeculativeModel(
                    model, d.draft, num_draft_tokens=m.k, tokenizer=tokenizer, draft_tokenizer=d.draft_tokenizer,
                    adaptive=m.adaptive,
                )
                if compile_drafter and hasattr(specs[key].drafter, "compile"):
                    specs[key].drafter.compile()
            runners[m.name] = _Runner(m, model, spec=specs[key])
    return runners


# --------------------------------------------------------------------------------------------
# records on disk
# --------------------------------------------------------------------------------------------


def shard_path(out_dir: Path, rank: int = 0, world: int = 1) -> Path:
    """The JSONL file this process appends to."""
    return out_dir / (RECORDS_FILE if world == 1 else f"records.rank{rank}.jsonl")


def load_records(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record in ``out_dir`` (all shards), first occurrence of each (prompt, method) pair kept.

    A line cut short by an interrupted run is skipped (its pair is simply run again).
    """
    out_dir = Path(out_dir)
    files = sorted(out_dir.glob("records*.jsonl"), key=lambda p: (p.name != RECORDS_FILE, p.name))
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    for path in files:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            seen.setdefault((str(rec["prompt_id"]), rec["method"]), rec)
    return list(seen.values())


class ResumeError(ValueError):
    """The output directory holds results of another configuration, or of other prompt text."""


class OutputDirError(ValueError):
    """The output directory cannot be used: an existing file, or a place this process cannot write to."""


def check_out_dir(path: str | os.PathLike) -> Path:
    """Raise :class:`OutputDirError` (one line) unless ``path`` is, or can be made, a writable directory.

    Nothing is left behind: writability is probed with a temporary entry that is removed at once (a
    permission check alone would pass for root on a read-only or virtual file system).
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"output directory {str(out)!r} is an existing file, not a directory")
    probe = out
    while not probe.exists():  # the nearest ancestor that exists is where the directory would be made
        probe = probe.parent
    if not probe.is_dir():
        raise OutputDirError(f"cannot create output directory {str(out)!r}: {str(probe)!r} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".specdec-probe-", dir=probe))
    except OSError as err:
        reason = err.strerror or str(err)
        if probe == out:
            raise OutputDirError(f"output directory {str(out)!r} is not writable ({reason})") from None
        raise OutputDirError(f"cannot create output directory {str(out)!r}: {str(probe)!r} is not writable ({reason})") from None
    return out


def prompt_hash(text: str) -> str:
    """What a record stores of its prompt's text (SHA-256, 16 hex digits): a resume refuses other text under its id."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _end_partial_line(path: Path) -> None:
    """An interrupted run may leave half a line: end it, so the next record starts on a line of its own."""
    if path.is_file() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


_UNRECORDED = object()


def _check_config(out_dir: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse to resume ``out_dir`` if it was recorded with other settings; returns the config to write back
    (``config``, plus the recorded value of an optional key this run does not use)."""
    path = out_dir / CONFIG_FILE
    if not path.is_file():
        return dict(config)
    try:
        old = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise ResumeError(f"{path} is not valid JSON: cannot tell what its results were measured with; "
                          "use another output directory, or overwrite it (--overwrite)") from None
    merged = dict(config)
    differ = []
    for key in RESUME_KEYS:
        then, now = old.get(key, _RESUME_DEFAULTS.get(key, _UNRECORDED)), config.get(key)
        if key in _OPTIONAL_KEYS and (then is None or now is None):
            if now is None and then is not _UNRECORDED:
                merged[key] = then  # kept: a later run that uses it again must match it
            continue
        if then != now:
            differ.append(f"{key}: {'not recorded' if then is _UNRECORDED else repr(then)} there, {now!r} now")
    if differ:
        raise ResumeError(f"{out_dir} holds results of another configuration ({'; '.join(differ)}); "
                          "use another output directory, or overwrite it (--overwrite)")
    return merged


def _check_prompts(out_dir: Path, prompts: Sequence[Prompt], records: Iterable[Mapping[str, Any]]) -> None:
    """Refuse to resume when a prompt id was recorded with other text (edited data set, another prompt column)."""
    recorded: dict[str, Any] = {}
    for r in records:
        recorded.setdefault(str(r["prompt_id"]), r.get("prompt_sha256"))
    differ = [p.id for p in prompts if p.id in recorded and recorded[p.id] != prompt_hash(p.text)]
    if differ:
        ids = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
        raise ResumeError(f"{out_dir} holds results for other text under prompt id(s) {ids} (edited data set, or "
                          "another --prompt-column?); use another output directory, or --overwrite")


def _clear(out_dir: Path) -> None:
    """Remove what a previous run wrote (only our own files)."""
    from specdec.eval.report import OUTPUT_FILES

    for path in [*out_dir.glob("records*.jsonl"), *(out_dir / n for n in (CONFIG_FILE, *OUTPUT_FILES))]:
        if path.is_file():
            path.unlink()


# --------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------


def _as_prompts(prompts: Any) -> list[Prompt]:
    if isinstance(prompts, (str, os.PathLike)):
        from specdec.eval.datasets import load_prompts

        return load_prompts(prompts)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts to evaluate")
    if all(isinstance(p, Prompt) for p in prompts):
        return prompts
    if all(isinstance(p, str) for p in prompts):
        return [Prompt(id=str(i), group=DEFAULT_GROUP, text=t) for i, t in enumerate(prompts)]
    if all(isinstance(p, Mapping) for p in prompts):
        columns = list(dict.fromkeys(k for p in prompts for k in p))
        return rows_to_prompts(prompts, columns, source="prompts")
    raise TypeError("prompts must be Prompt objects, strings, dicts with a 'prompt' (or 'turns') field, or a path")


def _state(model: Any) -> Any:
    """accelerate's process state; on CPU it must be asked for explicitly, or torchrun workers each see one process."""
    from accelerate import PartialState

    return PartialState(cpu=getattr(model, "device", torch.device("cpu")).type == "cpu")


def _batchable(methods: Sequence[MethodSpec]) -> list[MethodSpec]:
    """Drop the methods transformers runs for batches of one only (assisted generation, prompt lookup)."""
    single = [m.name for m in methods if m.kind in (*ASSISTED_KINDS, HF_PROMPT_LOOKUP)]
    if single:
        warnings.warn(f"batch_size > 1: transformers' assisted generation and prompt lookup support one row only; "
                      f"skipping {', '.join(single)}", stacklevel=3)
    return [m for m in methods if m.name not in single]


def _rotate(methods: Sequence[MethodSpec], i: int) -> list[MethodSpec]:
    """Methods in the order used for the i-th prompt: each method goes first equally often."""
    j = i % len(methods)
    return list(methods[j:]) + list(methods[:j])


def _record(prompt: Prompt, index: int, method: MethodSpec, slot: int, m: Measurement, prompt_tokens: int,
            reference: list[int] | None, greedy: bool, text: str, rank: int) -> dict[str, Any]:
    new = len(m.output_ids)
    rec: dict[str, Any] = {
        "prompt_id": prompt.id, "prompt_index": index, "group": prompt.group, "prompt_sha256": prompt_hash(prompt.text),
        "method": method.name, "kind": method.kind, "draft": method.draft, "k": method.k,
        "order": slot, "rank": rank, "prompt_tokens": prompt_tokens, "new_tokens": new,
        "seconds": m.seconds, "tokens_per_s": new / m.seconds if m.seconds > 0 else 0.0,
        "time_to_first_token": m.time_to_first_token, "time_per_output_token": m.time_per_output_token,
        "proposed": None, "accepted": None, "acceptance_rate": None, "proposed_per_position": m.proposed_per_position,
        "accepted_per_position": m.accepted_per_position, "acceptance_by_position": None,
        "committed_tokens": m.committed_tokens, "verifier_passes": m.verifier_passes, "mean_accepted_length": None,
        "mean_draft_length": None, "identical": None, "output_ids": m.output_ids, "text": text,
    }
    if m.proposed_per_position is not None:
        proposed, accepted = sum(m.proposed_per_position), sum(m.accepted_per_position or [])
        rec.update(proposed=proposed, accepted=accepted, acceptance_rate=accepted / proposed if proposed else 0.0,
                   acceptance_by_position=[a / p if p else 0.0 for a, p in
                                           zip(m.accepted_per_position or [], m.proposed_per_position)])
    if m.verifier_passes:
        rec["mean_accepted_length"] = m.committed_tokens / m.verifier_passes
        if rec["proposed"] is not None:  # the k actually drafted per pass (below k where adaptive k drafts less)
            rec["mean_draft_length"] = rec["proposed"] / m.verifier_passes
    if m.compiled_graphs is not None:
        rec["compiled_graphs"] = m.compiled_graphs
    if greedy and method.kind != HF and reference is not None:
        rec["identical"] = m.output_ids == reference
    return rec


class _Progress:
    """tqdm bar over (prompt, method) pairs with the running speedup over ``hf`` in its postfix."""

    def __init__(self, total: int, methods: Sequence[MethodSpec], enabled: bool, rank: int, world: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="eval" if world == 1 else f"eval rank {rank}", unit="gen",
                        disable=not enabled, file=sys.stderr, position=rank if world > 1 else None, dynamic_ncols=True)
        self.tokens = {m.name: 0 for m in methods}
        self.seconds = {m.name: 0.0 for m in methods}
        multi = len({m.draft for m in methods if m.draft}) > 1
        self.labels = {m.name: self._label(m, multi) for m in methods if m.kind != HF}

    @staticmethod
    def _label(m: MethodSpec, multi: bool) -> str:
        base = {HF_COMPILED: "compiled", HF_ASSISTED: "assisted", HF_ASSISTED_HEURISTIC: "heuristic",
                HF_PROMPT_LOOKUP: "lookup"}.get(m.kind, f"k{m.k}{'a' if m.adaptive else ''}")
        return f"{m.draft} {base}" if multi and m.draft else base

    def add(self, records: Iterable[Mapping[str, Any]], measured: int) -> None:
        for r in records:
            if r["method"] in self.tokens:
                self.tokens[r["method"]] += r["new_tokens"]
                self.seconds[r["method"]] += r["seconds"]
        base = self.tokens[HF] / self.seconds[HF] if self.seconds[HF] else 0.0
        if base:
            self.bar.set_postfix({label: f"{self.tokens[n] / self.seconds[n] / base:.2f}x"
                                  for n, label in self.labels.items() if self.seconds[n]}, refresh=False)
        self.bar.update(measured)

    def close(self) -> None:
        self.bar.close()


@dataclass
class EvalSettings:
    """Generation settings shared by every method of a run."""

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float | None = None
    top_p: float | None = None
    seed: int = 0
    chat: bool = True
    prompt_lookup_num_tokens: int = DEFAULT_PROMPT_LOOKUP_TOKENS
    compile_drafter: bool = False

    def generate_kwargs(self, tokenizer: Any) -> dict[str, Any]:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        kwargs: dict[str, Any] = dict(max_new_tokens=self.max_new_tokens, do_sample=self.do_sample, pad_token_id=pad)
        if self.do_sample:
            kwargs.update({k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p)) if v is not None})
        return kwargs


def run_eval(
    model: Any,
    tokenizer: Any,
    prompts: Any,
    methods: Sequence[MethodSpec | str] | None = None,
    *,
    out_dir: str | os.PathLike,
    draft: str | Sequence[str] = DEFAULT_DRAFT,
    num_draft_tokens: int | Sequence[int] = 4,
    baselines: Sequence[str] = DEFAULT_BASELINES,
    adaptive: bool = False,
    max_new_tokens: int = 64,
    do_sample: bool = False,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int = 0,
    chat: bool = True,
    prompt_lookup_num_tokens: int = DEFAULT_PROMPT_LOOKUP_TOKENS,
    batch_size: int = 1,
    compile_drafter: bool = False,
    warmup: bool = True,
    progress: bool = True,
    plots: bool = True,
    overwrite: bool = False,
    model_name: str | None = None,
    dataset: str | None = None,
    config: Mapping[str, Any] | None = None,
):
    """Evaluate ``model`` with each method on ``prompts``; write records, ``summary.json``, a report and plots.

    Args:
        model, tokenizer: the verifier (a transformers causal LM) and its tokenizer.
        prompts: :class:`~specdec.eval.datasets.Prompt` objects, strings, dicts with a ``prompt``
            (or Spec-Bench ``turns``) field, or a dataset path / hub name for :func:`load_prompts`.
        methods: :class:`MethodSpec` objects or their names (``"hf"``, ``"hf-assisted[self:int8]"``,
            ``"specdec[self:int8,k=4]"``); default: :func:`plan_methods` of ``baselines``, ``draft``
            and ``num_draft_tokens``. ``hf`` is always run: speedups and identity are measured against it.
        out_dir: where records and reports go; a rerun with the same directory resumes, and one with
            settings that change a measurement (``eval_config.json``: model, data set, dtype, device,
            generation and batch settings, compile settings, warm-up) or other text under a recorded
            prompt id is refused with a :class:`ResumeError` naming what differs.
        draft: one drafter spec or several (``self:SCHEME``, a local model path, or a registered name).
        num_draft_tokens: one k or several.
        baselines: among ``hf``, ``hf-compiled``, ``hf-assisted``, ``hf-assisted-heuristic``, ``hf-prompt-lookup``.
            ``hf-compiled`` compiles before timing (even with ``warmup=False``); ``summary.json`` reports
            its ``compile_seconds``, and every method's ``speedup_vs_hf_compiled``.
        max_new_tokens, do_sample, temperature, top_p, seed: generation settings for every method
            (greedy by default; each prompt gets seed ``seed + index`` when sampling).
        chat: feed prompts through the tokenizer's chat template.
        batch_size: prompts per ``generate`` call, left padded into one batch (consecutive prompts).
            With more than one, throughput is the batch's (all new tokens over its wall time; each
            record gets a token-proportional share of its batch's seconds), identity is against HF
            ``generate`` on the same batch, and the HF speculative baselines (single-row only in
            transformers) are left out with a warning.
        compile_drafter: run specdec's model drafters through ``torch.compile`` (compiled in the warm-up).
        warmup: one short untimed generation per method before the first timed one.
        adaptive: also run each specdec method with adaptive draft length (up to its k); each record and
            summary entry has ``mean_draft_length`` (draft tokens proposed per verifier pass).
        progress: tqdm bar on stderr; plots: write PNG plots.
        overwrite: discard the results already in ``out_dir`` instead of resuming.
        model_name, dataset, config: recorded in ``summary.json`` (``model_name`` and ``dataset``
            also guard resumes against mixing configurations).

    Returns:
        An :class:`~specdec.eval.report.EvalReport` (``to_dict()`` is ``summary.json``); under
        ``accelerate launch`` every process returns the gathered report.
    """
    from specdec.eval.report import EvalReport, build_summary, write_outputs

    out = check_out_dir(out_dir)  # before any work: a file or an unwritable place fails now, in one line
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    prompts = _as_prompts(prompts)
    if methods is None:
        drafts = [draft] if isinstance(draft, str) else list(draft)
        ks = [num_draft_tokens] if isinstance(num_draft_tokens, int) else list(num_draft_tokens)
        methods = plan_methods(baselines, drafts, ks, adaptive=adaptive)
    else:
        methods = [m if isinstance(m, MethodSpec) else MethodSpec.parse(m) for m in methods]
        methods = list(dict.fromkeys([MethodSpec(HF), *methods]))
    if batch_size > 1:
        methods = _batchable(methods)
    settings = EvalSettings(max_new_tokens, do_sample, temperature, top_p, seed, chat, prompt_lookup_num_tokens,
                            compile_drafter)
    state = _state(model)
    device = torch.device(getattr(model, "device", "cpu"))
    # every setting that changes a measurement: a resume must match all of them (RESUME_KEYS)
    run_config = {
        "model": model_name or getattr(model, "name_or_path", None) or type(model).__name__,
        "dataset": dataset,
        "dtype": str(getattr(model, "dtype", "")).replace("torch.", ""),
        # one process: its device; several: each has its own (cuda:0, cuda:1), so their common type
        "device": str(device) if state.num_processes == 1 else device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "num_processes": state.num_processes,
        "max_new_tokens": max_new_tokens, "do_sample": do_sample,
        "temperature": temperature if do_sample else None, "top_p": top_p if do_sample else None,
        "seed": seed if do_sample else None, "chat_template": bool(chat and getattr(tokenizer, "chat_template", None)),
        "prompt_lookup_num_tokens": prompt_lookup_num_tokens if any(m.kind == HF_PROMPT_LOOKUP for m in methods) else None,
        "batch_size": batch_size,
        "compile_drafter": compile_drafter,
        "warmup": warmup,
    }

    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        if overwrite:
            _clear(out)
    state.wait_for_everyone()
    recorded = load_records(out)
    # every process checks, so all of them stop alike
    write_config = _check_config(out, run_config)
    _check_prompts(out, prompts, recorded)
    state.wait_for_everyone()
    if state.is_main_process:
        (out / CONFIG_FILE).write_text(json.dumps(write_config, indent=2) + "\n")

    done = {(r["prompt_id"], r["method"]): r for r in recorded}
    with state.split_between_processes(list(enumerate(prompts))) as mine:
        mine = list(mine)
    batches = [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]
    todo = [(batch, [m for m in _rotate(methods, batch[0][0] // batch_size) if any((p.id, m.name) not in done for _, p in batch)])
            for batch in batches]
    todo = [t for t in todo if t[1]]

    if todo:
        _evaluate(model, tokenizer, todo, methods, done, settings, out, state, warmup, progress)
    state.wait_for_everyone()

    config_out = {**run_config, **dict(config or {}), "num_processes": state.num_processes,
                  "device": str(device), "dtype": run_config["dtype"]}
    if state.is_main_process:  # gather: every process's shard is complete after the barrier above
        records = load_records(out)
        report = EvalReport(build_summary(records, methods, prompts, config_out), records, out)
        write_outputs(report, out, plots=plots)
    state.wait_for_everyone()
    if not state.is_main_process:
        report = EvalReport.load(out)
    return report


def _encode_batch(tokenizer: Any, prompts: Sequence[Prompt], chat: bool, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts' ids, left padded into one batch (as ``model.generate`` expects), and their attention mask."""
    rows = [encode_prompt(tokenizer, p.text, chat)[0] for p in prompts]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device="cpu")  # filled on the host, then moved
    mask = torch.zeros_like(ids)
    for b, row in enumerate(rows):
        ids[b, width - len(row):], mask[b, width - len(row):] = row, 1
    return ids.to(device), mask.to(device)


def _evaluate(model: Any, tokenizer: Any, todo: list, methods: Sequence[MethodSpec], done: Mapping, settings: EvalSettings,
              out: Path, state: Any, warmup: bool, progress: bool) -> None:
    """Run the pending (prompt, method) pairs of this process, writing each batch's records as it finishes.

    ``todo`` holds batches: ``(prompts [(index, Prompt)], pending methods)``; a batch of one is the
    usual per-prompt run. Every method gets the same left-padded batch. ``hf-compiled`` leaves the model
    as it found it (transformers keeps the compiled call on the model: it is removed afterwards).
    """
    with _restore_compile_state(model):
        _evaluate_pending(model, tokenizer, todo, methods, done, settings, out, state, warmup, progress)


def _evaluate_pending(model: Any, tokenizer: Any, todo: list, methods: Sequence[MethodSpec], done: Mapping,
                      settings: EvalSettings, out: Path, state: Any, warmup: bool, progress: bool) -> None:
    needed = [m for m in methods if any(m in t[1] for t in todo)]
    runners = build_runners(needed, model, tokenizer, settings.prompt_lookup_num_tokens, settings.compile_drafter)
    gen_kwargs = settings.generate_kwargs(tokenizer)
    device = getattr(model, "device", torch.device("cpu"))
    encoded = [_encode_batch(tokenizer, [p for _, p in batch], settings.chat, device) for batch, _ in todo]
    warm_seed = settings.seed if settings.do_sample else None

    compiled = runners.get(HF_COMPILED)
    if isinstance(compiled, _CompiledRunner):
        mine = [e for e, (_, pending) in zip(encoded, todo) if compiled.method in pending]
        # one static cache length for the whole run: every decode step has the same shapes, nothing recompiles
        compiled.configure(max(ids.shape[1] for ids, _ in mine) + settings.max_new_tokens)
        # compiled now, warm-up or not: its compile time is reported apart, never inside a timed call
        compiled.compile(mine, gen_kwargs, warm_seed)

    if warmup:  # the first calls pay for allocations, kernel selection, lazy imports: keep them out of the timings
        ids, mask = encoded[0]
        if settings.compile_drafter:  # every input shape class compiled now, not inside a timed call
            for spec in {id(r.spec): r.spec for r in runners.values() if r.spec is not None}.values():
                if hasattr(spec.drafter, "prime"):
                    spec.drafter.prime()
        for m in needed:
            if m.kind != HF_COMPILED:  # warmed up by its compile above
                runners[m.name](ids, {**gen_kwargs, "max_new_tokens": min(WARMUP_TOKENS, settings.max_new_tokens)},
                                warm_seed, mask)

    pairs = sum(1 for batch, pending in todo for _, p in batch for m in pending if (p.id, m.name) not in done)
    bar = _Progress(pairs, methods, progress, state.process_index, state.num_processes)
    bar.add([r for batch, _ in todo for _, p in batch for r in (done.get((p.id, m.name)) for m in methods) if r], 0)
    path = shard_path(out, state.process_index, state.num_processes)
    _end_partial_line(path)
    try:
        with path.open("a") as sink:
            for number, (batch, pending) in enumerate(todo):
                ids, mask = encoded[number]
                seed = settings.seed + batch[0][0] if settings.do_sample else None
                measured = {m.name: (slot, runners[m.name](ids, gen_kwargs, seed, mask)) for slot, m in enumerate(pending)}
                graphs = measured[HF_COMPILED][1][0].compiled_graphs if HF_COMPILED in measured else None
                if graphs:  # recorded too (compiled_graphs); should not happen with one static cache length
                    warnings.warn(f"hf-compiled compiled {graphs} graph(s) inside a timed call (batch of prompt "
                                  f"{batch[0][1].id}): its tokens/s include that compile time", stacklevel=2)
                records = []
                for b, (index, prompt) in enumerate(batch):
                    ref = measured[HF][1][b].output_ids if HF in measured else (done.get((prompt.id, HF)) or {}).get("output_ids")
                    for m in pending:
                        if (prompt.id, m.name) in done:
                            continue
                        slot, results = measured[m.name]
                        result = results[b]
                        text = tokenizer.decode(result.output_ids, skip_special_tokens=True)
                        rec = _record(prompt, index, m, slot, result, int(mask[b].sum()), ref,
                                      not settings.do_sample, text, state.process_index)
                        if len(batch) > 1:
                            rec.update(batch_size=len(batch), batch_index=batch[0][0],
                                       batch_seconds=sum(r.seconds for r in results),
                                       batch_new_tokens=sum(len(r.output_ids) for r in results))
                        if m.kind == HF_COMPILED:
                            runner = runners[m.name]
                            rec.update(compile_seconds=runner.compile_seconds, max_cache_len=runner.max_cache_len)
                        records.append(rec)
                # one write per batch: a run cut short loses at most the batch in flight
                sink.write("".join(json.dumps(r) + "\n" for r in records))
                sink.flush()
                bar.add(records, len(records))
    finally:
        bar.close()
