"""Training prompts for draft heads: the shared prompt files, balanced by group, and prompts the verifier writes.

The prompt files (``../shared/data/train_prompts`` in this project) are JSON Lines ``{"id", "group",
"prompt"}`` (optionally ``"response"``: a given answer, trained on instead of the verifier's own); the directory's README has a table ``| file | rows | source | license |`` whose source and
license travel with every sample, so the model card can credit them. Spec-Bench or any evaluation set
must never be used here.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError
from specdec.prompts.files import PromptFileError, read_prompt_text


@dataclass
class TrainPrompt:
    """One training prompt and where it came from."""

    id: str
    group: str
    prompt: str
    source: str
    license: str
    response: str | None = None  # a given response: trained on as is instead of one the verifier writes

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class TrainHeadError(SpecdecError, ValueError):
    """A ``train-head`` problem the command line reports in one line (bad data, a stale or busy ``--out``)."""


class TrainDataError(TrainHeadError):
    """Training data that cannot be used; the message names the file and the problem."""


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file beside it, then one rename (an interrupted run
    leaves the old file or none, never half of one, for a rerun to trust)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _read_text(file: Path) -> str:
    """A data file's text; unreadable or invalid UTF-8 is a :class:`TrainDataError` naming the file, line and byte."""
    try:
        return read_prompt_text(file)
    except PromptFileError as e:
        raise TrainDataError(f"{e}; save the file as UTF-8" if "UTF-8" in str(e) else str(e)) from None


def _license_table(directory: Path) -> dict[str, tuple[str, str]]:
    """``file -> (source, license)`` from the README's markdown table, where there is one."""
    readme = directory / "README.md"
    table: dict[str, tuple[str, str]] = {}
    if not readme.is_file():
        return table
    for line in _read_text(readme).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0].endswith(".jsonl"):
            table[cells[0]] = (re.sub(r"\s+", " ", cells[2]), cells[3])
    return table


def read_train_prompts(data: str | Path) -> list[TrainPrompt]:
    """Every prompt of a ``.jsonl`` file or of the ``*.jsonl`` files of a directory, with source and license."""
    path = Path(data).expanduser()
    if not path.exists():
        raise TrainDataError(f"training data {str(data)!r} does not exist")
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    if not files:
        raise TrainDataError(f"training data directory {str(data)!r} has no .jsonl files")
    licenses = _license_table(path if path.is_dir() else path.parent)
    prompts: list[TrainPrompt] = []
    for file in files:
        source, license_ = licenses.get(file.name, (file.name, "unknown (no README table entry)"))
        for number, line in enumerate(_read_text(file).split("\n"), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row["prompt"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise TrainDataError(f"{file}:{number}: expected a JSON object with a 'prompt' string") from None
            if not isinstance(text, str) or not text.strip():
                raise TrainDataError(f"{file}:{number}: 'prompt' must be a non-empty string")
            response = row.get("response")
            if response is not None and (not isinstance(response, str) or not response.strip()):
                raise TrainDataError(f"{file}:{number}: 'response', when given, must be a non-empty string")
            prompts.append(TrainPrompt(str(row.get("id", f"{file.stem}-{number}")), str(row.get("group", file.stem)),
                                       text, source, license_, response))
    if not prompts:
        raise TrainDataError(f"training data {str(data)!r} holds no prompts")
    return prompts


def balance(prompts: list[TrainPrompt], per_group: int | None, seed: int = 0) -> list[TrainPrompt]:
    """At most ``per_group`` prompts of each group (a seeded sample), so one large group does not dominate."""
    rng = random.Random(seed)
    chosen: list[TrainPrompt] = []
    groups: dict[str, list[TrainPrompt]] = {}
    for p in prompts:
        groups.setdefault(p.group, []).append(p)
    for _, items in sorted(groups.items()):
        rng.shuffle(items)
        chosen.extend(items if per_group is None else items[:per_group])
    rng.shuffle(chosen)
    return chosen



def stable_unit(text: str) -> float:
    """A fixed number in [0, 1) for ``text`` (the same on every machine and run: splits and orders by id)."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:12], 16) / 16 ** 12


def heldout_split(sample_ids: list[str], share: float) -> tuple[list[int], list[int]]:
    """``(held-out indices, training indices)`` of samples by their ids: a sample is held out when its *prompt*
    is, so a prompt's greedy and sampled responses (``ID`` and ``ID@tT``) never fall on both sides, and a prompt's
    side never changes as data grows (a fixed hash of its id below ``share``). At least one sample on each side
    when there are two or more."""
    prompts = [i.split("@t")[0] for i in sample_ids]
    units = {p: stable_unit(f"val:{p}") for p in prompts}
    held_prompts = {p for p, u in units.items() if u < share}
    if not held_prompts and units:
        held_prompts = {min(units, key=units.get)}
    if len(held_prompts) == len(units) and len(units) > 1:
        held_prompts.discard(max(held_prompts, key=units.get))
    held = [i for i, p in enumerate(prompts) if p in held_prompts]
    train = [i for i, p in enumerate(prompts) if p not in held_prompts]
    if not train and len(held) > 1:  # one prompt with several responses: keep its first for training
        train, held = held[:1], held[1:]
    return held, train
