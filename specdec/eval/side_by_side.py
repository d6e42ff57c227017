"""Side-by-side runs: plain ``model.generate`` against specdec on the same prompts, in one process.

Methods run back to back per prompt, alternating which goes first, after one warm-up run each, so
that slow drifts of a shared machine hit both sides alike. Speedups are ratios from the same run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import torch

from specdec import metrics
from specdec.api import SpeculativeModel
from specdec.prompts import encode_prompt  # re-exported: specdec.eval.side_by_side.encode_prompt is public

__all__ = ["BUILTIN_PROMPTS", "Comparison", "PromptResult", "compare", "encode_prompt"]

BUILTIN_PROMPTS: list[dict[str, str]] = [
    {"task": "chat", "prompt": "What are three good habits for staying focused while working from home?"},
    {"task": "code", "prompt": "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring."},
    {
        "task": "summarisation",
        "prompt": "Summarise in two sentences: The Great Barrier Reef is the world's largest coral reef system, "
        "composed of over 2,900 individual reefs and 900 islands stretching for over 2,300 kilometres. It is "
        "located in the Coral Sea, off the coast of Queensland, Australia, and can be seen from outer space. "
        "Warming oceans have caused repeated mass bleaching events that threaten its survival.",
    },
    {"task": "explanation", "prompt": "Explain what a hash table is to a beginner programmer."},
    {"task": "code", "prompt": "Write a SQL query that lists the five customers with the highest total order value."},
    {"task": "chat", "prompt": "Give me a short recipe for pancakes."},
]


@dataclass
class PromptResult:
    """One prompt through the plain model and through specdec."""

    task: str
    prompt: str
    new_tokens: int
    plain_seconds: float
    spec_seconds: float
    identical: bool
    acceptance_rate: float
    mean_accepted_length: float
    proposed: int
    accepted: int
    verifier_forwards: int
    text: str = ""
    committed: int | None = None  # tokens the verifier passes committed (None: new_tokens - 1, see committed_tokens)

    @property
    def committed_tokens(self) -> int:
        """Tokens committed by this prompt's verifier passes: every new token but the prefill's first."""
        return max(self.new_tokens - 1, 0) if self.committed is None else self.committed


@dataclass
class Comparison:
    """Aggregate of a side-by-side run."""

    results: list[PromptResult] = field(default_factory=list)
    num_draft_tokens: int = 0
    draft: str = ""
    tree: dict | None = None  # the tree configuration of the last call (None: chains, which have none)
    compile_verifier: bool = False
    verifier_compile_seconds: float | None = None  # compile_verifier: priming its graphs, before any timed call

    def _totals(self, name: str) -> list[Any]:
        """Each prompt's value of ``name``, in order (what the pooled figures add up)."""
        return [getattr(r, name) for r in self.results]

    @property
    def mean_tree_tokens(self) -> float:
        """Draft tokens the verifier scored per pass, pooled over the prompts, for chains and trees alike (a
        tree's nodes; a chain's k): a number on a chain run too, where :attr:`tree` is ``None``."""
        return metrics.mean_draft_length(self._totals("proposed"), self._totals("verifier_forwards"))

    @property
    def plain_tokens_per_s(self) -> float:
        """Plain ``generate``'s throughput: all new tokens over all its seconds."""
        return metrics.throughput(self._totals("new_tokens"), self._totals("plain_seconds"))

    @property
    def spec_tokens_per_s(self) -> float:
        """specdec's throughput: all new tokens over all its seconds."""
        return metrics.throughput(self._totals("new_tokens"), self._totals("spec_seconds"))

    @property
    def speedup(self) -> float:
        """specdec's throughput over plain ``generate``'s, on the same prompts."""
        tokens = self._totals("new_tokens")
        return metrics.speedup(tokens, self._totals("spec_seconds"), tokens, self._totals("plain_seconds"))

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens, pooled over the prompts."""
        return metrics.acceptance_rate(self._totals("accepted"), self._totals("proposed"))

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verifier pass, pooled: total committed over total passes (as ``specdec eval``)."""
        return metrics.mean_accepted_length(self._totals("committed_tokens"), self._totals("verifier_forwards"))

    def summary(self) -> dict[str, Any]:
        """The JSON contract of ``specdec demo --json`` / ``specdec generate --compare --json``.

        Every key is there on every run. ``tree`` is the tree configuration, ``null`` on a chain run;
        ``mean_tree_tokens`` is the draft tokens the verifier scored per pass on any run (a chain's k), as in
        ``specdec eval``'s summary.
        """
        return {
            "prompts": len(self.results),
            "identical": sum(r.identical for r in self.results),
            "speedup": round(self.speedup, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "plain_tokens_per_s": round(self.plain_tokens_per_s, 3),
            "spec_tokens_per_s": round(self.spec_tokens_per_s, 3),
            "new_tokens": sum(r.new_tokens for r in self.results),
            "num_draft_tokens": self.num_draft_tokens,
            "draft": self.draft,
            "tree": self.tree,
            "mean_tree_tokens": round(self.mean_tree_tokens, 4),
            "compile_verifier": self.compile_verifier,
            "verifier_compile_seconds": (None if self.verifier_compile_seconds is None
                                         else round(self.verifier_compile_seconds, 2)),
            "per_prompt": [{k: v for k, v in asdict(r).items() if k not in ("prompt", "text", "committed")}
                           for r in self.results],
        }

    def table(self) -> str:
        lines = [f"{'task':<14}{'tokens':>7}{'plain tok/s':>13}{'specdec tok/s':>15}{'ratio':>7}{'accept':>8}{'len':>6}  same"]
        for r in self.results:
            plain = metrics.throughput(r.new_tokens, r.plain_seconds)
            spec = metrics.throughput(r.new_tokens, r.spec_seconds)
            lines.append(
                f"{r.task:<14}{r.new_tokens:>7}{plain:>13.2f}{spec:>15.2f}{metrics.ratio(spec, plain):>7.2f}"
                f"{r.acceptance_rate:>8.2f}{r.mean_accepted_length:>6.2f}  {'yes' if r.identical else 'NO'}"
            )
        lines.append(
            f"{'all':<14}{sum(r.new_tokens for r in self.results):>7}{self.plain_tokens_per_s:>13.2f}"
            f"{self.spec_tokens_per_s:>15.2f}{self.speedup:>7.2f}{self.acceptance_rate:>8.2f}"
            f"{self.mean_accepted_length:>6.2f}  {sum(r.identical for r in self.results)}/{len(self.results)}"
        )
        return "\n".join(lines)


def _timed(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def compare(
    model: Any,
    tokenizer: Any,
    spec: SpeculativeModel,
    prompts: Iterable[dict[str, str]],
    max_new_tokens: int = 128,
    chat: bool = True,
    warmup: bool = True,
    progress: Callable[[PromptResult], None] | None = None,
) -> Comparison:
    """Greedy side-by-side of ``model.generate`` and ``spec.generate`` on each prompt."""
    prompts = list(prompts)
    result = Comparison(num_draft_tokens=spec.num_draft_tokens, draft=spec.draft_name)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    encoded = [encode_prompt(tokenizer, item["prompt"], chat) for item in prompts]
    if spec.compile_verifier and prompts:  # every verify-pass graph compiled now, never inside a timed call
        result.compile_verifier = True
        result.verifier_compile_seconds = spec.prime_verifier(max_new_tokens, [ids.shape[1] for ids in encoded])
    if warmup and prompts:
        model.generate(encoded[0], **{**kwargs, "max_new_tokens": 4})
        spec.generate(encoded[0], **{**kwargs, "max_new_tokens": 4})
    for i, (item, ids) in enumerate(zip(prompts, encoded)):
        runs = {
            "plain": lambda: model.generate(ids, **kwargs),
            "spec": lambda: spec.generate(ids, **kwargs),
        }
        order = ["plain", "spec"] if i % 2 == 0 else ["spec", "plain"]
        timed = {}
        for name in order:
            timed[name] = _timed(runs[name])
            if name == "spec":
                stats = spec.last_stats
        (plain_out, plain_s), (spec_out, spec_s) = timed["plain"], timed["spec"]
        new = spec_out.shape[1] - ids.shape[1]
        row = PromptResult(
            task=item.get("task", item.get("category", "prompt")),
            prompt=item["prompt"],
            new_tokens=new,
            plain_seconds=plain_s,
            spec_seconds=spec_s,
            identical=bool(plain_out.shape == spec_out.shape and torch.equal(plain_out, spec_out)),
            acceptance_rate=stats.acceptance_rate,
            mean_accepted_length=stats.mean_accepted_length,
            proposed=stats.proposed,
            accepted=stats.accepted,
            verifier_forwards=stats.verifier_forwards,
            committed=sum(stats.committed_per_step),
            text=tokenizer.decode(spec_out[0, ids.shape[1] :], skip_special_tokens=True),
        )
        result.results.append(row)
        result.tree = stats.tree
        if progress is not None:
            progress(row)
    return result
