"""What a prompt row is: the fields that hold its text, group and id, and the two prompt types.

:class:`PromptRecord` is a row of a JSONL prompt file as the CLI reads it (with its line number);
:class:`Prompt` is an evaluation prompt (with a stable id and a group, for records and resumes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

#: fields that may hold the text, in order of preference
TEXT_FIELDS = ("prompt", "turns")
#: fields that may name the prompt's group, in order of preference
GROUP_FIELDS = ("category", "task", "group")
#: fields that may hold the prompt's id, in order of preference
ID_FIELDS = ("question_id", "id", "prompt_id")
#: field of a JSON schema the prompt's answer must follow (``specdec eval --json-schema``): an object, or its JSON text
SCHEMA_FIELD = "schema"
#: group of prompts from a set with no group column
DEFAULT_GROUP = "prompts"
#: Spec-Bench question ids 81-160 are the 80 MT-Bench questions; Spec-Bench reports them as one group.
MT_BENCH_IDS = range(81, 161)
MT_BENCH_GROUP = "mt_bench"


@dataclass(frozen=True)
class PromptRecord:
    """One prompt read from a JSONL file by :func:`specdec.prompts.read_prompt_file`.

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


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt.

    Attributes:
        id: stable identifier within the set (``question_id`` / ``id`` column, else the row number);
            results are recorded, and resumed, per ``(id, method)``.
        group: task group the prompt is reported under.
        text: the user turn fed through the chat template.
        reference: a reference answer when the set has one (Spec-Bench ``reference``), else ``None``.
        schema: the JSON schema the answer must follow when the set has one (its ``schema`` field), else ``None``;
            ``specdec eval --json-schema`` generates under it, and every eval records whether the answer follows it.
    """

    id: str
    group: str
    text: str
    reference: str | None = None
    # a dict: left out of equality and hashing, so that a Prompt stays hashable
    schema: dict[str, Any] | None = field(default=None, compare=False)


def first_text(value: Any) -> str | None:
    """A text field's prompt: the string itself, or the first turn of a list (Spec-Bench ``turns``)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, str) else None


def row_text(row: Mapping[str, Any], column: str | None = None) -> str | None:
    """The text of ``row``: its ``column`` when that holds text, else the first of :data:`TEXT_FIELDS` that does.

    The fallback lets a file mix schemas (a ``prompt`` row in a Spec-Bench file).
    """
    if column is not None and (text := first_text(row.get(column))) is not None:
        return text
    return next((t for f in TEXT_FIELDS if f in row and (t := first_text(row[f])) is not None), None)
