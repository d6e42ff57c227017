"""The registry of drafter kinds (torch-free): :class:`DrafterKind`, :func:`register_kind`, :func:`parse_draft`.

It holds no kinds of its own: :mod:`specdec.draft_kinds` declares the built-in ones, and the registry imports that
module (by name, :data:`BUILTIN_KINDS`) the first time it is read or added to, so every name parses the same
wherever it is read, and no module imports the built-in kinds only to have them registered.
:mod:`specdec.draft_spec` is the module to import for drafter names.
"""

from __future__ import annotations

import importlib
import re
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable

from specdec.errors import SpecdecError

#: the self-copy behind a bare ``"composite"`` drafter
COMPOSITE_DEFAULT_SCHEME = "int8"

#: the kind of every name whose prefix selects no kind (or whose kind turns it down): a local model
FALLBACK_KIND = "path"

#: name (the prefix that selects it) -> kind, in the order help texts list them
_KINDS: "dict[str, DrafterKind]" = {}
#: names of the built-in kinds, which cannot be registered again
_BUILTIN: set[str] = set()
#: what a prefix may hold: it is typed on command lines (``--draft PREFIX[:ARGS]``), so no spaces, quotes or ':',
#: and no leading '-' (argparse would take it for an option)
_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
#: how many drafter names registered builders may lead through (one returning another's name) before a loop is assumed
MAX_NAME_CHAIN = 8
#: the drafter names being built in this context, outermost first (a registered builder may return another name)
_BUILDING: ContextVar[tuple[str, ...]] = ContextVar("specdec_drafters_building", default=())
#: the module that declares the built-in kinds (``register_kind(..., builtin=True)`` each). It sits above this leaf
#: (its builders import the drafters when they run), so it is named, not imported: :func:`_registry` imports it the
#: first time the registry is read or added to
BUILTIN_KINDS = "specdec.draft_kinds"
#: whether :data:`BUILTIN_KINDS` has been imported (its kinds are then in :data:`_KINDS`)
_builtins_loaded = False


def _registry() -> "dict[str, DrafterKind]":
    """The registered kinds, the built-in ones among them: their module is imported on the first call (Python's
    import lock makes a second thread wait until it has registered them all)."""
    global _builtins_loaded
    if not _builtins_loaded:
        importlib.import_module(BUILTIN_KINDS)
        _builtins_loaded = True
    return _KINDS


class DraftSpecError(SpecdecError, ValueError):
    """A drafter name that names no drafter; the message says what the accepted forms are."""


class DrafterTypeError(DraftSpecError, TypeError):
    """A registered builder returned something that is neither a drafter, a causal LM nor a drafter name (a
    ``TypeError``, and a :class:`DraftSpecError` so that command lines print it on one line)."""


@dataclass(frozen=True)
class DraftSpec:
    """A parsed drafter name: its ``kind`` and the argument that kind takes."""

    text: str
    kind: str  # a kind's name: "self", "prompt-lookup", "composite", "layer-skip", "eagle", "path", ...
    # ("registered" for a prefix added with register_drafter)
    scheme: str | None = None  # self / composite: the quantization scheme of the copy
    layers: int | None = None  # layer-skip: how many layers
    prefix: str | None = None  # registered: the prefix its builder was registered under
    head: str | None = None  # eagle: its head's directory (None: the one shipped for the verifier); pard, dflash: theirs
    inner: str | None = None  # composite: "eagle" when a head drafts where the lookup finds nothing
    arg: str | None = None  # what follows the first ':' (None: no ':')

    @property
    def declared(self) -> "DrafterKind":
        """The kind in the registry that this name is of (its build, describe, check, hf_assistant)."""
        return _registry()[self.prefix if self.kind == "registered" else self.kind]

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
        check_verifier: ``check_verifier(spec, config)`` raises :class:`DraftSpecError` (its message starting with
            the name, as ``check``'s) for a name the verifier cannot use, judged from the verifier's transformers
            config, which the CLI reads before the weights load.
        hf_assistant: what it builds is a causal LM that transformers' assisted generation can use too.
    """

    name: str
    form: str
    build: Builder
    parse: Callable[[str, "str | None"], "dict[str, Any] | None"] | None = None
    describe: Callable[[DraftSpec, Any], dict[str, Any]] | None = None
    check: Callable[[DraftSpec], None] | None = None
    check_verifier: Callable[[DraftSpec, Any], None] | None = None
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

    Registering a name again replaces its kind; a built-in kind's name is refused, and so is a name that cannot be
    typed in ``--draft`` (:class:`ValueError`) or a field that should be a function and is not (:class:`TypeError`).
    Returns ``kind``.
    """
    _check_prefix(kind.name)
    if not builtin:  # the built-in kinds first, so that their names are refused (they register with builtin=True)
        _registry()
    for field in ("build", "parse", "describe", "check", "check_verifier"):
        value = getattr(kind, field)
        if (value is not None or field == "build") and not callable(value):
            raise TypeError(f"drafter kind {kind.name!r}: {field} must be a function, got {what(value)}")
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
    The builder may also return another drafter's name, built in turn; a name that leads back to itself (or more
    than :data:`MAX_NAME_CHAIN` names deep) raises :class:`DraftSpecError`, and anything else returned raises
    :class:`DrafterTypeError`, when the drafter is built. A ``prefix`` that cannot be typed in ``--draft`` raises
    :class:`ValueError`, a ``builder`` that is not callable :class:`TypeError`.
    (:func:`register_kind` declares a kind with its own parsing, description and help form.)
    """
    _check_prefix(prefix)
    if not callable(builder):
        raise TypeError(f"register_drafter({prefix!r}, ...): the builder must be callable as "
                        f"builder(spec, verifier, tokenizer), got {what(builder)}")

    def build(spec: DraftSpec, verifier: Any, tokenizer: Any, draft_tokenizer: Any) -> Any:
        chain = (*_BUILDING.get(), spec.text)
        looped = spec.text in chain[:-1]
        if looped or len(chain) > MAX_NAME_CHAIN:
            # no leading name: the CLI prints build errors after "--draft NAME:"
            why = "lead back to themselves" if looped else f"lead through more than {MAX_NAME_CHAIN} names"
            raise DraftSpecError(f"registered builders return drafter names that {why}: {' -> '.join(chain)}; a builder "
                                 "must return a Drafter, a causal LM, or another drafter's name")
        token = _BUILDING.set(chain)
        try:
            built = builder(spec.text, verifier, tokenizer)
            if isinstance(built, str):  # built here, inside this name's context, so a loop of names is seen
                inner = parse_draft(built)
                built = inner.declared.build(inner, verifier, tokenizer, draft_tokenizer)
        finally:
            _BUILDING.reset(token)
        return built  # specdec.drafters.resolve_drafter checks what came back (DrafterTypeError)

    register_kind(DrafterKind(
        prefix, f"{prefix}[:ARGS]", build,
        parse=lambda text, arg: {"kind": "registered", "prefix": prefix}, hf_assistant=hf_assistant,
    ))


def _check_prefix(prefix: Any) -> None:
    """Refuse a drafter prefix that could not be typed as ``--draft PREFIX[:ARGS]``."""
    if not isinstance(prefix, str):
        raise TypeError(f"a drafter prefix must be a string, got {what(prefix)}")
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"a drafter prefix must be non-empty and contain no ':', spaces or other characters that "
                         f"cannot be typed in --draft PREFIX[:ARGS] (ASCII letters, digits, '_', '.', '+', '-'; "
                         f"not starting with '-'), got {prefix!r}")


def what(value: Any) -> str:
    """``value`` named for an error message: a built-in value with its (shortened) repr, anything else by its class."""
    kind = type(value)
    if kind.__module__ == "builtins":
        text = " ".join(repr(value).split())
        return f"{kind.__name__} {text if len(text) <= 60 else text[:57] + '...'}"
    return f"a {kind.__module__}.{kind.__qualname__}"


def kinds() -> list[DrafterKind]:
    """Every registered kind, in the order help texts list them (the path kind last)."""
    return sorted(_registry().values(), key=lambda k: k.name == FALLBACK_KIND)


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
    registry = _registry()
    kind = registry.get(prefix) if prefix != FALLBACK_KIND else None  # a path is whatever no prefix claims
    parsed = kind.spec(spec, arg if colon else None) if kind is not None else None
    return parsed if parsed is not None else registry[FALLBACK_KIND].spec(spec, None)

