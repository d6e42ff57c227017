"""Prompt sets shipped with specdec, selected by name where a data file is expected (``specdec eval --dataset NAME``).

- ``json-schema``: 37 requests for JSON answers over 14 schemas (records such as a person, an event, an invoice,
  a recipe, a flight booking; function calls), in three groups: ``extraction`` (from a short passage),
  ``tool_call`` and ``generation``. Each row has the schema in its prompt text and in its ``schema`` field
  (``specdec eval --json-schema`` generates under it). Built by ``benchmarks/json_schema_prompts.py``.
- ``revise-loop``: 10 tasks x 4 rounds (``<task>-r<round>``, group ``revise``); round r quotes the embedded model's
  own greedy answer to round r - 1 (chat template, 64 new tokens) and asks it to improve it: the workload of suffix
  decoding's cross-call cache (docs/suffix.md). Built by ``benchmarks/revise_loop_prompts.py``.
- ``yaml-series``: 16 calls asking for the same YAML keys about a different item each (group ``yaml``), in order:
  outputs share their structure across calls. Built by ``benchmarks/yaml_series_prompts.py``.
"""

from __future__ import annotations

from pathlib import Path

_DATA = Path(__file__).resolve().parent / "data"

#: name -> file under specdec/prompts/data
BUILTIN_SETS = {"json-schema": "json_schema.jsonl", "revise-loop": "revise_loop.jsonl", "yaml-series": "yaml_series.jsonl"}


def builtin_set(name: str) -> Path | None:
    """The file of the shipped prompt set ``name``, or ``None`` when no set has that name."""
    file = BUILTIN_SETS.get(str(name))
    return None if file is None else _DATA / file
