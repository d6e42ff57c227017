"""Drafter names, parsed in one place (torch-free, so the CLI checks them before loading anything).

A drafter spec is one of:

* ``self:SCHEME`` - a quantized copy of the verifier (``self:int8``, ``self:int4:g128+head8``);
* ``prompt-lookup`` - n-gram copying from the context, no model;
* ``composite`` / ``composite:SCHEME`` - prompt lookup where the text repeats, else ``self:SCHEME``;
* ``composite:eagle`` / ``composite:eagle:DIR`` - prompt lookup where the text repeats, else a draft head;
* ``layer-skip:N`` - the verifier's first N decoder layers;
* ``eagle`` / ``eagle:DIR`` - an EAGLE-1/2 or EAGLE-3 draft head: the one specdec ships for the
  verifier, or the head in directory ``DIR``;
* ``PREFIX[:ARGS]`` for a prefix added with :func:`register_drafter`;
* anything else - a local model directory or ``.gguf`` file.

:func:`specdec.drafters.resolve_drafter` builds the drafter a spec names; the CLI and ``specdec
eval`` validate and describe specs with :func:`parse_draft`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

#: the self-copy behind a bare ``"composite"`` drafter
COMPOSITE_DEFAULT_SCHEME = "int8"

#: kinds whose drafter is a causal LM that transformers' assisted generation can also use
_HF_ASSISTANT_KINDS = ("self", "path")

#: prefix -> (builder(spec, verifier, tokenizer), whether what it builds can serve HF assisted generation)
_REGISTRY: dict[str, tuple[Callable[[str, Any, Any], Any], bool]] = {}


class DraftSpecError(ValueError):
    """A drafter name that names no drafter; the message says what the accepted forms are."""


@dataclass(frozen=True)
class DraftSpec:
    """A parsed drafter name: its ``kind`` and the argument that kind takes."""

    text: str
    kind: str  # "self", "prompt-lookup", "composite", "layer-skip", "eagle", "registered" or "path"
    scheme: str | None = None  # self / composite: the quantization scheme of the copy
    layers: int | None = None  # layer-skip: how many layers
    prefix: str | None = None  # registered: the prefix its builder was registered under
    head: str | None = None  # eagle: the head's directory (None: the head shipped for the verifier)
    inner: str | None = None  # composite: "eagle" when a head drafts where the lookup finds nothing

    @property
    def hf_assistant(self) -> bool:
        """Whether the drafter is a causal LM that ``model.generate(assistant_model=...)`` can use too."""
        if self.kind == "registered":
            return _REGISTRY[self.prefix][1]
        return self.kind in _HF_ASSISTANT_KINDS


FORMS = ("self:SCHEME (e.g. self:int8), prompt-lookup, composite[:SCHEME], composite:eagle[:DIR], layer-skip:N, eagle[:DIR], "
         "or a local model directory / .gguf file")


def parse_draft(spec: str) -> DraftSpec:
    """Parse a drafter name (see the module docstring). Raises :class:`DraftSpecError` for a malformed
    ``self:`` / ``composite:`` / ``layer-skip:`` spec; scheme names and paths are checked when built."""
    if not isinstance(spec, str) or not spec.strip():
        raise DraftSpecError(f"a drafter name must be a non-empty string, got {spec!r}; use {FORMS}")
    spec = spec.strip()
    prefix, _, arg = spec.partition(":")
    if prefix in _REGISTRY:
        return DraftSpec(spec, "registered", prefix=prefix)
    if spec == "prompt-lookup":
        return DraftSpec(spec, "prompt-lookup")
    if spec == "composite":
        return DraftSpec(spec, "composite", scheme=COMPOSITE_DEFAULT_SCHEME)
    if prefix == "composite" and arg.partition(":")[0] == "eagle":
        head = arg.partition(":")[2].strip()
        if arg != "eagle" and not head:
            raise DraftSpecError(f"drafter {spec!r} needs a head directory after 'eagle:', e.g. composite:eagle:./my-head")
        return DraftSpec(spec, "composite", head=head or None, inner="eagle")
    if prefix in ("self", "composite"):
        if not arg:
            raise DraftSpecError(f"drafter {spec!r} needs a quantization scheme after ':', e.g. {prefix}:int8")
        return DraftSpec(spec, prefix, scheme=arg)
    if prefix == "eagle":
        if spec != "eagle" and not arg.strip():
            raise DraftSpecError(f"drafter {spec!r} needs a head directory after ':', e.g. eagle:./my-head")
        return DraftSpec(spec, "eagle", head=arg.strip() or None)
    if prefix == "layer-skip":
        if not arg.isdigit() or int(arg) < 1:
            raise DraftSpecError(f"drafter {spec!r}: layer-skip needs a layer count >= 1, e.g. layer-skip:8")
        return DraftSpec(spec, "layer-skip", layers=int(arg))
    return DraftSpec(spec, "path")


def register_drafter(prefix: str, builder: Callable[[str, Any, Any], Any], *, hf_assistant: bool = False) -> None:
    """Make the drafter name ``PREFIX[:ARGS]`` build through ``builder(spec, verifier, tokenizer)``.

    Everywhere a drafter is named (``SpeculativeModel(draft=...)``, the CLI, ``specdec eval``). The
    builder returns a :class:`~specdec.drafters.Drafter` or a causal LM (drafted with as a model
    drafter). ``hf_assistant``: what it builds is a causal LM that HF assisted generation can use too.
    """
    if not prefix or ":" in prefix:
        raise ValueError(f"a drafter prefix must be non-empty and contain no ':', got {prefix!r}")
    if prefix in ("self", "composite", "layer-skip", "prompt-lookup", "eagle"):
        raise ValueError(f"{prefix!r} is a built-in drafter name and cannot be registered")
    _REGISTRY[prefix] = (builder, hf_assistant)


def registered_builder(spec: DraftSpec) -> Callable[[str, Any, Any], Any]:
    """The builder behind a ``registered`` spec."""
    return _REGISTRY[spec.prefix][0]
