"""Cost of one draft-head training step on real features, as ``train-head`` runs it (issue 24: a CPU epoch over the
full data takes hours, so every per-step saving counts). Pause other jobs while it runs (``kill -STOP``).

    python benchmarks/head_train_step.py --features runs/head-v2/work/features --batches 6 [--profile] [--json]

Takes the first ``--batches`` batches of epoch 0's order over the first ``--shards`` feature shards (length-grouped
batches of ``--batch-tokens`` padded tokens, as training groups them) and times forward, backward and the AdamW
step of a freshly initialised EAGLE-3 head (the loss of the slots a step scores, bf16 autocast), each batch
``--repeats`` times, keeping the best. ``--profile`` adds a ``torch.profiler`` table of the top operators.
``--masked-attention`` times the older masked training-time attention. ``--trim-every N`` returns the heap's free pages to the kernel every N steps, as train-head does on a CPU (the cost
of doing so; run it under ``/usr/bin/time -f %M`` for the peak memory).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from specdec.heads import HeadConfig
from specdec.models import load_model
from specdec.training.features import FeatureSet
from specdec.training.heap import release_free_memory
from specdec.training.train import _batches, collate, draft_vocabulary, head_loss, init_head


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--features", type=Path, required=True, help="a train-head feature directory")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    ap.add_argument("--ttt-steps", type=int, default=5)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trim-every", type=int, default=0, help="release the heap's free pages every N steps (0: never)")
    ap.add_argument("--masked-attention", action="store_true",
                    help="the training-time attention as one masked SDPA over every step's keys (the CPU default "
                         "is flash over the causal block merged with the chain's keys, specdec.training.ttt_attention)")
    args = ap.parse_args()
    if args.masked_attention:
        import specdec.training.train as train_module

        train_module.flash_ttt_available = lambda device: False

    model, _ = load_model("smollm2")
    paths = sorted(args.features.glob("features-*.safetensors"))[: args.shards]
    if not paths:
        sys.exit(f"error: no features-*.safetensors in {args.features}")
    features = FeatureSet(paths)
    idx = list(range(len(features)))
    config = HeadConfig.for_verifier(model.config, "eagle3")
    keep, _ = draft_vocabulary(features, idx, args.draft_vocab, config.vocab_size)
    config.draft_vocab_size = len(keep)
    torch.manual_seed(0)
    head = init_head(config, model, keep).train()
    embed, target_head = model.get_input_embeddings(), model.get_output_embeddings()
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-4, betas=(0.9, 0.95))
    lengths = [len(features.small(i)["input_ids"]) for i in idx]
    batches = _batches(lengths, args.batch_tokens, random.Random(0))[: args.batches]
    device = model.device

    def step(batch: dict[str, torch.Tensor]) -> dict[str, float]:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss, stats = head_loss(head, batch, embed, target_head, args.ttt_steps)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad()
        return stats

    rows, steps = [], 0
    for b in batches:
        batch = collate(features, b, device)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            stats = step(batch)
            steps += 1
            if args.trim_every and steps % args.trim_every == 0:  # inside the timing: its cost is what we measure
                release_free_memory()
            times.append(time.perf_counter() - start)
        rows.append({"rows": len(b), "width": int(batch["lengths"].max()), "scored": int(stats["all_0"]),
                     "seconds": min(times)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        batch = collate(features, batches[0], device)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step(batch)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
    result = {"command": "python benchmarks/head_train_step.py " + " ".join(sys.argv[1:]),
              "total_seconds": sum(r["seconds"] for r in rows), "batches": rows}
    print(json.dumps(result) if args.json else f"{result['total_seconds']:.2f} s for {len(rows)} batches")


if __name__ == "__main__":
    main()
