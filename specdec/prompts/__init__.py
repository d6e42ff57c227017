"""Prompts: reading prompt files and sets, choosing prompts by group, and encoding them for a model.

One module for every command: ``specdec generate --prompts`` and ``quant-report --prompts`` read
JSONL files with :func:`read_prompt_file` (strict, one-line errors naming the file and line);
``specdec eval`` loads sets with :func:`load_prompts` (JSON/JSONL/CSV/TSV/parquet through
``datasets``, or the Spec-Bench questions by default); all of them encode with :func:`encode_prompt` /
:func:`encode_batch`, the same chat template.

>>> from specdec.prompts import read_prompt_file, load_prompts, encode_prompt
>>> [p.text for p in read_prompt_file("prompts.jsonl")]
['Say hello.', 'Name a fruit.']
>>> load_prompts(per_group=1)[0].group                          # Spec-Bench, one prompt per group
'mt_bench'
>>> encode_prompt(tokenizer, "Say hello.").shape               # [1, n]: through the chat template

Modules: :mod:`~specdec.prompts.schema` (fields, :class:`Prompt`, :class:`PromptRecord`),
:mod:`~specdec.prompts.files` (JSONL reader), :mod:`~specdec.prompts.sets` (``datasets`` loader),
:mod:`~specdec.prompts.groups` (per-group selection, group order), :mod:`~specdec.prompts.encode`,
:mod:`~specdec.prompts.builtin` (the sets shipped with specdec, such as ``json-schema``),
:mod:`~specdec.prompts.wording` (counts in messages: ``1 prompt``, ``2 prompts``).
Nothing here imports torch or ``datasets`` until it is used.
"""

from specdec.prompts.builtin import BUILTIN_SETS, builtin_set
from specdec.prompts.encode import encode_batch, encode_prompt
from specdec.prompts.files import PromptFileError, json_rows, read_prompt_file, read_prompt_text
from specdec.prompts.groups import group_order, round_robin, select_per_group, ungrouped
from specdec.prompts.schema import (
    DEFAULT_GROUP,
    GROUP_FIELDS,
    ID_FIELDS,
    MT_BENCH_GROUP,
    MT_BENCH_IDS,
    SCHEMA_FIELD,
    TEXT_FIELDS,
    Prompt,
    PromptRecord,
    first_text,
    row_text,
)
from specdec.prompts.sets import (
    SPEC_BENCH_ENV,
    DatasetError,
    as_prompts,
    default_dataset,
    load_prompts,
    load_rows,
    missing_default_dataset,
    rows_to_prompts,
)
from specdec.prompts.wording import plural

__all__ = [
    "BUILTIN_SETS",
    "DEFAULT_GROUP",
    "GROUP_FIELDS",
    "ID_FIELDS",
    "MT_BENCH_GROUP",
    "MT_BENCH_IDS",
    "SCHEMA_FIELD",
    "SPEC_BENCH_ENV",
    "TEXT_FIELDS",
    "DatasetError",
    "Prompt",
    "PromptFileError",
    "json_rows",
    "PromptRecord",
    "as_prompts",
    "builtin_set",
    "default_dataset",
    "encode_batch",
    "encode_prompt",
    "first_text",
    "group_order",
    "load_prompts",
    "load_rows",
    "missing_default_dataset",
    "plural",
    "read_prompt_file",
    "read_prompt_text",
    "round_robin",
    "row_text",
    "rows_to_prompts",
    "select_per_group",
    "ungrouped",
]
