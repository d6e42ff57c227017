#!/usr/bin/env bash
# Issue 24's head-v2 run on this CPU, from whatever this machine still has (data/smollm2-head-v2/README.md):
# the data from git when runs/ was lost, the newest packed checkpoint from git's history when no checkpoint is
# left, then train-head (features, then training; each resumes). Run it in the background:
#   nohup bash benchmarks/runbooks/head_v2_train.sh > runs/head-v2.log 2>&1 &
# Before the session ends: bash benchmarks/runbooks/head_v2_train.sh --pack (then commit, as the README says).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=runs/head-v2 DATA=data/smollm2-head-v2 PY=.venv/bin/python
if [ "${1:-}" = "--pack" ]; then
    exec $PY -m specdec.training.portable pack $RUN $DATA/checkpoint
fi
mkdir -p $RUN/work
for f in self_prompts samples; do
    [ -s $RUN/work/$f.jsonl ] || gunzip -c $DATA/$f.jsonl.gz > $RUN/work/$f.jsonl
done
[ -s $RUN/work/settings.json ] || cp $DATA/settings.json $RUN/work/settings.json
if ! ls -d $RUN/checkpoints/step-* >/dev/null 2>&1; then
    sha=$(git log --diff-filter=A -1 --format=%H -- $DATA/checkpoint/trainer.json)
    if [ -n "$sha" ]; then
        mkdir -p runs/head-v2-pack
        for f in model.safetensors trainer.json; do git show "$sha:$DATA/checkpoint/$f" > runs/head-v2-pack/$f; done
        $PY -m specdec.training.portable unpack runs/head-v2-pack $RUN
    fi
fi
exec nice -n 5 .venv/bin/specdec train-head --data ../shared/data/train_prompts --out $RUN --per-group 3000 \
    --self-prompts 10000 --max-new-tokens 512 --gen-batch 64 --gen-dtype bfloat16 --sampled 0.25 \
    --feature-dtype bfloat16 --draft-vocab 16384 --ttt-steps 5 --lr 2e-3 --warmup 30 --epochs 3 --patience 2 \
    --mixed-precision bf16 --heldout 0.03 --save-every 50 --lookup-weight 0.1 --json
