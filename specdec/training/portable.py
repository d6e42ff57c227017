"""A training checkpoint small enough to commit, so a run survives a machine that loses its files.

A ``train-head`` checkpoint (``checkpoints/step-N``) holds the head in fp32 and AdamW's two moments: ~170 MB
for a 16k-vocabulary SmolLM2 head. A *portable* checkpoint keeps the head's weights in bf16 (28 MB) and
``trainer.json`` (step, validation history, best score), marked ``"portable"``. Copied back in as
``checkpoints/step-N`` (:func:`unpack_checkpoint`), training resumes from step N with fresh optimizer moments
and a second learning-rate warm-up (:mod:`specdec.training.train`); what is lost is the moments (they rebuild
within a warm-up: betas 0.9 / 0.95) and the exact fp32 weights.

    python -m specdec.training.portable pack runs/head-v2 data/smollm2-head-v2/checkpoint
    python -m specdec.training.portable unpack data/smollm2-head-v2/checkpoint runs/head-v2

:func:`export_head` turns any training checkpoint (full or portable) into a head directory that ``draft="eagle:DIR"``
loads, to measure a run mid-way (the learning curve's one-pass points).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from specdec.training.checkpoints import PORTABLE_KEY, latest_checkpoint, replace_directory, trainer_state
from specdec.training.prompts import TrainHeadError, write_atomic

__all__ = ["PORTABLE_KEY", "export_head", "pack_checkpoint", "unpack_checkpoint"]


def pack_checkpoint(run: str | Path, dest: str | Path, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Write the newest whole checkpoint of ``run`` (a ``train-head --out``) to ``dest`` as a portable one:
    floating weights in ``dtype``, integer buffers (the draft vocabulary's maps) as they are. ``dest`` is
    replaced whole or not at all. Returns its ``trainer.json``."""
    from safetensors.torch import load_file, save_file

    run, dest = Path(run), Path(dest)
    found = latest_checkpoint(run / "checkpoints", log=lambda m: None)
    if found is None:
        raise TrainHeadError(f"{run / 'checkpoints'} holds no whole checkpoint to pack")
    path, state = found
    weights = load_file(str(path / "model.safetensors"), device="cpu")
    packed = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
    trainer = {**state, PORTABLE_KEY: {"from": path.name, "dtype": str(dtype).removeprefix("torch.")}}
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(packed, str(tmp / "model.safetensors"))
    write_atomic(tmp / "trainer.json", json.dumps(trainer) + "\n")
    replace_directory(tmp, dest)
    return trainer


def unpack_checkpoint(src: str | Path, run: str | Path) -> Path | None:
    """Put the portable checkpoint ``src`` into ``run/checkpoints`` as ``step-N``, where the next ``train-head``
    run into ``run`` resumes from it. Returns that path, or None when ``run`` already holds a whole checkpoint
    of step N or later (nothing to restore)."""
    src, checkpoints = Path(src), Path(run) / "checkpoints"
    state = trainer_state(src)
    if state is None or PORTABLE_KEY not in state:
        raise TrainHeadError(f"{src} is not a portable checkpoint (no model.safetensors, or a trainer.json "
                             f"without '{PORTABLE_KEY}')")
    found = latest_checkpoint(checkpoints, log=lambda m: None)
    if found is not None and found[1]["step"] >= state["step"]:
        return None
    path = checkpoints / f"step-{state['step']}"
    tmp = checkpoints / f".tmp-step-{state['step']}"
    shutil.rmtree(tmp, ignore_errors=True)
    checkpoints.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.replace(path)
    return path


def export_head(checkpoint: str | Path, verifier, dest: str | Path, *, kind: str = "eagle3") -> Path:
    """The head of a ``train-head`` checkpoint (``checkpoints/step-N``, full or portable) as a head directory
    (:func:`~specdec.heads.checkpoint.save_head`, bf16) for ``verifier``; its draft vocabulary is read from the
    weights. A checkpoint that is not whole, or not a head of ``kind``, is a :class:`TrainHeadError`."""
    from safetensors.torch import load_file

    from specdec.heads.checkpoint import save_head
    from specdec.heads.config import HeadConfig
    from specdec.heads.modules import EagleHead

    checkpoint = Path(checkpoint)
    if trainer_state(checkpoint) is None:
        raise TrainHeadError(f"{checkpoint} is not a whole train-head checkpoint")
    weights = {k.removeprefix("head."): v for k, v in load_file(str(checkpoint / "model.safetensors"), device="cpu").items()}
    draft = weights["d2t"].numel() if "d2t" in weights else None
    head = EagleHead(HeadConfig.for_verifier(verifier.config, kind, draft_vocab_size=draft))
    missing, unexpected = head.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.startswith("rotary_emb.")]
    if missing or unexpected:
        raise TrainHeadError(f"{checkpoint} is not a {kind} head of this verifier ({(missing + unexpected)[0]} differs)")
    return save_head(head, dest)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec.training.portable", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("pack", help="RUN's newest checkpoint -> DEST (bf16 weights, no optimizer moments)")
    a.add_argument("run")
    a.add_argument("dest")
    b = sub.add_parser("unpack", help="SRC -> RUN/checkpoints/step-N, where train-head resumes")
    b.add_argument("src")
    b.add_argument("run")
    args = p.parse_args(argv)
    try:
        if args.what == "pack":
            state = pack_checkpoint(args.run, args.dest)
            print(f"packed step {state['step']} ({state[PORTABLE_KEY]['from']}) into {args.dest}")
        else:
            path = unpack_checkpoint(args.src, args.run)
            print(f"restored {path}" if path else f"{args.run} already holds that step or a later one: nothing restored")
    except TrainHeadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
