#!/usr/bin/env bash
# The runs behind BENCHMARKS.md section 7 (the shipped EAGLE-3 head). Run on a quiet machine.
# Each eval compares its methods in one process, back to back on the same prompts.
set -euo pipefail
cd "$(dirname "$0")/../.."
SPECDEC=${SPECDEC:-.venv/bin/specdec}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-benchmarks/results/heads/first-head}
mkdir -p "$OUT"

# draft step of the head against a verifier step (and a verify pass over k + 1 tokens)
"$PY" benchmarks/head_cost.py --draft eagle --context 300 -k 5 --repeats 50 --json | tee "$OUT/head_cost.json"

# greedy Spec-Bench, 5 per group, 128 new tokens: the head at k=5 (the issue's protocol) and k=2, against
# HF generate, HF compiled and HF prompt lookup (hf-assisted needs a causal LM drafter; a head is not one)
"$SPECDEC" eval --per-group 5 --max-new-tokens 128 -k 5 2 --overwrite --json --draft eagle \
    --baselines hf,hf-compiled,hf-prompt-lookup --out "$OUT/eval-greedy"

# sampling at temperature 0.7, seeded
"$SPECDEC" eval --per-group 5 --max-new-tokens 128 -k 5 --overwrite --json --do-sample --temperature 0.7 --seed 0 \
    --draft eagle --baselines hf --out "$OUT/eval-sampling"
