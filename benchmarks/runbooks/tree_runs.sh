#!/usr/bin/env bash
# The runs behind BENCHMARKS.md section 8 (tree drafts, issue 17). Run on a quiet machine.
# Each eval compares its methods in one process, back to back on the same prompts.
set -euo pipefail
cd "$(dirname "$0")/../.."
SPECDEC=${SPECDEC:-.venv/bin/specdec}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/results/trees/first-head}
mkdir -p "$OUT"

# the verifier's cost per pass against the tokens in it (what tree="auto" sizes trees by)
"$PY" benchmarks/tree_cost.py --context 256 --repeats 5 --json | tee "$OUT/tree_cost_cpu.txt"

# greedy Spec-Bench, 5 per group, 128 new tokens, the shipped head: chain (k=5) against the auto-sized tree
"$SPECDEC" eval --per-group 5 --max-new-tokens 128 -k 5 --tree none auto --overwrite --json \
    --draft eagle --baselines hf --out "$OUT/eval-greedy"

# sampling at temperature 0.7, seeded: chain against auto
"$SPECDEC" eval --per-group 5 --max-new-tokens 128 -k 5 --tree none auto --overwrite --json --do-sample \
    --temperature 0.7 --seed 0 --draft eagle --baselines hf --out "$OUT/eval-sampling"

# every tree kind at once (static, dynamic, auto against the chain)
"$SPECDEC" eval --per-group 5 --max-new-tokens 128 -k 5 --tree none static dynamic auto --overwrite --json \
    --draft eagle --baselines hf,hf-compiled,hf-prompt-lookup --out "$OUT/eval-greedy-trees"
