"""Quantized-drafter report for SmolLM2-135M on this machine: bytes, ms/token, agreement.

    python benchmarks/quant_schemes.py                      # all CPU schemes, Spec-Bench prompts
    python benchmarks/quant_schemes.py --schemes int8,int4 --positions 200 --json

Accepts every option of ``specdec quant-report`` (see ``specdec.quant_report``). Prompts default
to Spec-Bench (``shared/data/spec_bench/question.jsonl`` beside the repository, 8 prompts taken
round-robin over its categories) when that file exists, else the built-in prompts.
"""

from __future__ import annotations

import argparse
import os
import sys

from specdec.quant_report import add_quant_report_arguments, run_quant_report

BENCH_SCHEMES = (
    "fp32,bf16,int8,int8+head,int8-dynamic,int8-dynamic+head,"
    "int4:g32,int4:g32+head8,int4:g32+head,int4:g64+head8,int4:g128,int4:g128+head8,nf4"
)
SPEC_BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "spec_bench", "question.jsonl")


def main(argv: list[str] | None = None) -> int:
    parser = add_quant_report_arguments(argparse.ArgumentParser(description=__doc__,
                                                                formatter_class=argparse.RawDescriptionHelpFormatter))
    parser.set_defaults(schemes=BENCH_SCHEMES)
    if os.path.exists(SPEC_BENCH):
        parser.set_defaults(prompts=os.path.abspath(SPEC_BENCH))
    args = parser.parse_args(argv)
    print(f"prompts: {args.prompts or 'built-in'}; schemes: {args.schemes}", file=sys.stderr)
    return run_quant_report(args)


if __name__ == "__main__":
    raise SystemExit(main())
