#!/usr/bin/env python
"""The two phases measured on this machine: prefill (time to first token against prompt length) and
decode (time per output token against context), plus the cost of one forward pass over n tokens.

    python examples/two_phases.py                    # prompts up to 1024 tokens, contexts up to 2048
    python examples/two_phases.py --small --out phases.png

Plain SmolLM2-135M (fp32, CPU), medians of ``--repeats`` runs. Same content as ``04_two_phases.ipynb``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch

from specdec import sizing
from specdec.eval.side_by_side import BUILTIN_PROMPTS
from specdec.models import load_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="a few lengths, 1 repeat (quick check)")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "specdec_examples", "two_phases.png"),
                        help="where to save the figure (PNG)")
    parser.add_argument("--repeats", type=int, help="runs per measurement (median); default 3, 1 with --small")
    return parser.parse_args(argv)


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def token_pool(tokenizer: Any, length: int) -> torch.Tensor:
    """``[1, length]`` ids of real text, repeated (attention cost does not depend on the words)."""
    ids = tokenizer(" ".join(p["prompt"] for p in BUILTIN_PROMPTS), return_tensors="pt")["input_ids"]
    return ids.repeat(1, length // ids.shape[1] + 1)[:, :length]


def measure_ttft(model: Any, ids: torch.Tensor, lengths: list[int], repeats: int, pad: int) -> dict[int, float]:
    """Seconds of ``model.generate(prompt, max_new_tokens=1)``: prefill plus the first token."""
    model.generate(ids[:, :8], max_new_tokens=1, do_sample=False, pad_token_id=pad)  # warm-up
    out = {}
    for n in lengths:
        prompt = ids[:, :n]
        out[n] = median_seconds(lambda: model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=1,
                                                       do_sample=False, pad_token_id=pad), repeats)
    return out


@torch.inference_mode()
def decode_step_seconds(model: Any, ids: torch.Tensor, context: int, steps: int) -> list[float]:
    """Prefill ``context`` tokens, then time ``steps`` single-token greedy forward passes."""
    out = model(ids[:, :context], use_cache=True)
    past, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        out = model(token, past_key_values=past, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        times.append(time.perf_counter() - start)
        past = out.past_key_values
    return times


@torch.inference_mode()
def pass_seconds(model: Any, ids: torch.Tensor, context: int, n: int, repeats: int) -> float:
    """One forward pass over ``n`` new tokens after ``context`` cached ones (a verifier pass), cache cropped back."""
    cache = model(ids[:, :context], use_cache=True).past_key_values
    block = ids[:, context:context + n]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(block, past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - start)
        cache.crop(-n)
    return statistics.median(times)


def main(argv: list[str] | None = None, model: Any = None, tokenizer: Any = None) -> int:
    """Measure and plot; ``model``/``tokenizer`` may be passed in (tests reuse a loaded model)."""
    args = parse_args(argv)
    small = args.small
    lengths = [1, 8, 64, 256] if small else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    contexts = [16, 256] if small else [16, 128, 256, 512, 1024, 2048]
    pass_sizes = [1, 4, 16] if small else [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32]
    steps = 4 if small else 16
    repeats = args.repeats or (1 if small else 3)
    if model is None:
        model, tokenizer = load_model("smollm2")
    ids = token_pool(tokenizer, max(lengths + contexts) + max(pass_sizes) + steps)
    print(f"torch threads: {torch.get_num_threads()}; model: {model.num_parameters() / 1e6:.0f}M parameters, {model.dtype}")

    ttft = measure_ttft(model, ids, lengths, repeats, tokenizer.eos_token_id)
    flops_per_token = 2 * (model.num_parameters() - model.get_input_embeddings().weight.numel())
    print(f"\nprefill\n{'prompt':>7}{'TTFT ms':>10}{'prompt tokens/s':>17}{'~GFLOP/s':>10}")
    for n, secs in ttft.items():
        print(f"{n:>7}{secs * 1000:>10.1f}{n / secs:>17.1f}{flops_per_token * n / secs / 1e9:>10.1f}")

    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = sizing.kv_bytes_per_token(model.config, model.dtype)
    tpot = {c: statistics.median(sum((decode_step_seconds(model, ids, c, steps) for _ in range(repeats)), []))
            for c in contexts}
    print(f"\ndecode (weights {weight_bytes / 2**20:.0f} MiB, KV {kv_per_token / 1024:.1f} KiB per token)")
    print(f"{'context':>8}{'TPOT ms':>9}{'tokens/s':>10}{'KV MiB':>8}{'~GB/s read':>12}")
    for c, secs in tpot.items():
        read = weight_bytes + kv_per_token * c
        print(f"{c:>8}{secs * 1000:>9.1f}{1 / secs:>10.1f}{kv_per_token * c / 2**20:>8.1f}{read / secs / 1e9:>12.2f}")

    pass_context = min(contexts[-1], 256)
    per_pass = {n: pass_seconds(model, ids, pass_context, n, max(repeats, 3)) for n in pass_sizes}
    one = per_pass[pass_sizes[0]]
    print(f"\none forward pass over n tokens after {pass_context} cached\n{'tokens':>7}{'ms':>9}{'x one token':>13}{'ms per token':>14}")
    for n, secs in per_pass.items():
        print(f"{n:>7}{secs * 1000:>9.1f}{secs / one:>13.2f}{secs * 1000 / n:>14.1f}")

    plot(ttft, tpot, per_pass, pass_context, args.out)
    print(f"\nfigure saved to {args.out}")
    return 0


def plot(ttft: dict, tpot: dict, per_pass: dict, pass_context: int, path: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend needed

    fig = Figure(figsize=(15, 4.2))
    axes = fig.subplots(1, 3)
    ax = axes[0]
    ax.plot(list(ttft), [s * 1000 for s in ttft.values()], marker="o", label="TTFT")
    ax.set(xscale="log", yscale="log", title="prefill: time to first token", xlabel="prompt tokens", ylabel="ms")
    ax2 = ax.twinx()
    ax2.plot(list(ttft), [n / s for n, s in ttft.items()], marker="s", color="tab:orange", label="prompt tokens/s")
    ax2.set(ylabel="prompt tokens / s")
    ax.legend(loc="upper left")
    ax2.legend(loc="lower right")
    ax = axes[1]
    ax.plot(list(tpot), [s * 1000 for s in tpot.values()], marker="o", label="measured TPOT")
    ax.set(title="decode: time per output token", xlabel="context (tokens)", ylabel="ms", ylim=(0, None))
    ax.legend()
    ax = axes[2]
    one = next(iter(per_pass.values()))
    ax.plot(list(per_pass), [s / one for s in per_pass.values()], marker="o", label="measured")
    ax.plot(list(per_pass), list(per_pass), color="grey", linestyle=":", label="n single-token steps")
    ax.set(title=f"one forward pass over n tokens (context {pass_context})", xlabel="n tokens in the pass",
           ylabel="time / time of a 1-token pass")
    ax.legend()
    for a in axes:
        a.grid(alpha=0.3, which="both")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
