"""``specdec plan``: its options and its run (wired into the command line by specdec/cli.py)."""

from __future__ import annotations

import argparse
import json
import sys

from specdec.sizing.check import PlanError
from specdec.sizing.planner.planning import plan
from specdec.sizing.presets import preset_names


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``specdec plan`` options to ``parser``."""
    parser.add_argument("--model", required=True,
                        help=f"verifier: preset name or path to config.json / its directory (presets: {', '.join(preset_names())})")
    parser.add_argument("--draft", default=None,
                        help="drafter: preset or config path, or 'self' for a quantized copy of --model (see --draft-quant)")
    parser.add_argument("--context", type=int, default=None,
                        help="tokens per row, prompt + generated (default: the model's max, else 4096)")
    parser.add_argument("--batch", type=int, default=None, help="rows decoded together (default 1)")
    parser.add_argument("--dtype", default="bfloat16", help="weight/compute dtype (default bfloat16)")
    parser.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: --dtype)")
    parser.add_argument("--quant", default=None,
                        help="verifier weight quantization, a specdec.quant scheme: int8, int8-dynamic, int4, "
                             "int4:g128, nf4, fp4, bf16, ... (+head keeps the LM head)")
    parser.add_argument("--draft-quant", default=None, help="drafter weight quantization (same forms)")
    parser.add_argument("--draft-len", type=int, default=8, help="drafted tokens per step (default 8)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="sets a quantized drafter's compute dtype and where --memory auto looks "
                             "(default cpu)")
    parser.add_argument("--memory", default=None,
                        help="memory budget, e.g. 80GiB, 24GB, 512MiB, bytes, or 'auto' (free memory now)")
    parser.add_argument("--headroom", default="auto",
                        help="runtime reserve besides activations: size or 'auto' (1GiB)")
    parser.add_argument("--prompt-len", type=int, default=None,
                        help="prompt tokens per row, which sets the prefill activation peak and a batch's cache "
                             "slack (default: the worst case of each)")
    parser.add_argument("--json", action="store_true", help="also print the plan as one JSON object (last line)")


def run_plan(args: argparse.Namespace) -> int:
    """Run ``specdec plan``: print the table (and with ``--json`` a JSON object as the last line of
    stdout). Returns 0 when it fits (or no memory was given), 1 when the requested batch x context
    does not fit but something smaller does, 2 on errors and when nothing fits."""
    try:
        result = plan(
            args.model,
            drafter=args.draft,
            memory=args.memory,
            context=args.context,
            batch=args.batch,
            dtype=args.dtype,
            kv_dtype=args.kv_dtype,
            weight_quant=args.quant,
            draft_quant=args.draft_quant,
            draft_len=args.draft_len,
            headroom=getattr(args, "headroom", "auto"),
            prompt_len=getattr(args, "prompt_len", None),
            device=getattr(args, "device", "cpu"),
        )
    except PlanError as exc:
        print(f"specdec plan: {exc}", file=sys.stderr)
        if exc.plan is not None:
            print(exc.plan.table())
        if args.json:
            payload = exc.plan.to_dict() if exc.plan is not None else {}
            payload["error"] = str(exc)
            print(json.dumps(payload))
        return 2
    except (ValueError, TypeError, OSError) as exc:
        print(f"specdec plan: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": str(exc)}))
        return 2
    print(result.table())
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0 if result.fits in (None, True) else 1
