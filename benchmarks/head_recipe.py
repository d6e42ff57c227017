"""Choosing the head's training recipe by measurement (issue 24): train variants on nested subsets of the
verifier's responses and compare them on one fixed validation split they never train on.

    python benchmarks/head_recipe.py --samples runs/head-v2/work/samples.jsonl --work runs/recipe \\
        --budget 200000 --variant lr2e-3:lr=2e-3 --variant lr5e-4:lr=5e-4 --variant lr5e-4-noise:lr=5e-4,noise=0.2

- The validation split is train-head's own (:func:`~specdec.training.prompts.heldout_split`: a fixed share of
  the *prompts*, by a hash of the id, with all their responses), capped at ``--val-samples``; it never depends on
  the budget, and with ``--val-share`` equal to train-head's ``--heldout`` it is the held-out set of a train-head
  run on the same data.
- The training subset of a budget is a prefix of one fixed order of the other samples, so smaller budgets are
  subsets of larger ones (a learning curve compares data sizes, not draws).
- Features are extracted once per budget (``WORK/features-BUDGET``), or read from a train-head run's own
  (``--features OUT/work/features``: no extraction), and every variant trains from them, each in
  ``WORK/BUDGET/NAME`` (resumable: rerun the command). Results go to ``WORK/results.json`` (merged per variant):
  the validation numbers of every epoch, the best epoch and the training time.

Variant settings (``name:key=value,...``) are :class:`~specdec.training.train.TrainConfig` fields: lr, epochs,
warmup, noise, ttt_steps, draft_vocab, batch_tokens, patience, mixed_precision, seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import time
from pathlib import Path
from typing import Any

import torch

from specdec.heads.config import HeadConfig
from specdec.models import load_model
from specdec.training.features import FeatureSet, extract_features
from specdec.training.prompts import heldout_split, stable_unit
from specdec.training.train import TrainConfig, train_head

DEFAULTS = dict(epochs=6.0, warmup=30, ttt_steps=5, draft_vocab=8192, batch_tokens=4096, patience=2,
                mixed_precision="bf16", lr=5e-4, noise=0.0)


def read_samples(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if not r.get("skipped") and r.get("response_ids")]


def split(samples: list[dict[str, Any]], val_share: float, val_samples: int
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(training pool in a fixed order, validation samples)``: train-head's held-out split."""
    held, train = heldout_split([s["id"] for s in samples], val_share)
    val = sorted((samples[i] for i in held), key=lambda s: stable_unit("v:" + s["id"]))
    pool = sorted((samples[i] for i in train), key=lambda s: stable_unit("t:" + s["id"]))
    return pool, val[:val_samples]


def take(pool: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The prefix of ``pool`` holding ``budget`` response tokens (all of it when the pool is smaller)."""
    out, tokens = [], 0
    for s in pool:
        if tokens >= budget:
            break
        out.append(s)
        tokens += len(s["response_ids"])
    return out


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = text.partition(":")
    # each setting parsed as its TrainConfig field is typed ("int", "float", "int | None", "str")
    types = {f.name: {"int": int, "float": float}.get(str(f.type).split()[0], str) for f in dataclasses.fields(TrainConfig)}
    settings = dict(DEFAULTS)
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"variant {name}: unknown setting {key!r} (TrainConfig fields: {', '.join(types)})")
        settings[key] = int(float(value)) if types[key] is int else types[key](value)
    return name, settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=Path, required=True, help="samples.jsonl(.gz) as train-head writes it")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--budget", type=int, required=True, help="training response tokens")
    p.add_argument("--variant", action="append", required=True, help="NAME:key=value,...")
    p.add_argument("--features", type=Path, default=None,
                   help="a train-head run's feature directory (OUT/work/features) holding every sample used")
    p.add_argument("--val-share", type=float, default=0.03, help="train-head's --heldout")
    p.add_argument("--val-samples", type=int, default=10 ** 9)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    pool, val = split(read_samples(args.samples), args.val_share, args.val_samples)
    train = take(pool, args.budget)
    tokens = sum(len(s["response_ids"]) for s in train)
    print(f"pool {len(pool)} samples; training {len(train)} samples ({tokens} response tokens); validation "
          f"{len(val)} samples ({sum(len(s['response_ids']) for s in val)} response tokens)", flush=True)
    model, _ = load_model("smollm2", device=args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    head_config = HeadConfig.for_verifier(model.config, "eagle3")
    if args.features:  # a train-head run's features: pick the samples by id
        recorded = json.loads((args.features / "index.json").read_text())
        if list(recorded["layers"]) != list(head_config.aux_layers):
            raise SystemExit(f"{args.features} holds features of layers {recorded['layers']}")
        features = FeatureSet(sorted(args.features.glob("features-*.safetensors")))  # complete shards only
        where = {sample_id: i for i, sample_id in enumerate(recorded["samples"]) if i < len(features)}
        missing = [s["id"] for s in train + val if s["id"] not in where]
        if missing:
            raise SystemExit(f"{args.features} lacks {len(missing)} of the samples (e.g. {missing[:3]}): extract them")
        train_idx, val_idx = [where[s["id"]] for s in train], [where[s["id"]] for s in val]
    else:
        samples = train + val
        with torch.no_grad():
            paths = extract_features(model, samples, args.work / f"features-{args.budget}", head_config.aux_layers)
        features = FeatureSet(paths)
        train_idx, val_idx = list(range(len(train))), list(range(len(train), len(samples)))
    results_path = args.work / "results.json"
    for text in args.variant:
        name, settings = parse_variant(text)
        config = TrainConfig(**settings)
        out = args.work / str(args.budget) / name
        started = time.perf_counter()
        head, summary = train_head(model, features, train_idx, out, config,
                                   HeadConfig.for_verifier(model.config, "eagle3"), val_idx=val_idx)
        results = json.loads(results_path.read_text()) if results_path.is_file() else {}
        results[f"{args.budget}/{name}"] = {
            "budget": args.budget, "train_samples": len(train), "train_tokens": tokens, "val_samples": len(val),
            "val_share": args.val_share, "val_tokens": sum(len(s["response_ids"]) for s in val),
            "settings": settings, "validation": summary["validation"], "best": summary["best"],
            "steps": summary["steps"], "seconds": round(summary["seconds"], 1),
            "this_run_seconds": round(time.perf_counter() - started, 1), "stopped_early": summary["stopped_early"],
            "head": str(out / "checkpoints" / "best"),
            "command": "python benchmarks/head_recipe.py " + " ".join(
                f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "variant") + f" --variant {text}"}
        args.work.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps(results, indent=1))
        best = summary["best"] or {}
        print(f"{args.budget}/{name}: best epoch {best.get('epoch')} top-1 {best.get('top1')} coverage "
              f"{best.get('coverage')} tokens/pass {best.get('tokens_per_pass')}", flush=True)


if __name__ == "__main__":
    main()
