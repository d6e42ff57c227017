#!/usr/bin/env bash
# The Spec-Bench runs behind BENCHMARKS.md sections 2-4 and the README's results table.
# Each run compares its methods in one process, back to back on the same prompts (order rotated per
# prompt, one untimed warm-up each; hf-compiled and --compile-drafter compile before any timed call).
# Run on a quiet machine: another torch process on the same cores distorts every ratio.
# About 16 + 15 + 6 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
SPECDEC=${SPECDEC:-.venv/bin/specdec}
OUT=${OUT:-benchmarks/results}
COMMON=(--per-group 5 --max-new-tokens 128 -k 6 --compile-drafter --overwrite --json)

# 2. greedy: grid-free drafters (self:int8, self:int4:g128+head8, prompt-lookup, composite:int8) and the
#    grid-bound int4 (groups of 32, the embedded GGUF's own grid) for reference
"$SPECDEC" eval "${COMMON[@]}" --draft self:int8 self:int4:g128+head8 prompt-lookup composite:int8 composite:int4+head8 \
    --baselines hf,hf-compiled,hf-assisted,hf-prompt-lookup --out "$OUT/drafters/eval-greedy"

# 3. sampling, temperature 0.7, seeded (prompt i uses seed + i)
"$SPECDEC" eval "${COMMON[@]}" --do-sample --temperature 0.7 --seed 0 \
    --draft self:int8 prompt-lookup composite:int8 composite:int4+head8 \
    --baselines hf,hf-compiled,hf-assisted,hf-prompt-lookup --out "$OUT/drafters/eval-sampling"

# 4. adaptive draft length against fixed k, with a strong (self:int8) and a weak (layer-skip:20) drafter
"$SPECDEC" eval --per-group 2 --max-new-tokens 128 -k 6 --overwrite --json --adaptive \
    --draft self:int8 layer-skip:20 --baselines hf --out "$OUT/adaptive/eval-greedy"
