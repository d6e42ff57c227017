"""Drafter names and the one registry of drafter kinds (torch-free, so the CLI checks names before loading anything).

Every kind of drafter, built-in or added, is one :class:`DrafterKind` in this registry. It declares how
its name parses, how it builds, how it describes itself, whether transformers' assisted generation can
use what it builds, and its form for help texts (:func:`forms`). The built-in kinds are declared in
:mod:`specdec.draft_kinds`, which the registry imports the first time it is read:

* ``self:SCHEME`` - a quantized copy of the verifier (``self:int8``, ``self:int4:g128+head8``);
* ``prompt-lookup`` - n-gram copying from the context, no model;
* ``composite`` / ``composite:SCHEME`` - prompt lookup where the text repeats, else ``self:SCHEME``;
* ``composite:eagle`` / ``composite:eagle:DIR`` - prompt lookup where the text repeats, else a draft head;
* ``layer-skip:N`` - the verifier's first N decoder layers;
* ``eagle`` / ``eagle:DIR`` - an EAGLE-1/2 or EAGLE-3 draft head: the one specdec ships for the
  verifier, or the head in directory ``DIR``;
* ``PREFIX[:ARGS]`` for a kind added with :func:`register_kind` or :func:`register_drafter`;
* anything else - a local model directory or ``.gguf`` file (the ``path`` kind, :data:`FALLBACK_KIND`).

Adding a kind is one module (its :class:`~specdec.drafters.Drafter`) and one :func:`register_kind` call::

    register_kind(DrafterKind("echo", "echo:TOKEN", lambda spec, verifier, tok, draft_tok: EchoDrafter(int(spec.arg)),
                              parse=..., describe=..., hf_assistant=False))

:func:`specdec.drafters.resolve_drafter` builds the drafter a name names; the CLI and ``specdec eval``
validate and describe names with :func:`parse_draft`.
"""

from __future__ import annotations

from typing import Any

from specdec.draft_registry import (  # noqa: F401  (the public names of drafter naming live here)
    COMPOSITE_DEFAULT_SCHEME,
    FALLBACK_KIND,
    DraftSpecError,
    DraftSpec,
    DrafterKind,
    register_kind,
    register_drafter,
    kinds,
    forms,
    parse_draft,
)


def __getattr__(name: str) -> Any:
    if name == "FORMS":  # the forms of the kinds registered now
        return forms()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
