#!/usr/bin/env python
"""KV cache sizes for MHA, GQA, MQA and sliding-window models, and the planner's answer for a GPU.

    python examples/kv_cache.py                     # table, plans for 24 GiB and 80 GiB, figure
    python examples/kv_cache.py --small --out kv.png
    python examples/kv_cache.py --memory 48GiB --verifier llama-3.1-8b --drafter self --context 32768

No model is loaded: everything is computed by ``specdec.sizing`` from configs (built-in presets written
from public ``config.json`` files, plus Falcon-7B's fields for MQA). Same content as ``03_kv_cache.ipynb``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

from specdec import sizing

GiB = 2**30
# Falcon-7B, the classic MQA model (no preset): the memory-relevant fields of its public config.json.
FALCON_7B = {"model_type": "falcon", "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71,
             "multi_query": True, "new_decoder_architecture": False, "vocab_size": 65024,
             "max_position_embeddings": 2048}
MODELS: dict[str, Any] = {  # label -> preset name or config
    "Llama-2-7B": "llama-2-7b",
    "Llama-3-8B": "llama-3-8b",
    "Falcon-7B": FALCON_7B,
    "Mistral-7B": "mistral-7b",
    "Gemma-2-9B": "gemma-2-9b",
}


def attention_kind(p: sizing.KVProfile) -> str:
    if p.kv_heads == p.query_heads:
        kind = "MHA"
    elif p.kv_heads == 1:
        kind = "MQA"
    else:
        kind = f"GQA ({p.query_heads // p.kv_heads} q/kv)"
    for layer_kind, window in p.windows.items():
        kind += f", {p.layers[layer_kind]}/{sum(p.layers.values())} layers window {window}"
    return kind


def max_context(cfg: Any) -> int:
    return int(getattr(cfg, "max_position_embeddings", 0) or 0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="fewer points in the plots")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "specdec_examples", "kv_cache.png"),
                        help="where to save the figure (PNG)")
    parser.add_argument("--dtype", default="bfloat16", help="KV cache and weight dtype")
    parser.add_argument("--memory", default="24GiB,80GiB", help="comma-separated GPU memory budgets")
    parser.add_argument("--verifier", default="llama-3.1-8b", help="preset or config.json for the planner")
    parser.add_argument("--drafter", default="llama-3.2-1b", help="preset, config.json, or 'self' (a quantized copy)")
    parser.add_argument("--draft-quant", default=None, help="drafter quantization, e.g. int8 (with --drafter self)")
    parser.add_argument("--context", type=int, default=8192, help="tokens per sequence for the plans")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configs = {label: sizing.load_config(spec) for label, spec in MODELS.items()}
    profiles = {label: sizing.kv_profile(cfg, args.dtype) for label, cfg in configs.items()}

    print(f"KV cache per token ({args.dtype}); 'naive' counts query heads instead of K/V heads")
    print(f"{'model':<12}{'attention':<40}{'layers':>7}{'q':>4}{'kv':>4}{'dim':>5}{'KV B/token':>12}{'naive':>10}"
          f"{'x':>6}{'max ctx':>9}")
    for label, p in profiles.items():
        print(f"{label:<12}{attention_kind(p):<40}{sum(p.layers.values()):>7}{p.query_heads:>4}{p.kv_heads:>4}"
              f"{p.head_dim:>5}{p.bytes_per_token:>12,}{p.naive_bytes_per_token:>10,}"
              f"{p.naive_bytes_per_token / p.bytes_per_token:>6.1f}{max_context(configs[label]):>9,}")

    contexts = [2**e for e in range(8, 18, 3 if args.small else 1)]  # 256 ... 131072 tokens
    print(f"\nKV cache of one sequence (GiB, sliding layers capped at their window; '-' beyond the model's limit)")
    print(f"{'model':<12}" + "".join(f"{c:>10,}" for c in contexts))
    for label, cfg in configs.items():
        cells = [f"{sizing.kv_bytes_per_sequence(cfg, c, args.dtype) / GiB:>10.3f}" if c <= max_context(cfg)
                 else f"{'-':>10}" for c in contexts]
        print(f"{label:<12}" + "".join(cells))

    memories = [m.strip() for m in args.memory.split(",") if m.strip()]
    plan_kwargs = dict(drafter=args.drafter, draft_quant=args.draft_quant, dtype=args.dtype)
    for memory in memories:
        print()
        try:
            print(sizing.plan(args.verifier, memory=memory, context=args.context, **plan_kwargs).table())
        except sizing.PlanError as error:
            print(f"{args.verifier} on {memory}: {error}")

    sweep = [2**e for e in range(10, 18, 2 if args.small else 1)]  # 1k ... 128k tokens
    max_batches: dict[str, list[tuple[int | None, int | None]]] = {}
    print(f"\nmax batch against context ({args.verifier} + draft {args.drafter}); naive in brackets")
    for memory in memories:
        row = []
        for c in sweep:
            try:
                p = sizing.plan(args.verifier, memory=memory, context=c, **plan_kwargs)
                row.append((p.max_batch, p.naive_max_batch))
            except sizing.PlanError:
                row.append((0, 0))
        max_batches[memory] = row
        print(f"{memory:>8}: " + ", ".join(f"{c:,} -> {b} ({n})" for c, (b, n) in zip(sweep, row)))

    plot(configs, profiles, contexts, sweep, max_batches, args)
    print(f"\nfigure saved to {args.out}")
    return 0


def plot(configs: dict, profiles: dict, contexts: list[int], sweep: list[int], max_batches: dict,
         args: argparse.Namespace) -> None:
    from matplotlib.figure import Figure  # no pyplot: no GUI backend needed

    fig = Figure(figsize=(17, 4.5))
    ax_tok, ax_ctx, ax_batch = fig.subplots(1, 3)
    labels = list(profiles)
    ax_tok.bar(labels, [profiles[l].naive_bytes_per_token / 1024 for l in labels], color="lightgrey", label="naive (query heads)")
    ax_tok.bar(labels, [profiles[l].bytes_per_token / 1024 for l in labels], label="real (K/V heads)")
    ax_tok.set(title=f"KV cache per token ({args.dtype})", ylabel="KiB per token")
    ax_tok.tick_params(axis="x", labelsize=8)
    ax_tok.legend()
    for (label, cfg), marker in zip(configs.items(), "osD^v"):
        xs = sorted({c for c in contexts if c < max_context(cfg)} | {max_context(cfg)})
        line, = ax_ctx.plot(xs, [sizing.kv_bytes_per_sequence(cfg, c, args.dtype) / GiB for c in xs], marker=marker,
                            alpha=0.8, label=label)
        if profiles[label].windows:
            ax_ctx.plot(xs, [sizing.kv_bytes_per_sequence(cfg, c, args.dtype, cap_sliding=False) / GiB for c in xs],
                        linestyle=":", color=line.get_color(), label=f"{label}, specdec managed cache")
    ax_ctx.set(xscale="log", yscale="log", title="KV cache of one sequence", xlabel="context (tokens)", ylabel="GiB")
    ax_ctx.legend(fontsize=7)
    for memory, row in max_batches.items():
        line, = ax_batch.plot(sweep, [b for b, _ in row], marker="o", label=memory)
        ax_batch.plot(sweep, [n for _, n in row], linestyle=":", color=line.get_color(), label=f"{memory}, counting query heads")
    ax_batch.set_yscale("symlog", linthresh=1)  # 0 = nothing fits
    ax_batch.set(xscale="log", ylim=(0, None), title=f"max batch: {args.verifier} + draft {args.drafter}",
                 xlabel="context per sequence (tokens)", ylabel="sequences")
    ax_batch.legend(fontsize=7)
    for ax in (ax_ctx, ax_batch):
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fig.savefig(args.out, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
