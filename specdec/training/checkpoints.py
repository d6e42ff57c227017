"""``train-head``'s checkpoints: ``checkpoints/step-N`` written whole or not at all, the newest whole one found
for a resume, the best validated head, and the weights of a portable checkpoint (:mod:`specdec.training.portable`:
no optimizer state, marked by :data:`PORTABLE_KEY` in its ``trainer.json``)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from specdec.heads.modules import EagleHead

#: the ``trainer.json`` key that marks a checkpoint without optimizer state
PORTABLE_KEY = "portable"

STEP_DIR = re.compile(r"step-(\d+)")
#: files ``accelerator.save_state`` writes for one model and one optimizer, besides our ``trainer.json``
MODEL_FILES = ("model.safetensors", "pytorch_model.bin")


def trainer_state(path: Path) -> dict[str, Any] | None:
    """``trainer.json`` of a checkpoint, or None when the checkpoint is not whole. A portable checkpoint
    (:mod:`specdec.training.portable`) is whole without optimizer state."""
    if not any((path / name).is_file() and (path / name).stat().st_size for name in MODEL_FILES):
        return None
    try:
        state = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return None
    if PORTABLE_KEY not in state and not ((path / "optimizer.bin").is_file() and (path / "optimizer.bin").stat().st_size):
        return None
    return state


def load_portable(head: nn.Module, path: Path) -> None:
    """A portable checkpoint's weights into ``head`` (the unwrapped training module), refused in one line when
    they are another head's (other shapes, or another draft vocabulary: other data or ``--draft-vocab``)."""
    from safetensors.torch import load_file

    from specdec.training.prompts import TrainHeadError

    weights = load_file(str(path / "model.safetensors"), device="cpu")
    own = head.state_dict()
    differ = sorted(set(own) ^ set(weights)) or [k for k in own if own[k].shape != weights[k].shape]
    if differ:
        raise TrainHeadError(f"{path} holds another head's weights ({differ[0]} differs); use --overwrite to start afresh")
    for k, v in own.items():
        if not v.is_floating_point() and not torch.equal(v.cpu(), weights[k]):
            raise TrainHeadError(f"{path} was trained with another draft vocabulary ({k}); use --overwrite to start afresh")
    head.load_state_dict(weights)


def step_dirs(directory: Path) -> list[Path]:
    """The ``step-N`` directories, oldest first."""
    found = [p for p in directory.glob("step-*") if p.is_dir() and STEP_DIR.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(directory: Path, log: Any = print, *, remove: bool = False) -> tuple[Path, dict[str, Any]] | None:
    """The newest whole checkpoint and its trainer state; incomplete ones are skipped with a notice (and
    deleted with ``remove``: only the main process does, the others just skip them)."""
    for path in reversed(step_dirs(directory)):
        state = trainer_state(path)
        if state is not None:
            return path, state
        log(f"notice: skipping incomplete checkpoint {path} (a save was interrupted){'; removed' if remove else ''}")
        if remove:
            shutil.rmtree(path, ignore_errors=True)
    return None


def save_checkpoint(accelerator: Any, checkpoints: Path, step: int, trainer: dict[str, Any]) -> None:
    """``checkpoints/step-N`` whole or not at all: every process saves into a temporary directory, then the
    main process adds ``trainer.json`` and renames it; the two newest whole checkpoints are kept."""
    path, tmp = checkpoints / f"step-{step}", checkpoints / f".tmp-step-{step}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # what an interrupted save left
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / "trainer.json").write_text(json.dumps(trainer), encoding="utf-8")
        if path.exists():  # an incomplete leftover of the same step
            shutil.rmtree(path)
        os.replace(tmp, path)
        whole = [p for p in step_dirs(checkpoints) if trainer_state(p) is not None]
        for old in [p for p in step_dirs(checkpoints) if p not in whole[-2:]]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in checkpoints.glob(".tmp-step-*"):
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()


def save_best(head: EagleHead, directory: Path) -> None:
    """The best head so far, in fp32 (it is returned as is), whole or not at all: a temporary name, then a rename."""
    from specdec.heads.checkpoint import save_head

    write_directory(directory, lambda tmp: save_head(head, tmp, dtype=torch.float32))


def write_directory(directory: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` into a fresh temporary sibling of ``directory``, then put it in its place
    (:func:`replace_directory`): the directory is whole or not there, never half written."""
    tmp = directory.with_name(f".tmp-{directory.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    replace_directory(tmp, directory)


def replace_directory(tmp: Path, directory: Path) -> None:
    """Put the finished ``tmp`` in place of ``directory`` with renames only: an interrupted swap leaves the old
    directory (or, for a moment, none), never a half-written one."""
    old = directory.with_name(f".old-{directory.name}")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
