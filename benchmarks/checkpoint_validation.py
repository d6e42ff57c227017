"""Validation of a train-head run's checkpoints mid-way (issue 24's learning curve, one-pass points).

    python benchmarks/checkpoint_validation.py --run runs/head-v2 --checkpoints runs/curve-onepass/step-100 \\
        runs/curve-onepass/step-400 --heads-out runs/curve-heads --out benchmarks/results/heads/onepass.json

Each checkpoint (full or packed, ``specdec.training.portable``) is exported as a head directory under
``--heads-out`` (score it on Spec-Bench with ``benchmarks/spec_bench_forced.py --heads DIR``) and teacher-forced on
the run's own validation split (train-head's held-out prompts, ``--heldout`` as the run used, read from its cached
features): top-1 per training-time step, coverage and the chain estimate ``tokens_per_pass``, exactly as the run
validates at the end of an epoch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, required=True, help="the train-head --out whose features and split to use")
    p.add_argument("--checkpoints", type=Path, nargs="+", required=True)
    p.add_argument("--heads-out", type=Path, required=True)
    p.add_argument("--heldout", type=float, default=0.03)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    from specdec.heads.checkpoint import load_head
    from specdec.models import load_model
    from specdec.training.checkpoints import trainer_state
    from specdec.training.features import FeatureSet
    from specdec.training.portable import export_head
    from specdec.training.prompts import heldout_split
    from specdec.training.train import validate

    model, _ = load_model("smollm2")
    features_dir = args.run / "work" / "features"
    ids = json.loads((features_dir / "index.json").read_text())["samples"]
    features = FeatureSet(sorted(features_dir.glob("features-*.safetensors")))
    held, _ = heldout_split(ids, args.heldout)
    embed, target_head = model.get_input_embeddings(), model.get_output_embeddings()
    results = {}
    for checkpoint in args.checkpoints:
        step = trainer_state(checkpoint)["step"]
        head = load_head(export_head(checkpoint, model, args.heads_out / f"step-{step}"), model)
        # as the run validates at an epoch's end: the head in fp32, outside autocast (bf16-rounded weights here)
        metrics = validate(head, features, held, embed, target_head, args.steps, args.batch_tokens, model.device)
        results[f"step-{step}"] = {"step": step, **metrics}
        print(f"step {step}: validation top-1 per step {metrics['top1']}, coverage {metrics['coverage']:.3f}, "
              f"~{metrics['tokens_per_pass']:.2f} tokens per pass", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": "python benchmarks/checkpoint_validation.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if v is not None), "validation_samples": len(held), "checkpoints": results},
            indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
