"""``specdec train-pard``: fine-tune a small causal LM into a PARD drafter (:mod:`specdec.training.pard`), resumable.

Data: JSON Lines rows with ``prompt_ids`` and ``response_ids`` (``specdec train-head``'s ``samples.jsonl``: the
verifier's own responses), ``input_ids``, or ``text``. The model is written to ``OUT/model`` with ``pard_token`` in
its config, ready for ``draft="pard:OUT/model"``, with a model card (``README.md``) and ``train_state.json``. A
checkpoint every ``--save-every`` steps (``OUT/checkpoint``) lets a killed run resume where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError


class TrainPardError(SpecdecError, ValueError):
    """Training data or settings ``specdec train-pard`` cannot use."""


def add_train_pard_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2", help="the model to fine-tune: 'smollm2' or a local model directory")
    p.add_argument("--data", required=True, help="JSONL: prompt_ids + response_ids (train-head's samples.jsonl), "
                                                 "input_ids, or text")
    p.add_argument("--out", required=True, help="output directory (resumes a run found there)")
    p.add_argument("--copies", type=int, default=8, help="the sequence and its masked copies: drafts up to this many "
                                                         "tokens a forward (PARD: 8)")
    p.add_argument("--mask-token", type=int, default=None, help="the mask token id (default: the vocabulary's last)")
    p.add_argument("--keep", type=float, default=0.7, help="COD: copy j keeps keep^j of its positions (PARD: 0.7)")
    p.add_argument("--floor", type=float, default=0.2, help="COD: and at least this share (PARD: 0.2)")
    p.add_argument("--max-len", type=int, default=512, help="tokens of a sequence kept (PARD: 512)")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    p.add_argument("--accumulate", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--lr", type=float, default=3e-5, help="peak learning rate (PARD: 3e-5), cosine after 3%% warm-up")
    p.add_argument("--save-every", type=int, default=50, help="steps between resumable checkpoints")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="stop after this much training time (a checkpoint and the model are written; rerun to go on)")
    p.add_argument("--seed", type=int, default=0)


def read_sequences(path: str | Path, tokenizer: Any, max_len: int) -> list[list[int]]:
    """Token sequences of the rows of ``path`` (see the module docstring), cut to ``max_len``; at least 3 tokens."""
    from specdec.prompts.files import json_rows

    rows = []
    for n, row in json_rows(path, "with prompt_ids + response_ids, input_ids or text"):
        if "prompt_ids" in row and "response_ids" in row:
            ids = list(row["prompt_ids"]) + list(row["response_ids"])
        elif "input_ids" in row:
            ids = list(row["input_ids"])
        elif "text" in row:
            ids = tokenizer(row["text"]).input_ids
        else:
            raise TrainPardError(f"{path}:{n}: a row needs prompt_ids + response_ids, input_ids or text")
        if len(ids) >= 3:
            rows.append(ids[:max_len])
    if not rows:
        raise TrainPardError(f"{path}: no sequence of 3 tokens or more")
    return rows


def _save(model: Any, tokenizer: Any, directory: Path, state: dict[str, Any], optimizer: Any = None,
          scheduler: Any = None) -> None:
    """Write the model (and the trainer's state) to ``directory`` through a temporary one: never half a checkpoint."""
    import torch

    from specdec.training.checkpoints import write_directory

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "train_state.json").write_text(json.dumps(state, indent=1))
        if optimizer is not None:
            torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optimizer.pt")

    write_directory(directory, write)


def _card(state: dict[str, Any], args: argparse.Namespace) -> str:
    losses = state["losses"]
    tail = losses[-50:]
    return (f"# PARD drafter trained by `specdec train-pard`\n\n"
            f"- base model: `{args.model}`; mask token {state['mask_token']} (`config.pard_token`)\n"
            f"- data: `{args.data}`, {state['sequences']} sequences cut to {args.max_len} tokens\n"
            f"- recipe: {args.copies} copies (the sequence and {args.copies - 1} masked), COD keep {args.keep}, floor "
            f"{args.floor}; AdamW lr {args.lr}, cosine after 3% warm-up, {args.accumulate} sequences a step\n"
            f"- steps: {state['step']} ({state['step'] * args.accumulate / state['sequences']:.2f} epochs), "
            f"{state['seconds'] / 3600:.2f} hours on this machine\n"
            f"- loss: first step {losses[0]:.3f}, mean of the last {len(tail)} steps {sum(tail) / len(tail):.3f}\n\n"
            f"Draft with it: `specdec generate --draft pard:{Path(args.out) / 'model'}` (`,quant=int8` for an int8 "
            "copy).\n")


def run_train_pard(args: argparse.Namespace) -> int:
    import torch
    from transformers import get_cosine_schedule_with_warmup

    from specdec.models import load_model
    from specdec.training.pard import pard_example, pard_loss

    if args.copies < 2 or not 0 < args.keep <= 1 or not 0 <= args.floor <= 1 or args.steps < 1 or args.accumulate < 1:
        raise TrainPardError("need --copies >= 2, 0 < --keep <= 1, 0 <= --floor <= 1, --steps and --accumulate >= 1")
    out = Path(args.out)
    checkpoint = out / "checkpoint"
    source = str(checkpoint) if (checkpoint / "train_state.json").is_file() else args.model
    model, tokenizer = load_model(source)
    sequences = read_sequences(args.data, tokenizer, args.max_len)
    state = json.loads((checkpoint / "train_state.json").read_text()) if source != args.model else {
        "step": 0, "losses": [], "seconds": 0.0, "sequences": len(sequences),
        "mask_token": args.mask_token if args.mask_token is not None else max(tokenizer.get_vocab().values())}
    mask = state["mask_token"]
    model.config.pard_token = mask
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    scheduler = get_cosine_schedule_with_warmup(optimizer, math.ceil(0.03 * args.steps), args.steps)
    if source != args.model:
        saved = torch.load(checkpoint / "optimizer.pt", weights_only=True)
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        print(f"resuming at step {state['step']}", flush=True)
    order = torch.randperm(len(sequences), generator=torch.Generator(device="cpu").manual_seed(args.seed),
                           device="cpu").tolist()
    start = time.perf_counter() - state["seconds"]
    while state["step"] < args.steps:
        step = state["step"]
        optimizer.zero_grad()
        total = 0.0
        for i in range(args.accumulate):
            n = step * args.accumulate + i
            ids = sequences[order[n % len(sequences)]]
            # the same drops on a resumed run
            gen = torch.Generator(device="cpu").manual_seed(args.seed * 1_000_003 + n)
            loss = pard_loss(model, pard_example(ids, args.copies, [mask], args.keep, args.floor, gen))
            (loss / args.accumulate).backward()
            total += float(loss.detach()) / args.accumulate
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        state["step"], state["seconds"] = step + 1, time.perf_counter() - start
        state["losses"].append(round(total, 4))
        print(f"step {step + 1}/{args.steps} loss {total:.4f} ({state['seconds']:.0f} s)", flush=True)
        out_of_time = args.max_minutes is not None and state["seconds"] >= 60 * args.max_minutes
        if state["step"] % args.save_every == 0 or state["step"] == args.steps or out_of_time:
            _save(model, tokenizer, checkpoint, state, optimizer, scheduler)
        if out_of_time:
            print(f"--max-minutes {args.max_minutes} reached at step {state['step']}", flush=True)
            break
    model.eval()
    final = out / "model"
    _save(model, tokenizer, final, state)
    (final / "README.md").write_text(_card(state, args))
    print(f"wrote {final} (draft with pard:{final})", flush=True)
    return 0
