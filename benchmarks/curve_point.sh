#!/usr/bin/env bash
# One point of issue 24's learning curve (BENCHMARKS.md section 17) from a kept head-v2 checkpoint
# (benchmarks/keep_checkpoints.sh): validation on the run's held-out split, Spec-Bench teacher forced, then the real
# greedy chain over all 30 Spec-Bench rows. Stop the training first (kill -STOP its pid): two jobs on two cores
# slow both several-fold.
#   bash benchmarks/curve_point.sh 800 [runs/curve-onepass]
set -euo pipefail
cd "$(dirname "$0")/.."
step=$1 kept=${2:-runs/curve-onepass}
PY=.venv/bin/python
out=benchmarks/results/issue24/curve-onepass
responses=benchmarks/results/issue24/spec-bench-forced/spec_bench_responses.jsonl
mkdir -p "$out"
$PY benchmarks/checkpoint_validation.py --run runs/head-v2 --checkpoints "$kept/step-$step" \
    --heads-out runs/curve-heads --out "$out/validation-step-$step.json"
$PY benchmarks/spec_bench_forced.py --heads "runs/curve-heads/step-$step" --responses "$responses" \
    --out "$out/spec_bench_forced-step-$step.json"
.venv/bin/specdec head-report --head "runs/curve-heads/step-$step" --data "$responses" --steps 5 -k 5 --limit 0 \
    --json > "$out/head_report_specbench30-step-$step.json"
echo "curve point $step done $(date -u)"
