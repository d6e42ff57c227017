#!/usr/bin/env bash
# Issue 24: finish the head-v2 run and measure the finished head, unattended, each stage resuming:
#   nohup bash benchmarks/runbooks/head_v2_finish.sh > runs/head-v2-finish.log 2>&1 &
# 1. training to its end (benchmarks/runbooks/head_v2_train.sh; the head is written to runs/head-v2 with its card),
# 2. the epoch-3 point of the learning curve (benchmarks/runbooks/curve_point.sh epoch-3 --best),
# 3. Spec-Bench speed, greedy then sampled at T=0.7, one run each: the finished head against `hf`, the shipped
#    head, `self:int8` and the composites (specdec eval resumes an interrupted --out by itself).
# Nothing else may run beside it: the speed tables are timed.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=runs/head-v2 OUT=benchmarks/results/heads/head-v2-final
[ -s $RUN/training.json ] || bash benchmarks/runbooks/head_v2_train.sh
echo "head written $(date -u)"
[ -s benchmarks/results/heads/curve-onepass/head_report_specbench30-epoch-3.json ] \
    || bash benchmarks/runbooks/curve_point.sh epoch-3 --best
drafts=(eagle:$RUN composite:eagle:$RUN eagle self:int8 composite:int8)
common=(--per-group 5 --max-new-tokens 128 -k 5 --tree none auto --baselines hf --no-progress)
.venv/bin/specdec eval "${common[@]}" --draft "${drafts[@]}" --out $OUT/eval-greedy
echo "greedy table done $(date -u)"
.venv/bin/specdec eval "${common[@]}" --draft "${drafts[@]}" --do-sample --temperature 0.7 --seed 0 \
    --out $OUT/eval-sampling
echo "sampling table done $(date -u)"
