"""Tokens a pass under each verification rule against the token rule, paired by prompt, from one eval run.

``python benchmarks/paired_rules.py benchmarks/results/verify/spec-bench-t07-trees-sampled/records.jsonl`` pairs every
``specdec[...,verify=R]`` method with the same method under the token rule (the name without ``,verify=R``) and
prints the pooled tokens a pass of both, and the mean over prompts of the per-prompt ratio minus one with its
standard error (the sampled texts differ between methods, so per-prompt spread is the noise to read a gain against).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("records", type=Path, help="an eval run's records.jsonl")
    args = p.parse_args()
    runs: dict[str, dict[str, dict]] = {}
    for line in args.records.read_text().splitlines():
        record = json.loads(line)
        if record.get("verifier_passes"):
            runs.setdefault(record["method"], {})[record["prompt_id"]] = record
    for name, rows in runs.items():
        base = re.sub(r",verify=\w+", "", name)
        if base == name or base not in runs:
            continue
        token = runs[base]
        shared = [pid for pid in rows if pid in token]
        ratios = [rows[i]["mean_accepted_length"] / token[i]["mean_accepted_length"] - 1 for i in shared]
        pooled = [sum(r[i]["committed_tokens"] for i in shared) / sum(r[i]["verifier_passes"] for i in shared)
                  for r in (token, rows)]
        error = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else float("nan")
        ahead = sum(r > 0 for r in ratios)
        print(f"{name}: tokens a pass {pooled[0]:.3f} -> {pooled[1]:.3f} pooled; per prompt "
              f"{statistics.mean(ratios):+.3f} +- {error:.3f}, ahead on {ahead}/{len(ratios)}")


if __name__ == "__main__":
    main()
