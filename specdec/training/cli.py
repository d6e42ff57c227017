"""``specdec train-head``: train an EAGLE-style draft head for a model on a CPU or GPU (resumable)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def add_train_head_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="the verifier: 'smollm2' (embedded) or a local directory / .gguf")
    p.add_argument("--data", required=True, help="a .jsonl file or a directory of them: {'id', 'group', 'prompt'} per line")
    p.add_argument("--out", required=True, help="directory for the head (work files go to OUT/work; rerun to resume)")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh: delete what an earlier run wrote in OUT (a rerun with other settings is refused without it)")
    p.add_argument("--kind", choices=("eagle3", "eagle", "dflash"), default="eagle3",
                   help="head layout to train (default eagle3; dflash: a DFlash block drafter, docs/dflash.md)")
    p.add_argument("--block-size", type=int, default=8, help="--kind dflash: the block (the newest token and masks)")
    p.add_argument("--dflash-layers", type=int, default=1, help="--kind dflash: the drafter's decoder layers")
    p.add_argument("--per-group", type=int, default=350, help="at most this many prompts per group (0: all)")
    p.add_argument("--self-prompts", type=int, default=250, help="prompts the verifier writes itself (0: none)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="length of the responses the verifier writes")
    p.add_argument("--gen-batch", type=int, default=48)
    p.add_argument("--gen-dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="write prompts and responses with a copy of the verifier in this dtype (bfloat16: about 2x "
                        "faster on CPUs with AMX); features and targets still come from the verifier as loaded")
    p.add_argument("--feature-dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="compute the training features and targets with a copy of the verifier in this dtype "
                        "(bfloat16: about 3x faster on CPUs with AMX, argmax equal to fp32's at ~99%% of positions); "
                        "default: the verifier as loaded")
    p.add_argument("--sampled", type=float, default=0.0,
                   help="share of prompts that also get a sampled response (T 0.7 / 0.85 / 1.0 in turn)")
    p.add_argument("--stop-after", choices=("data", "features"), default=None,
                   help="make the stages up to this one and stop (data at scale over several sessions)")
    p.add_argument("--draft-vocab", type=int, default=4096, help="EAGLE-3 draft vocabulary size (0: the full vocabulary)")
    p.add_argument("--epochs", type=float, default=9.0)
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ttt-steps", type=int, default=3, help="EAGLE-3 training-time-test steps")
    p.add_argument("--warmup", type=int, default=50, help="optimizer steps of linear learning-rate warm-up")
    p.add_argument("--noise", type=float, default=0.0, help="uniform noise on the verifier features, times their RMS")
    p.add_argument("--prompt-weight", type=float, default=0.0,
                   help="score the prompt slots too, at this weight against a response slot (fixed text with the "
                        "verifier's soft targets; 0: responses only)")
    p.add_argument("--lookup-weight", type=float, default=1.0,
                   help="weight of response targets that prompt lookup drafts right (below 1: a head for composite "
                        "drafters, which draft those by lookup; 1: every target alike)")
    p.add_argument("--patience", type=int, default=0,
                   help="stop after this many epochs without a better validation score (0: every epoch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=200, help="checkpoint every N steps")
    p.add_argument("--mixed-precision", choices=("no", "bf16", "fp16"), default="no")
    p.add_argument("--heldout", type=float, default=0.03,
                   help="share of prompts held out from training, with all their responses (a fixed hash of the id)")
    p.add_argument("--eval-prompts", type=int, default=12)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def _error(message: str) -> int:
    """One line on stderr, as the other specdec commands print theirs; exit status 2."""
    print(f"specdec train-head: error: {message}", file=sys.stderr)
    return 2


def _check_numbers(args: argparse.Namespace) -> str | None:
    """What is wrong with the numeric options, in one line (None: nothing)."""
    if args.block_size < 2:
        return f"--block-size must be at least 2 (the newest token and one mask), got {args.block_size}"
    for name in ("per_group", "self_prompts", "max_new_tokens", "gen_batch", "batch_tokens", "save_every", "ttt_steps",
                 "eval_prompts", "draft_vocab", "warmup", "patience", "dflash_layers"):
        value, flag = getattr(args, name), "--" + name.replace("_", "-")
        if value < 0 or (value == 0 and name not in ("per_group", "self_prompts", "eval_prompts", "draft_vocab",
                                                     "patience")):
            zero = {"per_group": " (0: all)", "self_prompts": " (0: none)", "draft_vocab": " (0: the full vocabulary)",
                    "eval_prompts": "", "patience": " (0: every epoch)"}
            return f"{flag} must be {'>= 0' + zero[name] if name in zero else 'positive'}, got {value}"
    if args.noise < 0:
        return f"--noise must be >= 0, got {args.noise:g}"
    if not args.prompt_weight >= 0:
        return f"--prompt-weight must be >= 0, got {args.prompt_weight:g}"
    if not 0 <= args.lookup_weight <= 1:
        return f"--lookup-weight must be in [0, 1], got {args.lookup_weight:g}"
    if not 0 <= args.sampled <= 1:
        return f"--sampled must be in [0, 1], got {args.sampled:g}"
    if not 0 < args.heldout < 1:
        return f"--heldout must be in (0, 1), got {args.heldout:g}"
    if not args.epochs > 0 or not args.lr > 0:
        return f"--epochs and --lr must be positive, got {args.epochs:g} and {args.lr:g}"
    return None


def _check_out(out: Path) -> str | None:
    """Why ``--out`` cannot be a directory this run writes to (None: it can); leaves nothing behind."""
    if out.exists() and not out.is_dir():
        return f"--out {str(out)!r} is a file, not a directory"
    probe = out
    while not probe.exists():  # the nearest existing ancestor is where the directory would be made
        probe = probe.parent
    if not probe.is_dir():
        return f"cannot create --out {str(out)!r}: {str(probe)!r} is a file, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".specdec-probe-", dir=probe))
    except OSError as e:
        return f"cannot write to --out {str(out)!r}: {str(probe)!r} is not writable ({e.strerror or e})"
    return None


def run_train_head(args: argparse.Namespace) -> int:
    """``specdec train-head``: every check that needs no model first (one-line errors, exit status 2), then
    the pipeline under the lock of ``--out``."""
    import torch

    from specdec.errors import SpecdecError
    from specdec.models import resolve_model_source
    from specdec.training.pipeline import PipelineConfig, check_settings, lock_out, run_pipeline, stage_settings
    from specdec.training.prompts import balance, read_train_prompts
    from specdec.training.train import TrainConfig
    from specdec.user_input import DeviceError, check_device

    out = Path(args.out).expanduser()
    problem = _check_numbers(args) or _check_out(out)
    if problem:
        return _error(problem)
    try:
        prompts = read_train_prompts(args.data)  # a bad data path fails before the model loads
        resolve_model_source(args.model)
        if args.device is not None:
            check_device(args.device)
    except DeviceError as e:
        return _error(f"--device {e}")
    except SpecdecError as e:  # bad --data, a --model that is not local
        return _error(str(e))
    usable = len(balance(prompts, args.per_group or None, seed=args.seed)) + args.self_prompts
    if usable < 2:
        return _error(f"{args.data} gives {usable} prompt(s) (with --self-prompts {args.self_prompts}): training needs "
                      "at least 2, one of them held out to measure the head; add prompts or --self-prompts")
    config = PipelineConfig(
        per_group=args.per_group or None, self_prompts=args.self_prompts, max_new_tokens=args.max_new_tokens,
        gen_batch=args.gen_batch, heldout=args.heldout, eval_prompts=args.eval_prompts, gen_dtype=args.gen_dtype,
        feature_dtype=args.feature_dtype, sampled=args.sampled, stop_after=args.stop_after,
        train=TrainConfig(kind=args.kind, draft_vocab=args.draft_vocab or None, epochs=args.epochs,
                          batch_tokens=args.batch_tokens, lr=args.lr, ttt_steps=args.ttt_steps, seed=args.seed,
                          save_every=args.save_every, mixed_precision=args.mixed_precision, warmup=args.warmup,
                          noise=args.noise, patience=args.patience, prompt_weight=args.prompt_weight, lookup_weight=args.lookup_weight,
                          block_size=args.block_size, dflash_layers=args.dflash_layers))
    from accelerate import PartialState

    import specdec.models

    state = PartialState()
    try:
        # taken before the model loads, so a second run into the same --out stops at once
        with lock_out(out, enabled=state.is_main_process):
            if not args.overwrite:  # settings that differ without the model's identity: refused before it loads
                check_settings(out, stage_settings(config, prompts, args.model))
            # under `accelerate launch` each process takes its own GPU
            device = args.device or (str(state.device) if torch.cuda.is_available() else "cpu")
            model, tokenizer = specdec.models.load_model(args.model, device=device)
            log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.json else print
            command = "specdec " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["train-head"] else ""
            result = run_pipeline(model, tokenizer, args.data, out, config, model_name=args.model, command=command,
                                  progress=not args.json, log=log, overwrite=args.overwrite)
    except SpecdecError as e:  # a stale or busy --out, a model that cannot load, too few samples
        return _error(str(e))
    if not result:  # not the main process of an `accelerate launch`: the main one reports
        return 0
    if args.json:
        print(json.dumps(result))
    elif result.get("stopped_after"):
        print(f"stopped after {result['stopped_after']} in {result['out']}: {result['samples']} samples, "
              f"{result['tokens']} response tokens, {result['seconds']:.0f} s (rerun without --stop-after to go on)")
    else:
        print(f"head saved to {result['out']}: {result['samples']} samples, {result['tokens']} tokens, "
              f"{result['steps']} steps, {result['seconds']:.0f} s; held-out acceptance {result['heldout_acceptance']:.3f}, "
              f"mean accepted length {result['mean_accepted_length']:.2f}")
    return 0
