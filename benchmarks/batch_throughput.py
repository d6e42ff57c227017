"""Batched throughput: specdec vs HF generate at the same batch size, on Spec-Bench prompts.

For each batch size B, the first B prompts (round-robin over the six task groups) are left-padded
into one batch and run through HF `generate` and specdec back to back (order alternating, after a
warm-up). Throughput is total new tokens / wall time. `identical` counts rows whose output equals
HF's batched output.

    python benchmarks/batch_throughput.py --batch-sizes 1,4,8,16 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import specdec
from specdec.models import load_model
from specdec.prompts import encode_batch, load_prompts
from specdec.quant import quantize


def _batch(tok, prompts: list[str]) -> dict[str, torch.Tensor]:
    ids, mask = encode_batch(tok, prompts)  # chat template, left padded
    return {"input_ids": ids, "attention_mask": mask}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="prompt set (default: Spec-Bench from shared/data)")
    ap.add_argument("--batch-sizes", default="1,4,8,16")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft", default="int8")
    ap.add_argument("-k", "--num-draft-tokens", type=int, default=specdec.DEFAULT_NUM_DRAFT_TOKENS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    model, tok = load_model("smollm2")
    spec = specdec.SpeculativeModel(model, quantize(model, args.draft), num_draft_tokens=args.num_draft_tokens,
                                    tokenizer=tok)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    pool = load_prompts(args.data, per_group=max(sizes))
    groups = sorted({p.group for p in pool})
    ordered = [p for i in range(max(sizes)) for g in groups for p in [q for q in pool if q.group == g][i:i + 1]]
    kwargs = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    warm = _batch(tok, [ordered[0].text])
    model.generate(**warm, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    spec.generate(**warm, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
    rows = []
    for i, b in enumerate(sizes):
        inputs = _batch(tok, [p.text for p in ordered[:b]])
        width = inputs["input_ids"].shape[1]
        runs = {}
        for name in (["hf", "specdec"] if i % 2 == 0 else ["specdec", "hf"]):
            fn = model.generate if name == "hf" else spec.generate
            start = time.perf_counter()
            out = fn(**inputs, **kwargs)
            runs[name] = (out, time.perf_counter() - start)
        new = {n: int((o[:, width:] != tok.pad_token_id).sum()) for n, (o, _) in runs.items()}
        same = sum(torch.equal(a, c) for a, c in zip(runs["hf"][0], runs["specdec"][0]))
        tps = {n: new[n] / runs[n][1] for n in runs}
        stats = spec.last_stats
        rows.append({"batch": b, "hf_tokens_per_s": tps["hf"], "specdec_tokens_per_s": tps["specdec"],
                     "ratio": tps["specdec"] / tps["hf"], "identical_rows": same,
                     "mean_accepted_length": stats.mean_accepted_length, "acceptance_rate": stats.acceptance_rate})
        print(f"batch {b:>3}: hf {tps['hf']:7.2f} tok/s  specdec {tps['specdec']:7.2f} tok/s  ratio "
              f"{tps['specdec'] / tps['hf']:.2f}  mean accepted length {stats.mean_accepted_length:.2f}  "
              f"identical rows {same}/{b}", file=sys.stderr, flush=True)
    print(f"\nSmolLM2-135M fp32 verifier, {args.draft} self-drafter, k={args.num_draft_tokens}, greedy, "
          f"{args.max_new_tokens} new tokens, Spec-Bench prompts")
    print(f"{'batch':>5}{'hf tok/s':>10}{'specdec tok/s':>15}{'ratio':>7}{'accepted len':>14}{'identical':>11}")
    for r in rows:
        print(f"{r['batch']:>5}{r['hf_tokens_per_s']:>10.2f}{r['specdec_tokens_per_s']:>15.2f}{r['ratio']:>7.2f}"
              f"{r['mean_accepted_length']:>14.2f}{r['identical_rows']:>8}/{r['batch']}")
    if args.json:
        print(json.dumps({"batches": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
