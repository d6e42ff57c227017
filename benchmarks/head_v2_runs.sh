#!/usr/bin/env bash
# The runs behind issue 24's targets, for a trained head (default: the head-v2 run's best so far). Run on a quiet
# machine (pause background jobs: kill -STOP); each eval compares its methods in one process, back to back.
#
#   bash benchmarks/head_v2_runs.sh [HEAD_DIR]            # OUT=benchmarks/results/issue24/head-v2 by default
#
# 1. teacher forcing on the held-out split train-head never trained on (the same split: training.prompts.heldout_split
#    over the run's samples, --heldout 0.03), against the online chain on the same responses (specdec head-report);
# 2. the draft step against a verifier step (16k draft vocabulary);
# 3. Spec-Bench greedy, 5 per group, 128 new tokens: the head as a chain (k=5) and as tree=auto, composite with the
#    head, the shipped head, self:int8 and composite:int8, all against HF generate in the same run;
# 4. the same at temperature 0.7, seeded (the head chain and tree, self:int8).
set -euo pipefail
cd "$(dirname "$0")/.."
SPECDEC=${SPECDEC:-.venv/bin/specdec}
PY=${PY:-.venv/bin/python}
RUN=${RUN:-runs/head-v2}
HEAD=${1:-$RUN/checkpoints/best}
[ -f "$RUN/model.safetensors" ] && [ $# -eq 0 ] && HEAD=$RUN  # the finished head
OUT=${OUT:-benchmarks/results/issue24/head-v2}
mkdir -p "$OUT"
echo "head: $HEAD" | tee "$OUT/head.txt"

"$PY" - "$RUN/work/samples.jsonl" "$OUT/heldout.jsonl" <<'PY'
import json, sys
from specdec.training.prompts import heldout_split
rows = [json.loads(line) for line in open(sys.argv[1])]
rows = [r for r in rows if "response_ids" in r]
held, _ = heldout_split([r["id"] for r in rows], 0.03)
greedy = [rows[i] for i in held if "@t" not in rows[i]["id"]]  # the greedy responses: what a greedy loop writes
with open(sys.argv[2], "w") as f:
    for r in greedy:
        f.write(json.dumps(r) + "\n")
print(f"held-out greedy responses: {len(greedy)} of {len(held)} held-out samples", file=sys.stderr)
PY
"$SPECDEC" head-report --head "$HEAD" --data "$OUT/heldout.jsonl" --limit 60 --steps 5 -k 5 --json | tail -1 > "$OUT/head_report.json"
"$PY" benchmarks/head_cost.py --draft "eagle:$HEAD" --context 300 -k 5 --repeats 50 --json | tail -1 > "$OUT/head_cost.json"

"$SPECDEC" eval --per-group 5 --max-new-tokens 128 -k 5 --tree none auto --overwrite --json \
    --draft "eagle:$HEAD" "composite:eagle:$HEAD" eagle self:int8 composite:int8 --baselines hf --out "$OUT/eval-greedy"
"$SPECDEC" eval --per-group 5 --max-new-tokens 128 -k 5 --tree none auto --overwrite --json --do-sample \
    --temperature 0.7 --seed 0 --draft "eagle:$HEAD" self:int8 --baselines hf --out "$OUT/eval-sampling"
