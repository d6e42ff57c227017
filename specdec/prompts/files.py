"""The strict JSONL prompt-file reader of the command line (``specdec generate --prompts``, ``quant-report``).

A prompt file is JSON Lines, one object per line, with the prompt text in ``prompt`` (a string)
or, as in Spec-Bench, in ``turns`` (a list of strings: the first turn is the prompt). An optional
``category`` / ``task`` / ``group`` field names the prompt's group, and ``question_id`` / ``id``
its id. Blank lines are skipped.

Every problem is a :class:`PromptFileError` (a ``ValueError``) whose message is one line naming
the file, and the line number where one applies, so a command line tool can print it and stop
before it loads a model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

from specdec.errors import SpecdecError
from specdec.prompts.schema import GROUP_FIELDS, ID_FIELDS, PromptRecord, row_text


class PromptFileError(SpecdecError, ValueError):
    """A prompt file is missing, unreadable or malformed; the message is one line naming the file."""


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


def json_rows(path: str | os.PathLike, what: str = "") -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` per non-blank line of a UTF-8 JSON-lines file; a :class:`PromptFileError`
    naming the file and line for text that is not UTF-8, a line that is not JSON or not a JSON object
    (``what`` says what the object should hold)."""
    name = str(path)
    for n, line in enumerate(read_prompt_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{name}:{n}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise PromptFileError(f"{name}:{n}: expected a JSON object{' ' + what if what else ''}, got {_json_type(row)}")
        yield n, row


def read_prompt_file(path: str | os.PathLike) -> list[PromptRecord]:
    """Read and check a JSONL prompt file (see the module docstring for the format).

    Raises:
        PromptFileError: the file does not exist, is a directory, is not UTF-8, a line is not
            valid JSON or not a JSON object, a row has no non-empty ``prompt`` / ``turns`` text,
            or the file holds no prompts. The message names the file and the line.
    """
    name = str(path)
    records = []
    for n, row in json_rows(path, "with a 'prompt' field"):
        value = row_text(row)
        if value is None or not value.strip():
            raise PromptFileError(f"{name}:{n} has no non-empty 'prompt' (or 'turns') field")
        group = next((str(row[f]) for f in GROUP_FIELDS if row.get(f) not in (None, "")), None)
        pid = next((str(row[f]) for f in ID_FIELDS if row.get(f) is not None), None)
        records.append(PromptRecord(text=value, group=group, id=pid, line=n))
    if not records:
        raise PromptFileError(f"{name} holds no prompts")
    return records
