"""Lazy package exports: a package's public names imported from their modules on first use (torch-free).

``specdec``, ``specdec.eval`` and ``specdec.training`` export names whose modules need torch and transformers; the
command line's ``--help`` imports those packages and must not pay for either.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping, MutableMapping


def lazy_exports(namespace: MutableMapping[str, Any], names: Mapping[str, str]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for a package whose globals are ``namespace``: ``names`` maps each public name to
    the module that defines it; a name is imported on first access and kept in ``namespace`` (later lookups skip
    the hook)."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
