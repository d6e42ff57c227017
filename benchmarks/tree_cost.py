"""The verifier's cost per pass against the number of tokens in it: the curve ``tree="auto"`` sizes trees by.

    python benchmarks/tree_cost.py --context 256 --repeats 5 --json

Runs :func:`specdec.trees.auto.measure_verify_cost` (the same measurement ``auto`` makes on first use: the
verifier over passes of 1..64 tokens through the tree-mask path, after a ``--context``-token prompt, median of
``--repeats``) and prints each size's time and its ratio to a one-token pass. On a CPU the cost grows with the
tokens; on a GPU it is nearly flat until the matmuls fill the device.
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec.models import load_model
from specdec.trees.auto import SIZES, measure_verify_cost
from specdec.runners.hf import CausalLMRunner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    model, _ = load_model(args.model, dtype=getattr(torch, args.dtype), device=args.device)
    cost = measure_verify_cost(CausalLMRunner(model), SIZES, context=args.context, repeats=args.repeats)
    print(f"verifier {args.model} ({args.dtype}) on {cost.device}, context {cost.context} tokens")
    print(f"{'tokens':>6} {'ms':>9} {'x 1-token pass':>15} {'ms per token':>13}")
    for n, s in zip(cost.sizes, cost.seconds):
        print(f"{n:>6} {1000 * s:>9.2f} {s / cost.seconds[0]:>15.2f} {1000 * s / n:>13.2f}")
    if args.json:
        print(json.dumps({**cost.to_dict(), "model": args.model, "dtype": args.dtype, "repeats": args.repeats,
                          "torch": torch.__version__, "threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
