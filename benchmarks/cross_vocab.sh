#!/usr/bin/env bash
# Cross-vocabulary drafting (issue 61): Gemma 3 270M verifying with SmolLM2-135M drafting, and the reverse, on
# Spec-Bench (2 prompts a group, 64 new tokens, greedy): specdec against transformers' hf-uag at batch 1, and
# specdec at batch 4 (which transformers refuses) against its own batch 1. Then sampling at T=0.7 (TLI against
# transformers' USD). Resumable: each run resumes its --out. Run on a quiet machine:
#   nohup bash benchmarks/cross_vocab.sh > /tmp/cross_vocab.log 2>&1 &
set -euo pipefail
cd "$(dirname "$0")/.."
: "${SPECDEC_SPEC_BENCH:=../shared/data/spec_bench/question.jsonl}"
export SPECDEC_SPEC_BENCH
OUT=benchmarks/results/cross-vocab
COMMON=(--per-group 2 --max-new-tokens 64 -k 4 --no-progress)
for pair in "gemma3-270m smollm2" "smollm2 gemma3-270m"; do
  set -- $pair
  name="$1-from-$2"
  python -m specdec.eval --model "$1" --draft "$2" --baselines hf-uag "${COMMON[@]}" --out "$OUT/$name-b1"
  python -m specdec.eval --model "$1" --draft "$2" --baselines hf "${COMMON[@]}" --batch-size 4 --out "$OUT/$name-b4"
done
python -m specdec.eval --model gemma3-270m --draft smollm2 --baselines hf-uag "${COMMON[@]}" --do-sample \
  --temperature 0.7 --out "$OUT/gemma3-270m-from-smollm2-t07"
# Trees under TLI (Gemma verifying, SmolLM2 drafting): the default static tree beside the chain, greedy against hf-uag,
# then at T=0.7 under both tree rules (a static tree draws its children there).
python -m specdec.eval --model gemma3-270m --draft smollm2 --baselines hf-uag "${COMMON[@]}" --tree none static \
  --out "$OUT/gemma3-270m-from-smollm2-trees"
python -m specdec.eval --model gemma3-270m --draft smollm2 --baselines hf-uag "${COMMON[@]}" --tree none static \
  --verify token traversal --do-sample --temperature 0.7 --out "$OUT/gemma3-270m-from-smollm2-trees-t07"
