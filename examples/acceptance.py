#!/usr/bin/env python
"""Acceptance by draft position, mean accepted length and speedup against k, per drafter.

    python examples/acceptance.py                          # 3 prompts, 48 tokens, k = 1 2 4 8
    python examples/acceptance.py --small --out acc.png    # 1 prompt, 16 tokens, k = 2 4
    python examples/acceptance.py --drafters self:int8,composite,layer-skip:15 --ks 2,4

Greedy decoding on the embedded SmolLM2-135M. Acceptance comes from ``SpecStats``; speedup is wall-clock
time of plain ``model.generate`` (timed on the same prompts just before and after each method's sweep) over
the method's, in the same process. transformers' own prompt lookup (``prompt_lookup_num_tokens=k``) is timed as a
baseline. Prints a table, saves a figure to ``--out``; exits 1 if a specdec output differs from the plain one.
Same content as ``02_acceptance.ipynb``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

import torch

import specdec
from specdec.eval.side_by_side import BUILTIN_PROMPTS
from specdec.models import load_model
from specdec.quant import available_schemes

BASELINE = "HF prompt lookup"


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="1 prompt, 16 new tokens, k in 2,4 (quick check)")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "specdec_examples", "acceptance.png"),
                        help="where to save the figure (PNG)")
    parser.add_argument("--drafters", help="comma-separated drafter names (default: self:int8,self:bf16,[self:int4,]prompt-lookup)")
    parser.add_argument("--ks", help="comma-separated draft lengths")
    parser.add_argument("--prompts", type=int, help="how many built-in prompts")
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--no-baseline", action="store_true", help="skip transformers' prompt lookup")
    return parser.parse_args(argv)


def sweep(model: Any, tokenizer: Any, drafters: list[str], ks: list[int], prompts: list[str], max_new: int,
          baseline: bool = True) -> tuple[list[dict], list[float]]:
    """Time speculative (and baseline) greedy runs for every method, k and prompt.

    Each method's sweep is bracketed by plain runs of every prompt; a run's ``plain_seconds`` is the mean
    of the plain run of its prompt just before and just after its method's sweep, so that drift of a
    shared machine hits both sides alike. Returns (runs, plain tokens/s of each round of plain runs).
    """
    inputs = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True) for p in prompts]
    greedy = dict(max_new_tokens=max_new, do_sample=False, pad_token_id=tokenizer.eos_token_id)
    spec_models = {}
    for name in drafters:
        spec_models[name], secs = timed(lambda: specdec.SpeculativeModel(model, draft=name, tokenizer=tokenizer,
                                                                         num_draft_tokens=max(ks)))
        spec_models[name].generate(**inputs[0], max_new_tokens=2, do_sample=False)  # warm-up
        print(f"{name:<16} drafter ready in {secs:.1f} s", flush=True)
    model.generate(**inputs[0], max_new_tokens=2, do_sample=False)  # warm-up

    plain_rounds: list[dict[int, float]] = []
    reference: dict[int, torch.Tensor] = {}
    runs: list[dict] = []

    def run_plain() -> None:
        seconds = {}
        for i, inp in enumerate(inputs):
            reference[i], seconds[i] = timed(lambda: model.generate(**inp, **greedy))
        plain_rounds.append(seconds)

    def run_method(method: str, generate: Callable[[dict, int], tuple[torch.Tensor, Any]]) -> None:
        before, new = plain_rounds[-1], []
        for k in ks:
            for i, inp in enumerate(inputs):
                (out, stats), secs = timed(lambda: generate(inp, k))
                new.append(dict(method=method, k=k, prompt=i, seconds=secs, stats=stats,
                                new_tokens=out.shape[1] - inp["input_ids"].shape[1],
                                identical=torch.equal(out, reference[i])))
        run_plain()
        for r in new:
            r["plain_seconds"] = (before[r["prompt"]] + plain_rounds[-1][r["prompt"]]) / 2
        runs.extend(new)
        print(f"{method:<16} swept", flush=True)

    run_plain()
    for name, fast in spec_models.items():
        run_method(name, lambda inp, k: (fast.generate(**inp, **greedy, num_draft_tokens=k), fast.last_stats))
    if baseline:
        run_method(BASELINE, lambda inp, k: (model.generate(**inp, **greedy, prompt_lookup_num_tokens=k), None))
    plain_tokens = sum(reference[i].shape[1] - inputs[i]["input_ids"].shape[1] for i in reference)
    return runs, [plain_tokens / sum(r.values()) for r in plain_rounds]


def summarize(runs: list[dict]) -> dict[tuple[str, int], dict]:
    """Per (method, k): acceptance by position, acceptance, mean accepted length, tokens/s, speedup."""
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in runs:
        groups[(r["method"], r["k"])].append(r)
    table = {}
    for (method, k), rs in groups.items():
        stats = [r["stats"] for r in rs if r["stats"] is not None]
        proposed = [sum(s.proposed_per_position[j] for s in stats if j < len(s.proposed_per_position)) for j in range(k)]
        accepted = [sum(s.accepted_per_position[j] for s in stats if j < len(s.accepted_per_position)) for j in range(k)]
        steps = [n for s in stats for n in s.committed_per_step]
        seconds = sum(r["seconds"] for r in rs)
        table[(method, k)] = dict(
            by_position=[a / p if p else float("nan") for a, p in zip(accepted, proposed)] if stats else None,
            acceptance=sum(accepted) / sum(proposed) if stats and sum(proposed) else float("nan"),
            mean_accepted_length=sum(steps) / len(steps) if steps else float("nan"),
            tokens_per_s=sum(r["new_tokens"] for r in rs) / seconds,
            speedup=sum(r["plain_seconds"] for r in rs) / seconds,
            identical=sum(r["identical"] for r in rs),
            runs=len(rs),
        )
    return table


def fmt(x: float, width: int) -> str:
    return f"{'-':>{width}}" if x != x else f"{x:>{width}.2f}"  # "-" for NaN (no SpecStats)


def print_table(summary: dict, plain_tps: list[float]) -> None:
    print(f"\nplain model.generate, each round: {', '.join(f'{t:.2f}' for t in plain_tps)} tokens/s")
    print(f"{'method':<17}{'k':>3}{'accept':>8}{'tokens/pass':>13}{'tokens/s':>10}{'speedup':>9}{'identical':>11}")
    for (method, k), row in summary.items():
        print(f"{method:<17}{k:>3}{fmt(row['acceptance'], 8)}{fmt(row['mean_accepted_length'], 13)}"
              f"{fmt(row['tokens_per_s'], 10)}{fmt(row['speedup'], 9)}{row['identical']:>7}/{row['runs']:<3}")
    print("\nbest k per method (this run):")
    for method in dict.fromkeys(m for m, _ in summary):
        best = max((k for m, k in summary if m == method), key=lambda k: summary[(method, k)]["speedup"])
        print(f"  {method:<17} k = {best}: {summary[(method, best)]['speedup']:.2f}x")


def plot(summary: dict, ks: list[int], path: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend needed

    fig = Figure(figsize=(15, 4.2))
    ax_pos, ax_len, ax_speed = fig.subplots(1, 3)
    for method in dict.fromkeys(m for m, _ in summary):
        mks = [k for m, k in summary if m == method]
        if summary[(method, mks[0])]["by_position"] is not None:
            kmax = max(mks)
            ax_pos.plot(range(1, kmax + 1), summary[(method, kmax)]["by_position"], marker="o", label=method)
            ax_len.plot(mks, [summary[(method, k)]["mean_accepted_length"] for k in mks], marker="o", label=method)
        ax_speed.plot(mks, [summary[(method, k)]["speedup"] for k in mks], marker="o", label=method,
                      linestyle="--" if method == BASELINE else "-")
    ax_len.plot(ks, [k + 1 for k in ks], color="grey", linestyle=":", label="k + 1 (all accepted)")
    ax_speed.axhline(1.0, color="grey", linestyle=":", label="plain model.generate")
    ax_pos.set(title=f"acceptance by draft position (k = {max(ks)})", xlabel="draft position", ylabel="acceptance rate",
               ylim=(0, 1.05), xticks=range(1, max(ks) + 1))
    ax_len.set(title="mean accepted length", xlabel="k", ylabel="tokens per verifier pass", xticks=ks)
    ax_speed.set(title="speedup over model.generate (wall time)", xlabel="k", ylabel="x", xticks=ks)
    for ax in (ax_pos, ax_len, ax_speed):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None, model: Any = None, tokenizer: Any = None) -> int:
    """Run the sweep; ``model``/``tokenizer`` may be passed in (tests reuse a loaded model)."""
    args = parse_args(argv)
    if args.drafters:
        drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    else:
        drafters = ["self:int8", "self:bf16", "prompt-lookup"]
        if not args.small and "int4" in available_schemes("cpu"):
            drafters.insert(2, "self:int4")
    ks = [int(k) for k in args.ks.split(",")] if args.ks else ([2, 4] if args.small else [1, 2, 4, 8])
    n_prompts = args.prompts or (1 if args.small else 3)
    max_new = args.max_new_tokens or (16 if args.small else 48)
    prompts = [p["prompt"] for p in BUILTIN_PROMPTS[:n_prompts]]
    print(f"{len(prompts)} prompts, {max_new} new tokens, k in {ks}, drafters {drafters}")
    if model is None:
        model, tokenizer = load_model("smollm2")

    runs, plain_tps = sweep(model, tokenizer, drafters, ks, prompts, max_new, not args.no_baseline)
    summary = summarize(runs)
    print_table(summary, plain_tps)
    plot(summary, ks, args.out)
    print(f"\nfigure saved to {args.out}")
    return 0 if all(r["identical"] for r in runs if r["method"] != BASELINE) else 1  # specdec must be lossless


if __name__ == "__main__":
    sys.exit(main())
