"""Counts in messages: ``1 prompt``, ``2 prompts``, for every command's progress and summary lines."""

from __future__ import annotations


def plural(n: int, noun: str, plural_form: str | None = None) -> str:
    """``n`` and ``noun``, the noun in the plural unless ``n`` is 1 (``plural_form`` when the plural is not
    ``noun + "s"``): ``plural(1, "prompt") == "1 prompt"``, ``plural(0, "prompt") == "0 prompts"``."""
    return f"{n} {noun if n == 1 else (plural_form or noun + 's')}"
