#!/bin/bash
# Copy a train-head run's checkpoints at chosen steps before the run rotates them away (it keeps the newest two):
# the learning curve's one-pass points (a head after ~0.25 M or ~1 M training tokens seen once).
#   nohup bash benchmarks/runbooks/keep_checkpoints.sh runs/head-v2 runs/curve-onepass 50 100 200 400 800 &
# Each copy is made whole (a temporary name, then a rename); the script ends once the last step is kept.
set -u
out=$1 dest=$2
shift 2
mkdir -p "$dest"
while true; do
  for s in "$@"; do
    src=$out/checkpoints/step-$s
    if [ -f "$src/trainer.json" ] && [ ! -d "$dest/step-$s" ]; then
      cp -r "$src" "$dest/step-$s.tmp" && mv "$dest/step-$s.tmp" "$dest/step-$s" && echo "kept step $s $(date -u)"
    fi
  done
  [ -d "$dest/step-${!#}" ] && break
  sleep 20
done
