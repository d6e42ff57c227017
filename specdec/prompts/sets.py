"""Prompt sets for evaluation, loaded through ``datasets`` from local files or the Hugging Face Hub.

Two schemas are understood:

- Spec-Bench (``question_id``, ``category``, ``turns``): the first turn is the prompt, and question ids
  81-160 (the MT-Bench questions, whose categories are writing, roleplay, coding, ...) form the
  ``mt_bench`` group, as in the Spec-Bench paper; the other rows are grouped by ``category``.
- A plain ``prompt`` column, optionally with a ``category`` / ``task`` / ``group`` column.

Either may have a ``schema`` column: the JSON schema each answer must follow (an object, or its JSON text).
A set shipped with specdec is named instead of a file (:data:`~specdec.prompts.builtin.BUILTIN_SETS`:
``json-schema``).

Any other text column can be named with ``prompt_column``. Every problem is a :class:`DatasetError`
whose message is one line naming the source (and the row where one applies).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from specdec.errors import SpecdecError
from specdec.prompts.builtin import BUILTIN_SETS, builtin_set
from specdec.prompts.groups import select_per_group
from specdec.prompts.schema import (
    DEFAULT_GROUP,
    GROUP_FIELDS,
    ID_FIELDS,
    MT_BENCH_GROUP,
    MT_BENCH_IDS,
    SCHEMA_FIELD,
    TEXT_FIELDS,
    Prompt,
    first_text,
    row_text,
)

SPEC_BENCH_ENV = "SPECDEC_SPEC_BENCH"

_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}


class DatasetError(SpecdecError, ValueError):
    """A prompt set could not be found, loaded or understood (the message says which and why)."""


def default_dataset() -> Path | None:
    """The Spec-Bench questions, when present: ``$SPECDEC_SPEC_BENCH`` or ``shared/data/spec_bench/question.jsonl``
    next to the repository (or the current directory)."""
    candidates = []
    if os.environ.get(SPEC_BENCH_ENV):
        candidates.append(Path(os.environ[SPEC_BENCH_ENV]))
    rel = Path("shared") / "data" / "spec_bench" / "question.jsonl"
    repo = Path(__file__).resolve().parents[2]
    candidates += [repo.parent / rel, repo / rel, Path.cwd().parent / rel, Path.cwd() / rel]
    return next((p for p in candidates if p.is_file()), None)


def missing_default_dataset(flag: str | None = None) -> str:
    """The one-line error of a run that names no prompt set where the Spec-Bench questions are not found (a fresh
    clone has none): where they were looked for, and the sets shipped with specdec (:data:`BUILTIN_SETS`) to use
    instead, as ``flag NAME`` (the command line's ``--dataset``) or, without ``flag``, by name."""
    shipped = ", ".join(f"{flag} {name}" if flag else repr(name) for name in BUILTIN_SETS)
    return (f"no {flag or 'prompt set'} given and the Spec-Bench questions were not found (${SPEC_BENCH_ENV}, or "
            "shared/data/spec_bench/question.jsonl beside the repository or the current directory); use a set "
            f"shipped with specdec ({shipped}) or a JSONL file with one {{\"prompt\": ...}} per line")


def _looks_like_path(source: str) -> bool:
    # hub names are "owner/name": only a data-file suffix or an explicit relative/absolute prefix marks a path
    return Path(source).suffix.lower() in _BUILDERS or source.startswith((".", "/", "~"))


def load_rows(source: str | os.PathLike, *, split: str = "train", config: str | None = None) -> Any:
    """Load a ``datasets.Dataset`` from a local file / directory, a set shipped with specdec (by name) or a
    hub name (never silently empty)."""
    import datasets

    source = os.path.expanduser(str(source))
    path = Path(source)
    if not path.exists() and (shipped := builtin_set(source)) is not None:  # a local file of that name wins
        path = shipped
    try:
        if path.is_file():
            if not path.read_bytes().strip():
                raise DatasetError(f"{source} is empty")
            builder = _BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise DatasetError(
                    f"{source}: unknown file type {path.suffix!r}; use .json/.jsonl, .csv/.tsv or .parquet"
                )
            kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
            # (datasets >= 5 keeps a column of differently shaped JSON objects, such as schemas, as they are)
            data = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
        elif path.is_dir():
            data = datasets.load_dataset(str(path), config, split=split)
        elif _looks_like_path(source):
            raise DatasetError(f"no such file: {source}")
        else:
            try:
                data = datasets.load_dataset(source, config, split=split)
            except (ConnectionError, OSError) as err:
                raise DatasetError(
                    f"{source!r} is not a local file or directory, and loading it from the Hugging Face Hub failed "
                    f"({err}). Offline, pass a local .jsonl/.csv/.parquet file instead."
                ) from err
    except DatasetError:
        raise
    except Exception as err:  # datasets raises many types for unreadable files; name the file and the cause
        cause = f" ({type(err.__cause__).__name__}: {err.__cause__})" if err.__cause__ is not None else ""
        raise DatasetError(f"could not load {source}: {type(err).__name__}: {err}{cause}") from err
    if len(data) == 0:
        raise DatasetError(f"{source} holds no rows")
    return data


def rows_to_prompts(
    rows: Iterable[Mapping[str, Any]],
    columns: Sequence[str],
    *,
    source: str = "dataset",
    prompt_column: str | None = None,
    group_column: str | None = None,
) -> list[Prompt]:
    """Normalise rows of any supported schema into :class:`Prompt` objects."""
    columns = list(columns)
    text_col = prompt_column or next((c for c in TEXT_FIELDS if c in columns), None)
    if text_col is None or text_col not in columns:
        wanted = repr(prompt_column) if prompt_column else "'prompt' (or Spec-Bench 'turns')"
        raise DatasetError(f"{source} has no {wanted} column; its columns are {columns}. Name one with --prompt-column.")
    if group_column is not None and group_column not in columns:
        raise DatasetError(f"{source} has no group column {group_column!r}; its columns are {columns}")
    group_col = group_column or next((c for c in GROUP_FIELDS if c in columns), None)
    id_col = next((c for c in ID_FIELDS if c in columns), None)
    spec_bench = text_col == "turns" and "question_id" in columns and group_column is None

    prompts, seen = [], set()
    for n, row in enumerate(rows):
        text = row_text(row, text_col)
        if text is None or not text.strip():
            raise DatasetError(f"{source}: row {n + 1} has no non-empty {text_col!r} text")
        pid = str(row[id_col]) if id_col is not None and row.get(id_col) is not None else str(n)
        if pid in seen:
            raise DatasetError(f"{source}: prompt id {pid!r} appears twice; ids must be unique to record and resume")
        seen.add(pid)
        if spec_bench and row.get("question_id") is not None and int(row["question_id"]) in MT_BENCH_IDS:
            group = MT_BENCH_GROUP
        elif group_col is not None and row.get(group_col) not in (None, ""):
            group = str(row[group_col])
        else:
            group = DEFAULT_GROUP
        prompts.append(Prompt(id=pid, group=group, text=text, reference=first_text(row.get("reference")),
                              schema=_row_schema(row, source, pid)))
    if not prompts:
        raise DatasetError(f"{source} holds no prompts")
    return prompts


def _row_schema(row: Mapping[str, Any], source: str, pid: str) -> dict[str, Any] | None:
    """The row's JSON schema (:data:`SCHEMA_FIELD`): an object, or JSON text of one; ``None`` when it has none."""
    value = row.get(SCHEMA_FIELD)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{source}: prompt {pid!r} has a {SCHEMA_FIELD!r} that is not JSON "
                               f"({err.msg})") from None
    if not isinstance(value, Mapping):
        raise DatasetError(f"{source}: prompt {pid!r} has a {SCHEMA_FIELD!r} that is not a JSON object")
    return dict(value)


def load_prompts(
    source: str | os.PathLike | None = None,
    *,
    split: str = "train",
    config: str | None = None,
    prompt_column: str | None = None,
    group_column: str | None = None,
    per_group: int | None = None,
) -> list[Prompt]:
    """Load a prompt set and optionally keep the first ``per_group`` prompts of each group.

    Args:
        source: a local ``.json``/``.jsonl``/``.csv``/``.tsv``/``.parquet`` file, a local dataset
            directory, the name of a set shipped with specdec (``"json-schema"``), or a hub dataset name
            (needs the hub to be reachable). ``None``: the Spec-Bench questions (:func:`default_dataset`).
        split / config: for directories and hub datasets.
        prompt_column / group_column: override the detected columns.
        per_group: keep the first N prompts of each group (``None``: all); in a set without groups each
            prompt is its own group, so every prompt is kept (:func:`~specdec.prompts.groups.select_per_group`).

    Raises:
        DatasetError: the source cannot be found, loaded or has no usable prompt column; ``source`` is None
            and the Spec-Bench questions are not found (:func:`missing_default_dataset`).
    """
    if source is None:
        source = default_dataset()
        if source is None:
            raise DatasetError(missing_default_dataset())
    data = load_rows(source, split=split, config=config)
    prompts = rows_to_prompts(
        data, data.column_names, source=str(source), prompt_column=prompt_column, group_column=group_column
    )
    return select_per_group(prompts, per_group)


def as_prompts(prompts: Any) -> list[Prompt]:
    """:class:`Prompt` objects from what the Python API accepts: Prompt objects, strings, dicts with a
    ``prompt`` (or Spec-Bench ``turns``) field, or a dataset path / hub name for :func:`load_prompts`."""
    if isinstance(prompts, (str, os.PathLike)):
        return load_prompts(prompts)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts to evaluate")
    if all(isinstance(p, Prompt) for p in prompts):
        return prompts
    if all(isinstance(p, str) for p in prompts):
        return [Prompt(id=str(i), group=DEFAULT_GROUP, text=t) for i, t in enumerate(prompts)]
    if all(isinstance(p, Mapping) for p in prompts):
        columns = list(dict.fromkeys(k for p in prompts for k in p))
        return rows_to_prompts(prompts, columns, source="prompts")
    raise TypeError("prompts must be Prompt objects, strings, dicts with a 'prompt' (or 'turns') field, or a path")
