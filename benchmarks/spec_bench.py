"""Speculative decoding vs its baselines on Spec-Bench prompts, in one process, back to back.

Methods per prompt (order rotated per prompt, one warm-up each):
  hf            model.generate(do_sample=False)
  hf-assisted   model.generate(assistant_model=<the same drafter model>), transformers' defaults
  hf-assisted-k model.generate(assistant_model=..., num_assistant_tokens=k, constant schedule)
  specdec       specdec.SpeculativeModel(model, drafter, num_draft_tokens=k)

Prints tokens/s per method, ratios to `hf`, and whether each greedy output is identical to `hf`.

    python benchmarks/spec_bench.py --per-group 2 --max-new-tokens 128
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict

import torch

import specdec
from specdec.models import load_model
from specdec.prompts import encode_prompt, load_prompts
from specdec.quant import quantize


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="prompt set (default: Spec-Bench from shared/data)")
    ap.add_argument("--per-group", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft", default="int8", help="quantization scheme of the verifier copy used as drafter")
    ap.add_argument("-k", "--num-draft-tokens", type=int, default=specdec.DEFAULT_NUM_DRAFT_TOKENS)
    ap.add_argument("--methods", default="hf,hf-assisted,hf-assisted-k,specdec")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    model, tok = load_model("smollm2")
    draft_model = quantize(model, args.draft)
    spec = specdec.SpeculativeModel(model, draft_model, num_draft_tokens=args.num_draft_tokens, tokenizer=tok)
    k = args.num_draft_tokens
    base = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)
    runners = {
        "hf": lambda ids: model.generate(ids, **base),
        "hf-assisted": lambda ids: model.generate(ids, assistant_model=draft_model, **base),
        "hf-assisted-k": lambda ids: model.generate(
            ids, assistant_model=draft_model, num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
            assistant_confidence_threshold=0.0, **base),
        "specdec": lambda ids: spec.generate(ids, **base),
    }
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in runners]
    if unknown or "hf" not in methods:
        ap.error(f"--methods must include hf and only {sorted(runners)}; got {unknown or methods}")

    prompts = [{"task": p.group, "prompt": p.text} for p in load_prompts(args.data, per_group=args.per_group)]
    warm = encode_prompt(tok, prompts[0]["prompt"])
    for m in methods:
        runners[m](warm[:, :16])
    tokens = defaultdict(int)
    seconds = defaultdict(float)
    identical = defaultdict(int)
    accepted = proposed = passes = 0
    per_group: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for i, item in enumerate(prompts):
        ids = encode_prompt(tok, item["prompt"])
        order = methods[i % len(methods):] + methods[: i % len(methods)]
        outs = {}
        for m in order:
            start = time.perf_counter()
            outs[m] = runners[m](ids)
            elapsed = time.perf_counter() - start
            new = outs[m].shape[1] - ids.shape[1]
            tokens[m] += new
            seconds[m] += elapsed
            per_group[item["task"]][m] += elapsed
            if m == "specdec":
                s = spec.last_stats
                accepted, proposed, passes = accepted + s.accepted, proposed + s.proposed, passes + s.verifier_forwards
        per_group[item["task"]]["tokens"] += outs["hf"].shape[1] - ids.shape[1]
        for m in methods:
            identical[m] += int(outs[m].shape == outs["hf"].shape and torch.equal(outs[m], outs["hf"]))
        print(f"[{i + 1}/{len(prompts)}] {item['task']:<22}" + "  ".join(
            f"{m} {per_group[item['task']][m]:.1f}s" for m in methods), file=sys.stderr, flush=True)

    tps = {m: tokens[m] / seconds[m] for m in methods}
    print(f"\nSmolLM2-135M fp32 verifier, drafter: {args.draft} copy, k={k}, greedy, {args.max_new_tokens} new tokens, "
          f"{len(prompts)} Spec-Bench prompts ({args.per_group} per group)")
    print(f"{'method':<15}{'tokens':>8}{'tok/s':>9}{'vs hf':>8}{'identical':>11}")
    for m in methods:
        print(f"{m:<15}{tokens[m]:>8}{tps[m]:>9.2f}{tps[m] / tps['hf']:>8.2f}{identical[m]:>8}/{len(prompts)}")
    for m in methods:
        if m.startswith("hf-assisted"):
            print(f"specdec vs {m}: {tps.get('specdec', 0) / tps[m]:.2f}x")
    print("\nper group speedup of specdec over hf:")
    for group, row in per_group.items():
        if "specdec" in row:
            print(f"  {group:<24}{row['hf'] / row['specdec']:.2f}x")
    if proposed:
        print(f"specdec acceptance rate {accepted / proposed:.3f}, mean accepted length "
              f"{(tokens['specdec'] - len(prompts)) / passes:.2f} tokens per verifier pass")
    summary = {
        "prompts": len(prompts),
        "tokens_per_s": tps,
        "speedup_vs_hf": {m: tps[m] / tps["hf"] for m in methods},
        "identical": dict(identical),
        "acceptance_rate": accepted / proposed if proposed else None,
    }
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
