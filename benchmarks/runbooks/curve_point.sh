#!/usr/bin/env bash
# One point of issue 24's learning curve (BENCHMARKS.md section 17): validation on the run's held-out split,
# Spec-Bench teacher forced, then the real greedy chain over all 30 Spec-Bench rows. Stop the training first
# (kill -STOP its pid): two jobs on two cores slow both several-fold.
#   bash benchmarks/runbooks/curve_point.sh 800 [runs/curve-onepass]   # a step kept by benchmarks/runbooks/keep_checkpoints.sh
#   bash benchmarks/runbooks/curve_point.sh epoch-2 --best             # the run's checkpoints/best at an epoch's end;
#                                                             # its validation is the run's own epoch-end line
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
out=benchmarks/results/heads/curve-onepass
responses=benchmarks/results/heads/spec-bench-forced/spec_bench_responses.jsonl
mkdir -p "$out" runs/curve-heads
if [ "${2:-}" = "--best" ]; then
    name=$1
    rm -rf "runs/curve-heads/$name" && cp -r runs/head-v2/checkpoints/best "runs/curve-heads/$name"
else
    name=step-$1 kept=${2:-runs/curve-onepass}
    $PY benchmarks/checkpoint_validation.py --run runs/head-v2 --checkpoints "$kept/$name" \
        --heads-out runs/curve-heads --out "$out/validation-$name.json"
fi
$PY benchmarks/spec_bench_forced.py --heads "runs/curve-heads/$name" --responses "$responses" \
    --out "$out/spec_bench_forced-$name.json"
.venv/bin/specdec head-report --head "runs/curve-heads/$name" --data "$responses" --steps 5 -k 5 --limit 0 \
    --json > "$out/head_report_specbench30-$name.json"
echo "curve point $name done $(date -u)"
