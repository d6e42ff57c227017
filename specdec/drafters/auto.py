"""``draft="auto"``: of the drafters that can run here, the one with the best measured tokens a second.

Which drafter pays depends on the machine as much as on the model: an int8 copy of the verifier is 1.7x plain
decoding on an AVX-512 VNNI CPU and about 1.0x on an AVX2 one (BENCHMARKS.md sections 2 and 21). ``auto`` measures
instead of guessing. On its first use (a call, or ``drafter.prime()``) each candidate drafts a few short calibration
prompts through the real loop (greedy, the model's ``k``, after one untimed warm-up call) and is ranked by its
decode tokens a second: the verifier's pass, the drafter's steps and the loop's host work, all measured on this
device. The winner drafts every later call; the others are dropped.

Candidates, in the order they are measured: ``prompt-lookup``, ``suffix``, the ``self:*`` schemes of
:data:`SELF_SCHEMES` with a backend on the verifier's device (a scheme whose grid the verifier's weights already lie
on is left out: its acceptance stands for the verifier itself, BENCHMARKS.md section 1), the shipped head
(``eagle``) where one ships for the model, then ``composite:SCHEME`` for the best ``self:*`` scheme and
``composite:eagle``. With a tree only the drafters that grow trees take part. Every candidate left out is listed
with the reason.

The calibration prompts are this module's own (not Spec-Bench's, not the demo's): what ``auto`` picks is not tuned
on what it is judged by.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from specdec.drafters.base import Drafter, WrappingDrafter, wants_graphs
from specdec.errors import SpecdecError
from specdec.stats import SpecStats

#: the self-copy schemes auto tries, cheapest first
SELF_SCHEMES = ("int8", "int8-dynamic", "bf16", "int4+head8")
#: prompts of different kinds: open text, code, and text that repeats its prompt (where lookup pays)
CALIBRATION_PROMPTS = (
    "Describe in a few sentences how bread rises, for a ten-year-old.",
    "Write a Python function that counts the vowels in a string.",
    "Rewrite this sentence in plain English: 'The committee's protracted deliberations culminated in a unanimous "
    "resolution to defer the initiative until the subsequent fiscal year.'",
)
#: new tokens per calibration prompt (the first is the prefill's and is not timed)
CALIBRATION_TOKENS = 32
#: how many of the fastest candidates are measured a second time before choosing
LEADERS = 3


class AutoDraftError(SpecdecError, ValueError):
    """Raised when ``draft="auto"`` cannot calibrate: no tokenizer to encode its prompts, nothing to measure with,
    or no candidate that runs here."""


@dataclass
class Calibration:
    """What one candidate did on the calibration prompts: decode tokens (after each prompt's first), verifier
    passes, and seconds (decode in all; drafting within it)."""

    tokens: int = 0
    passes: int = 0
    decode_seconds: float = 0.0
    draft_seconds: float = 0.0

    @classmethod
    def of_call(cls, stats: SpecStats) -> "Calibration":
        """One batch-1 call's decode: its tokens after the first, its passes, its seconds after the first token."""
        return cls(max(stats.new_tokens - 1, 0), stats.verifier_forwards,
                   max(stats.total_time - stats.time_to_first_token, 0.0), stats.draft_seconds)

    def merge(self, other: "Calibration") -> None:
        """Add another measurement of the same candidate."""
        self.tokens += other.tokens
        self.passes += other.passes
        self.decode_seconds += other.decode_seconds
        self.draft_seconds += other.draft_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.passes if self.passes else 0.0

    def to_dict(self) -> dict[str, float]:
        per_pass = 1e3 / self.passes if self.passes else 0.0
        return {"tokens_per_s": round(self.tokens_per_second, 3), "tokens_per_pass": round(self.tokens_per_pass, 3),
                "pass_ms": round(self.decode_seconds * per_pass, 3), "draft_ms_per_pass": round(self.draft_seconds * per_pass, 3)}


#: measures one candidate on the calibration prompts (the strategy's: it runs the loop)
Measure = Callable[[Drafter, Sequence[torch.Tensor]], Calibration]


@dataclass
class Candidate:
    """One drafter ``auto`` considered: measured (``calibration``) or left out (``skipped``: why)."""

    draft: str
    calibration: Calibration | None = None
    build_seconds: float = 0.0
    skipped: str | None = None
    #: measured, then let go to keep one self-copy in memory: it was slower then, and is not measured again
    released: bool = False


@dataclass
class AutoChoice:
    """What ``auto`` chose, from which measurements, at which ``k``, and what choosing cost."""

    chosen: str
    k: int
    candidates: list[Candidate] = field(default_factory=list)
    seconds: float = 0.0

    def ranking(self) -> list[Candidate]:
        """The measured candidates, fastest first: those ``auto`` could choose (the chosen one first), then the
        self-copies it let go once a faster one was measured (their single early rate is not comparable with the
        leaders' merged ones)."""
        measured = [c for c in self.candidates if c.calibration is not None]
        return sorted(measured, key=lambda c: (c.released, -c.calibration.tokens_per_second))

    def reason(self) -> str:
        """One line: the winner's measured rate against the runner-up's."""
        best, *rest = self.ranking()
        rate = best.calibration.tokens_per_second
        line = (f"{best.draft}: {rate:.1f} tokens/s decoding the calibration prompts at k={self.k} "
                f"({best.calibration.tokens_per_pass:.2f} tokens a pass)")
        if rest:
            runner_up = rest[0].calibration.tokens_per_second
            line += f", {rate / runner_up:.2f}x the next ({rest[0].draft}, {runner_up:.1f} tokens/s)"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "reason": self.reason(), "k": self.k, "seconds": round(self.seconds, 2),
                "ranking": [{"draft": c.draft, **c.calibration.to_dict(), "build_s": round(c.build_seconds, 2),
                             "released": c.released} for c in self.ranking()],
                "skipped": [{"draft": c.draft, "why": c.skipped} for c in self.candidates if c.skipped is not None]}

    def table(self) -> str:
        """The ranking as text: one line per candidate, then the ones left out."""
        lines = [f"{'drafter':<26}{'tokens/s':>10}{'tokens/pass':>13}{'pass ms':>10}{'draft ms':>10}"]
        for c in self.ranking():
            d = c.calibration.to_dict()
            lines.append(f"{c.draft + (' *' if c.draft == self.chosen else ''):<26}{d['tokens_per_s']:>10.1f}"
                         f"{d['tokens_per_pass']:>13.2f}{d['pass_ms']:>10.1f}{d['draft_ms_per_pass']:>10.1f}"
                         + ("  (let go: one copy in memory)" if c.released else ""))
        lines += [f"{c.draft:<26}left out: {c.skipped}" for c in self.candidates if c.skipped is not None]
        return "\n".join(lines)


class AutoDrafter(WrappingDrafter):
    """The drafter ``auto`` chooses, chosen once (thread-safe) on first use; every question a drafter answers is the
    chosen one's, and each call drafts with the chosen drafter itself (:meth:`for_call`).

    Args:
        verifier: the model to draft for.
        tokenizer: its tokenizer, to encode the calibration prompts.
        build: a drafter name -> the drafter (the resolver's).
        candidates: the names to try instead of the default list (composites of the best scheme and the head
            are still added when their inner drafters were measured).
    """

    def __init__(self, verifier: torch.nn.Module, tokenizer: Any, build: Callable[[str], Drafter],
                 candidates: Sequence[str] | None = None) -> None:
        if tokenizer is None:
            raise AutoDraftError("draft='auto' measures the drafters on text: pass the verifier's tokenizer "
                                 "(SpeculativeModel(model, 'auto', tokenizer=tokenizer))")
        from specdec.prompts import encode_prompt

        self.verifier, self.build = verifier, build
        device = next(verifier.parameters()).device
        self.prompts = [encode_prompt(tokenizer, p).to(device) for p in CALIBRATION_PROMPTS]
        self.names = list(candidates) if candidates is not None else None
        self.decision: AutoChoice | None = None
        self._chosen: Drafter | None = None
        self._measure: Measure | None = None
        self._k, self._trees = 1, False
        self._compile: str | None = None  # compile_drafter, applied to the chosen drafter
        self._lock = threading.Lock()

    def attach(self, measure: Measure, k: int, trees: bool = False) -> None:
        """What the model that uses this drafter measures with: its loop (``measure``), its ``k``, and whether
        its calls draft trees. The first model to attach decides."""
        if self._measure is None:
            self._measure, self._k, self._trees = measure, k, trees

    @property
    def inner(self) -> Drafter:
        return self.choose()

    @property
    def choice(self) -> dict[str, Any] | None:
        return None if self.decision is None else self.decision.to_dict()

    def choose(self) -> Drafter:
        """The chosen drafter, measuring the candidates now if no call has yet."""
        if self._chosen is None:
            with self._lock:  # concurrent first calls measure once
                if self._chosen is None:
                    self._chosen = self._choose()
        return self._chosen

    def for_call(self) -> Drafter:
        return self.choose().for_call()

    @property
    def compilable(self) -> bool:
        return True  # compile_drafter is kept for the chosen drafter (a drafter with no model has nothing to compile)

    def compile(self) -> None:
        self._defer_compile("compile")

    def compile_graphs(self) -> None:
        self._defer_compile("graphs")

    def _defer_compile(self, how: str) -> None:
        self._compile = how
        if self._chosen is not None:
            self._apply_compile()

    def _apply_compile(self) -> None:
        chosen = self._chosen
        how = "graphs" if self._compile == "graphs" else True
        if chosen.captures_graphs and wants_graphs(chosen, how, next(self.verifier.parameters()).device.type == "cuda"):
            chosen.compile_graphs()
        elif self._compile == "compile" and chosen.compilable:
            chosen.compile()

    def _choose(self) -> Drafter:
        if self._measure is None:
            raise AutoDraftError("draft='auto' chooses its drafter inside a SpeculativeModel (it measures with the "
                                 "model's loop): use SpeculativeModel(model, 'auto', tokenizer=tokenizer)")
        start = time.perf_counter()
        candidates: list[Candidate] = []
        built: dict[str, Drafter] = {}
        names = [(n, None) for n in self.names] if self.names is not None else default_candidates(self.verifier)
        for name, why in names:
            candidates.append(self._build(name, why, built))
            if len(built) == 1 and name in built:  # the first runnable one warms the verifier up, untimed
                self._calibrate(built[name])
            self._run(candidates[-1], built)
            _keep_best_copy(candidates, built)  # one self-copy in memory at a time (a large model's copies are large)
        for name, inner in self._composites(candidates, built):
            candidates.append(self._build(name, None, built, inner))
            self._run(candidates[-1], built)
        measured = [c for c in candidates if c.calibration is not None and c.draft in built]
        if not measured:
            raise AutoDraftError("draft='auto': no drafter could run here: " +
                                 "; ".join(f"{c.draft}: {c.skipped}" for c in candidates))
        # the leaders are measured again, in reverse order, so drift and noise weigh less where the choice is close
        leaders = sorted(measured, key=lambda c: -c.calibration.tokens_per_second)[:LEADERS]
        for c in reversed(leaders):
            self._run(c, built)
        best = max(measured, key=lambda c: c.calibration.tokens_per_second)
        self.decision = AutoChoice(best.draft, self._k, candidates, time.perf_counter() - start)
        self._chosen = built[best.draft]
        if self._compile is not None:
            self._apply_compile()
        return self._chosen

    def _build(self, name: str, why: str | None, built: dict[str, Drafter], inner: Drafter | None = None) -> Candidate:
        """Build one candidate (into ``built``); one that cannot be built or draft here is left out, saying why."""
        if why is not None:
            return Candidate(name, skipped=why)
        t0 = time.perf_counter()
        try:
            drafter = self.build(name) if inner is None else _composite(inner)
        except (SpecdecError, ImportError, NotImplementedError, RuntimeError) as e:
            return Candidate(name, skipped=_one_line(e))
        seconds = time.perf_counter() - t0
        if self._trees and not drafter.supports_tree:
            return Candidate(name, build_seconds=seconds, skipped="cannot draft trees")
        built[name] = drafter
        return Candidate(name, build_seconds=seconds)

    def _run(self, candidate: Candidate, built: dict[str, Drafter]) -> None:
        """Measure a built candidate once more, adding to what it measured before."""
        if candidate.draft not in built:
            return
        measured = self._calibrate(built[candidate.draft])
        if candidate.calibration is None:
            candidate.calibration = measured
        else:
            candidate.calibration.merge(measured)

    def _calibrate(self, drafter: Drafter) -> Calibration:
        """One measurement; a cross-call cache (suffix) learns nothing from the calibration text."""
        from specdec.drafters.suffix import cross_call_cache

        cache = cross_call_cache(drafter)
        learning = cache is not None and cache.learning
        if cache is not None:
            cache.learning = False
        try:
            return self._measure(drafter, self.prompts)
        finally:
            if cache is not None:
                cache.learning = learning

    @staticmethod
    def _composites(candidates: list[Candidate], built: dict[str, Drafter]) -> list[tuple[str, Drafter]]:
        """``composite:`` + the best measured ``self:*`` scheme, and ``composite:eagle`` when the head was measured."""
        selfs = [c for c in candidates if c.calibration is not None and c.draft.startswith("self:")]
        out = []
        if selfs:
            best = max(selfs, key=lambda c: c.calibration.tokens_per_second)
            out.append(("composite:" + best.draft.partition(":")[2], built[best.draft]))
        if any(c.draft == "eagle" and c.calibration is not None for c in candidates):
            out.append(("composite:eagle", built["eagle"]))
        return [(name, inner) for name, inner in out if name not in {c.draft for c in candidates}]


def _keep_best_copy(candidates: list[Candidate], built: dict[str, Drafter]) -> None:
    """Drop every measured ``self:*`` copy but the fastest so far (the composite of the best is built from it)."""
    copies = [c for c in candidates if c.draft.startswith("self:") and c.draft in built and c.calibration is not None]
    if copies:
        best = max(copies, key=lambda c: c.calibration.tokens_per_second)
        for c in copies:
            if c is not best:
                del built[c.draft]
                c.released = True


def default_candidates(verifier: torch.nn.Module) -> list[tuple[str, str | None]]:
    """``(name, why it is left out or None)`` for every drafter ``auto`` considers for ``verifier``."""
    return [("prompt-lookup", None), ("suffix", None),
            *((f"self:{s}", _scheme_excluded(verifier, s)) for s in SELF_SCHEMES),
            ("eagle", _head_missing(verifier))]


def _scheme_excluded(verifier: torch.nn.Module, scheme: str) -> str | None:
    """Why ``self:scheme`` cannot take part here (no backend on the device, grid-bound), or None."""
    from specdec.quant import parse_scheme, weight_error

    param = next(verifier.parameters())
    info = parse_scheme(scheme).info
    if info.backend(param.device) is None:
        return f"no backend for {scheme} on {param.device.type}"
    if info.cast_dtype is not None and getattr(torch, info.cast_dtype) == param.dtype:
        return f"the verifier is already {info.cast_dtype}: the copy would cost what it does"
    try:
        bound = weight_error(verifier, scheme).grid_bound
    except ValueError:  # no weight model for the scheme here: it cannot be grid-bound by a grid we know
        bound = False
    if bound:
        return ("grid-bound: the verifier's weights already lie on this grid, so the copy stands for the verifier "
                "itself (name it explicitly to use it)")
    return None


def _head_missing(verifier: torch.nn.Module) -> str | None:
    from specdec.heads.checkpoint import HeadLoadError
    from specdec.heads.shipped import shipped_head

    try:
        shipped_head(verifier)
    except HeadLoadError:
        return "no head ships for this model"
    return None


def _composite(inner: Drafter) -> Drafter:
    from specdec.drafters.composite import CompositeDrafter

    return CompositeDrafter(inner)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
