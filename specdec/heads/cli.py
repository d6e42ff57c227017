"""``specdec train-head``: train an EAGLE-style draft head for a model on a CPU or GPU (resumable)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_train_head_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="the verifier: 'smollm2' (embedded) or a local directory / .gguf")
    p.add_argument("--data", required=True, help="a .jsonl file or a directory of them: {'id', 'group', 'prompt'} per line")
    p.add_argument("--out", required=True, help="directory for the head (work files go to OUT/work; rerun to resume)")
    p.add_argument("--kind", choices=("eagle3", "eagle"), default="eagle3", help="head layout to train (default eagle3)")
    p.add_argument("--per-group", type=int, default=350, help="at most this many prompts per group (0: all)")
    p.add_argument("--self-prompts", type=int, default=250, help="prompts the verifier writes itself (0: none)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="length of the responses the verifier writes")
    p.add_argument("--gen-batch", type=int, default=48)
    p.add_argument("--draft-vocab", type=int, default=4096, help="EAGLE-3 draft vocabulary size (0: the full vocabulary)")
    p.add_argument("--epochs", type=float, default=9.0)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ttt-steps", type=int, default=3, help="EAGLE-3 training-time-test steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=200, help="checkpoint every N steps")
    p.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), default="no")
    p.add_argument("--heldout", type=float, default=0.03, help="share of samples held out from training")
    p.add_argument("--eval-prompts", type=int, default=12)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def run_train_head(args: argparse.Namespace) -> int:
    import torch

    from specdec.heads.pipeline import PipelineConfig, run_pipeline
    from specdec.heads.prompts import TrainDataError, read_train_prompts
    from specdec.heads.train import TrainConfig
    from specdec.models import ModelNotFoundError, load_model, resolve_model_source

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"specdec train-head: error: --out {args.out!r} is a file, not a directory", file=sys.stderr)
        return 2
    for name in ("per_group", "self_prompts", "max_new_tokens", "gen_batch", "batch_tokens", "save_every"):
        if getattr(args, name) < 0 or (name not in ("per_group", "self_prompts") and getattr(args, name) == 0):
            print(f"specdec train-head: error: --{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    if not 0 < args.heldout < 1 or args.epochs <= 0:
        print("specdec train-head: error: --heldout must be in (0, 1) and --epochs positive", file=sys.stderr)
        return 2
    try:
        read_train_prompts(args.data)  # a bad data path fails before the model loads
        resolve_model_source(args.model)
    except (TrainDataError, ModelNotFoundError) as e:
        print(f"specdec train-head: error: {e}", file=sys.stderr)
        return 2
    from accelerate import PartialState

    # under `accelerate launch` each process takes its own GPU
    device = args.device or (str(PartialState().device) if torch.cuda.is_available() else "cpu")
    model, tokenizer = load_model(args.model, device=device)
    config = PipelineConfig(
        per_group=args.per_group or None, self_prompts=args.self_prompts, max_new_tokens=args.max_new_tokens,
        gen_batch=args.gen_batch, heldout=args.heldout, eval_prompts=args.eval_prompts,
        train=TrainConfig(kind=args.kind, draft_vocab=args.draft_vocab or None, epochs=args.epochs,
                          batch_tokens=args.batch_tokens, lr=args.lr, ttt_steps=args.ttt_steps, seed=args.seed,
                          save_every=args.save_every, mixed_precision=args.mixed_precision))
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else print
    command = "specdec " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["train-head"] else ""
    result = run_pipeline(model, tokenizer, args.data, out, config, model_name=args.model, command=command,
                          progress=not args.json, log=log)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"head saved to {result['out']}: {result['samples']} samples, {result['tokens']} tokens, "
              f"{result['steps']} steps, {result['seconds']:.0f} s; held-out acceptance {result['heldout_acceptance']:.3f}, "
              f"mean accepted length {result['mean_accepted_length']:.2f}")
    return 0
