"""The registry of drafter kinds (torch-free): :class:`DrafterKind`, :func:`register_kind`, :func:`parse_draft`.

It holds no kinds of its own: :mod:`specdec.draft_kinds` declares the built-in ones, and :mod:`specdec.draft_spec`
(the module to import) loads both, so every name parses the same wherever it is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

#: the self-copy behind a bare ``"composite"`` drafter
COMPOSITE_DEFAULT_SCHEME = "int8"

#: the kind of every name whose prefix selects no kind (or whose kind turns it down): a local model
FALLBACK_KIND = "path"

#: name (the prefix that selects it) -> kind, in the order help texts list them
_KINDS: "dict[str, DrafterKind]" = {}
#: names of the built-in kinds, which cannot be registered again
_BUILTIN: set[str] = set()


class DraftSpecError(ValueError):
    """A drafter name that names no drafter; the message says what the accepted forms are."""


@dataclass(frozen=True)
class DraftSpec:
    """A parsed drafter name: its ``kind`` and the argument that kind takes."""

    text: str
    kind: str  # a kind's name: "self", "prompt-lookup", "composite", "layer-skip", "eagle", "path", ...
    # ("registered" for a prefix added with register_drafter)
    scheme: str | None = None  # self / composite: the quantization scheme of the copy
    layers: int | None = None  # layer-skip: how many layers
    prefix: str | None = None  # registered: the prefix its builder was registered under
    head: str | None = None  # eagle: the head's directory (None: the head shipped for the verifier)
    inner: str | None = None  # composite: "eagle" when a head drafts where the lookup finds nothing
    arg: str | None = None  # what follows the first ':' (None: no ':')

    @property
    def declared(self) -> "DrafterKind":
        """The kind in the registry that this name is of (its build, describe, check, hf_assistant)."""
        return _KINDS[self.prefix if self.kind == "registered" else self.kind]

    @property
    def hf_assistant(self) -> bool:
        """Whether the drafter is a causal LM that ``model.generate(assistant_model=...)`` can use too."""
        return self.declared.hf_assistant


#: ``build(spec, verifier, verifier_tokenizer, draft_tokenizer)`` -> a Drafter or a causal LM
Builder = Callable[[DraftSpec, Any, Any, Any], Any]


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter: everything specdec needs to know about names of the form ``PREFIX[:ARGS]``.

    Args:
        name: the kind (:attr:`DraftSpec.kind` of the names it parses) and the prefix (the text before the
            first ``':'``) that selects it.
        form: how help texts show its names, e.g. ``"layer-skip:N"``.
        build: ``build(spec, verifier, verifier_tokenizer, draft_tokenizer)`` returns a
            :class:`~specdec.drafters.Drafter` (or a causal LM, drafted with as a model drafter). It may
            import torch: it runs only when the drafter is built.
        parse: ``parse(text, arg)`` (``arg``: what follows the first ``':'``, None without one) returns
            the :class:`DraftSpec` fields of the name (``{}``: none beyond ``text``, ``kind`` and ``arg``),
            or None when the name is not of this kind after all (it is then a path); it raises
            :class:`DraftSpecError` for a malformed name. None: every name with this prefix is accepted.
        describe: ``describe(spec, verifier)`` returns ``{"description": one line, "note": one line}``
            and, where known, ``weight_error``, ``head_weight_error`` and ``grid_bound`` (what the demo prints).
        check: ``check(spec)`` raises :class:`DraftSpecError` for a name that cannot be built, before any model
            loads (the CLI prints ``error: --draft MESSAGE``, so the message starts with the name).
        hf_assistant: what it builds is a causal LM that transformers' assisted generation can use too.
    """

    name: str
    form: str
    build: Builder
    parse: Callable[[str, "str | None"], "dict[str, Any] | None"] | None = None
    describe: Callable[[DraftSpec, Any], dict[str, Any]] | None = None
    check: Callable[[DraftSpec], None] | None = None
    hf_assistant: bool = False

    def spec(self, text: str, arg: str | None) -> DraftSpec | None:
        """The parsed name, or None when ``text`` is not of this kind."""
        fields = {} if self.parse is None else self.parse(text, arg)
        if fields is None:
            return None
        return DraftSpec(**{"text": text, "kind": self.name, "arg": arg, **fields})

    def summary(self, spec: DraftSpec, verifier: Any) -> dict[str, Any]:
        """What :func:`specdec.cli.drafter_summary` prints for ``spec``."""
        if self.describe is not None:
            return self.describe(spec, verifier)
        return {"description": f"{spec.text}: a registered drafter ({self.name!r})",
                "note": "acceptance depends on how closely its drafts match the verifier's next-token choices"}


def register_kind(kind: DrafterKind, *, builtin: bool = False) -> DrafterKind:
    """Add a kind of drafter: its names then parse, build, describe themselves and appear in help texts
    everywhere a drafter is named (``SpeculativeModel(draft=...)``, the CLI, ``specdec eval``).

    Registering a name again replaces its kind; a built-in kind's name is refused. Returns ``kind``.
    """
    if not kind.name or ":" in kind.name:
        raise ValueError(f"a drafter prefix must be non-empty and contain no ':', got {kind.name!r}")
    if kind.name in _BUILTIN:
        raise ValueError(f"{kind.name!r} is a built-in drafter name and cannot be registered")
    if builtin:
        _BUILTIN.add(kind.name)
    _KINDS[kind.name] = kind
    return kind


def register_drafter(prefix: str, builder: Callable[[str, Any, Any], Any], *, hf_assistant: bool = False) -> None:
    """Make the drafter name ``PREFIX[:ARGS]`` build through ``builder(spec, verifier, tokenizer)``.

    Everywhere a drafter is named (``SpeculativeModel(draft=...)``, the CLI, ``specdec eval``). The
    builder returns a :class:`~specdec.drafters.Drafter` or a causal LM (drafted with as a model
    drafter). ``hf_assistant``: what it builds is a causal LM that HF assisted generation can use too.
    (:func:`register_kind` declares a kind with its own parsing, description and help form.)
    """
    register_kind(DrafterKind(
        prefix, f"{prefix}[:ARGS]",
        lambda spec, verifier, tokenizer, _draft_tokenizer: builder(spec.text, verifier, tokenizer),
        parse=lambda text, arg: {"kind": "registered", "prefix": prefix}, hf_assistant=hf_assistant,
    ))


def kinds() -> list[DrafterKind]:
    """Every registered kind, in the order help texts list them (the path kind last)."""
    return sorted(_KINDS.values(), key=lambda k: k.name == FALLBACK_KIND)


def forms() -> str:
    """The accepted drafter names, for help texts and error messages: one form per registered kind."""
    *named, last = [k.form for k in kinds()]
    return f"{', '.join(named)}, or {last}"


def parse_draft(spec: str) -> DraftSpec:
    """Parse a drafter name (see the module docstring) through the kind its prefix selects. Raises
    :class:`DraftSpecError` for a malformed name; scheme names and paths are checked when built (or by
    the kind's ``check``)."""
    if not isinstance(spec, str) or not spec.strip():
        raise DraftSpecError(f"a drafter name must be a non-empty string, got {spec!r}; use {forms()}")
    spec = spec.strip()
    prefix, colon, arg = spec.partition(":")
    kind = _KINDS.get(prefix) if prefix != FALLBACK_KIND else None  # a path is whatever no prefix claims
    parsed = kind.spec(spec, arg if colon else None) if kind is not None else None
    return parsed if parsed is not None else _KINDS[FALLBACK_KIND].spec(spec, None)

