"""Print a markdown table of speedups per task group from a ``specdec eval`` summary.json.

    python benchmarks/group_table.py benchmarks/results/drafters/eval-greedy/summary.json [--vs hf-compiled]
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary")
    parser.add_argument("--vs", default="hf", help="the method every speedup is taken against (default: hf)")
    args = parser.parse_args()
    summary = json.load(open(args.summary, encoding="utf-8"))
    methods = [m["name"] for m in summary["methods"] if m["name"] != args.vs]
    by_name = {m["name"]: m for m in summary["methods"]}
    print("| group | " + " | ".join(methods) + " |")
    print("|---|" + "--:|" * len(methods))
    for group in [*summary["groups"], "overall"]:
        figures = [by_name[n] if group == "overall" else by_name[n]["groups"].get(group) for n in methods]
        cells = [f"{f['speedup_vs'][args.vs]:.2f}x" if f else "-" for f in figures]
        print(f"| {group} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
