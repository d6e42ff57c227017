"""Reading prompt files: one reader, one set of checks, one-line errors.

A prompt file is JSON Lines, one object per line, with the prompt text in ``prompt`` (a string)
or, as in Spec-Bench, in ``turns`` (a list of strings: the first turn is the prompt). An optional
``category`` / ``task`` / ``group`` field names the prompt's group, and ``question_id`` / ``id``
its id. Blank lines are skipped.

Every problem is a :class:`PromptFileError` (a ``ValueError``) whose message is one line naming
the file, and the line number where one applies, so a command line tool can print it and stop
before it loads a model:

>>> from specdec.prompts import read_prompt_file
>>> [p.text for p in read_prompt_file("prompts.jsonl")]
['Say hello.', 'Name a fruit.']
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: fields that may hold the text, in order of preference
TEXT_FIELDS = ("prompt", "turns")
#: fields that may name the prompt's group, in order of preference (specdec.eval.datasets uses these too)
GROUP_FIELDS = ("category", "task", "group")
ID_FIELDS = ("question_id", "id", "prompt_id")


class PromptFileError(ValueError):
    """A prompt file is missing, unreadable or malformed; the message is one line naming the file."""


@dataclass(frozen=True)
class PromptRecord:
    """One prompt read from a file.

    Attributes:
        text: the prompt (the first turn for Spec-Bench rows); never empty or blank.
        group: the ``category`` / ``task`` / ``group`` field, or None when the row has none.
        id: the ``question_id`` / ``id`` / ``prompt_id`` field as a string, or None.
        line: the 1-based line number in the file.
    """

    text: str
    group: str | None
    id: str | None
    line: int


def first_text(value: Any) -> str | None:
    """A text field's prompt: the string itself, or the first turn of a list (Spec-Bench ``turns``)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, str) else None


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def read_prompt_text(path: str | os.PathLike) -> str:
    """The whole file as UTF-8 text, or a :class:`PromptFileError` saying why it cannot be read."""
    p = Path(os.path.expanduser(str(path)))
    if not p.exists():
        raise PromptFileError(f"prompt file {str(path)!r} does not exist")
    if p.is_dir():
        raise PromptFileError(f"prompt file {str(path)!r} is a directory, not a JSONL file")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise PromptFileError(f"cannot read prompt file {str(path)!r}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise PromptFileError(
            f"prompt file {str(path)!r} is not UTF-8 text (byte 0x{data[e.start]:02x} on line {line})"
        ) from None


def read_prompt_file(path: str | os.PathLike) -> list[PromptRecord]:
    """Read and check a JSONL prompt file (see the module docstring for the format).

    Raises:
        PromptFileError: the file does not exist, is a directory, is not UTF-8, a line is not
            valid JSON or not a JSON object, a row has no non-empty ``prompt`` / ``turns`` text,
            or the file holds no prompts. The message names the file and the line.
    """
    text = read_prompt_text(path)
    name = str(path)
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{name}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise PromptFileError(f"{name}:{n}: expected a JSON object with a 'prompt' field, got {_json_type(row)}")
        value = next((first_text(row[f]) for f in TEXT_FIELDS if f in row and first_text(row[f]) is not None), None)
        if value is None or not value.strip():
            raise PromptFileError(f"{name}:{n} has no non-empty 'prompt' (or 'turns') field")
        group = next((str(row[f]) for f in GROUP_FIELDS if row.get(f) not in (None, "")), None)
        pid = next((str(row[f]) for f in ID_FIELDS if row.get(f) is not None), None)
        records.append(PromptRecord(text=value, group=group, id=pid, line=n))
    if not records:
        raise PromptFileError(f"{name} holds no prompts")
    return records


def round_robin(records: list[PromptRecord], limit: int | None = None) -> list[PromptRecord]:
    """Records taken in turn from each group (groups in order of first appearance), at most ``limit``,
    so that a few prompts still cover several kinds of text."""
    by_group: dict[str | None, list[PromptRecord]] = {}
    for r in records:
        by_group.setdefault(r.group, []).append(r)
    queues = [list(v) for v in by_group.values()]
    out: list[PromptRecord] = []
    while any(queues) and (limit is None or len(out) < limit):
        for q in queues:
            if q and (limit is None or len(out) < limit):
                out.append(q.pop(0))
    return out
