"""Tree modes: what ``tree="NAME"`` / ``--tree NAME`` means, declared once per mode (torch-free).

:data:`TREE_MODES` is the table, one :class:`TreeMode` per name. :func:`~specdec.trees.config.parse_tree`,
:class:`~specdec.trees.config.TreeConfig` (its checks, node counts, ``for_call``, ``fit_vocab``, ``to_dict``),
``TreePlan`` (whether a sizer is needed), tree growth (listed paths or top-k expansion), and the ``--tree`` choices
and help of ``specdec`` and ``specdec eval`` all read it; nothing else lists the modes.

Trees come in two shapes, one class each:

- :class:`PathTree`: a fixed list of paths of top-k ranks (Medusa / EAGLE-1 "choices"): ``static``;
- :class:`TopKTree`: grown by cumulative draft log-probability (EAGLE-2): expand the ``top_k`` best frontier
  nodes for ``depth`` steps, keep the best ``total_tokens``: ``dynamic``, and ``auto`` (sized per pass by
  :mod:`specdec.trees.auto`, its numbers upper bounds).

A new mode of an existing shape is one declaration: ``register_mode(TopKTree("wide", help=..., defaults=...))``.
A new shape is a subclass (and its growth in :mod:`specdec.trees.build`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar, Mapping, Protocol, TypeVar


class TreeFields(Protocol):
    """The fields a mode reads: a :class:`~specdec.trees.config.TreeConfig` (not imported here: config imports
    this module, and the package allows no import circle, type-only ones included)."""

    mode: str
    choices: tuple[tuple[int, ...], ...]
    top_k: int
    depth: int
    total_tokens: int


Config = TypeVar("Config", bound=TreeFields)

#: the configuration fields a mode's ``defaults`` may set (``mode`` is the mode's name)
OPTION_FIELDS = ("choices", "top_k", "depth", "total_tokens")
#: what ``tree=`` means for chains; no mode may take the name
NONE = "none"
#: the mode a bare list of paths (or a dict with ``choices`` and no ``mode``) means
LISTED_PATHS = "static"
#: names are typed on command lines and in ``specdec eval`` method names (``specdec[D,k=K,tree=NAME]``)
_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class TreeMode:
    """One tree mode. Subclasses (:class:`PathTree`, :class:`TopKTree`) say how a tree of the shape is counted,
    capped and checked; an instance is one mode of that shape.

    Args:
        name: what ``tree=`` / ``--tree`` take (lowercase letters, digits, ``_``; not ``"none"``).
        help: a few words for ``--tree`` help after the name (``""``: the name alone).
        defaults: the :class:`TreeConfig` fields ``tree="NAME"`` sets (a dict ``{"mode": NAME, ...}`` starts from
            the field defaults instead, as before modes were declared).
        sized_per_pass: a ``TreeSizer`` picks each pass's depth and size from measured costs (the call needs
            one), below the configured numbers.
        caps_to_vocab: options past the vocabulary are capped to it (``fit_vocab``) rather than refused: for
            modes whose numbers are upper bounds rather than the user's exact choice.
    """

    name: str
    help: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    sized_per_pass: bool = False
    caps_to_vocab: bool = False

    #: trees of this shape are the listed paths (grown by ``build._static``), not expanded by top-k
    grows_paths: ClassVar[bool] = False

    def __post_init__(self) -> None:
        # read-only: a declaration is shared by every configuration of the mode
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))

    def check(self, config: TreeFields) -> None:
        """Refuse a configuration this mode cannot draw (``ValueError``, one line)."""

    def max_nodes(self, config: TreeFields) -> int:
        """The most draft tokens one pass can hold (sizes the caches)."""
        raise NotImplementedError

    def max_fed(self, config: TreeFields) -> int:
        """The most nodes one tree feeds through its drafter (the parents it expands)."""
        raise NotImplementedError

    def max_depth(self, config: TreeFields) -> int:
        """The deepest node of a tree."""
        raise NotImplementedError

    def for_call(self, config: Config, depth: int) -> Config:
        """``config`` capped to trees at most ``depth`` deep (``depth <= max_depth``), drawing the same trees."""
        raise NotImplementedError

    def fit_vocab(self, config: Config, vocab_size: int) -> Config:
        """``config`` checked (or, with ``caps_to_vocab``, capped) against a vocabulary of ``vocab_size`` tokens."""
        raise NotImplementedError

    def to_dict(self, config: TreeFields) -> dict[str, Any]:
        """The configuration as plain JSON (``summary.json``'s ``tree``)."""
        raise NotImplementedError


@dataclass(frozen=True)
class PathTree(TreeMode):
    """A fixed tree: ``choices``, paths of top-k ranks (``[[0], [1], [0, 0]]``: the two best first tokens and the
    best continuation of the first)."""

    grows_paths: ClassVar[bool] = True

    def check(self, config: TreeFields) -> None:
        check_choices(config.choices)

    def max_nodes(self, config: TreeFields) -> int:
        return len(config.choices)

    def max_fed(self, config: TreeFields) -> int:
        return len({c[:-1] for c in config.choices if len(c) > 1})

    def max_depth(self, config: TreeFields) -> int:
        return max(len(c) for c in config.choices)

    def for_call(self, config: Config, depth: int) -> Config:
        # no pass drafts deeper than the call has left: deeper paths go
        if depth >= self.max_depth(config):
            return config
        return replace(config, choices=tuple(c for c in config.choices if len(c) <= depth))

    def fit_vocab(self, config: Config, vocab_size: int) -> Config:
        rank = max(r for c in config.choices for r in c)
        if rank < vocab_size:
            return config
        if self.caps_to_vocab:  # a path's descendants hold its ranks too, so what stays is still a tree
            return replace(config, choices=tuple(c for c in config.choices if max(c) < vocab_size))
        raise ValueError(f"tree: {config.mode} path rank {rank} is out of range for a vocabulary of {vocab_size} "
                         f"tokens (ranks are 0..{vocab_size - 1})")

    def to_dict(self, config: TreeFields) -> dict[str, Any]:
        return {"mode": config.mode, "choices": [list(c) for c in config.choices], "nodes": len(config.choices),
                "depth": self.max_depth(config)}


@dataclass(frozen=True)
class TopKTree(TreeMode):
    """A tree grown per pass (EAGLE-2): the ``top_k`` best frontier nodes by cumulative draft log-probability are
    expanded for ``depth`` steps, then the best ``total_tokens`` nodes kept."""

    def max_nodes(self, config: TreeFields) -> int:
        return config.total_tokens

    def max_fed(self, config: TreeFields) -> int:
        return config.top_k * max(config.depth - 1, 0)

    def max_depth(self, config: TreeFields) -> int:
        return config.depth

    def for_call(self, config: Config, depth: int) -> Config:
        # depth d holds at most top_k + (d - 1) * top_k**2 candidates: the root's top_k children, then top_k
        # children of each of the top_k frontier nodes per further depth
        total = min(config.total_tokens, config.top_k + (depth - 1) * config.top_k**2)
        if (depth, total) == (config.depth, config.total_tokens):
            return config
        return replace(config, depth=depth, total_tokens=total)

    def fit_vocab(self, config: Config, vocab_size: int) -> Config:
        if config.top_k <= vocab_size:
            return config
        if self.caps_to_vocab:
            return replace(config, top_k=vocab_size)
        raise ValueError(f"tree: top_k={config.top_k} is more than the vocabulary of {vocab_size} tokens "
                         f"(at most {vocab_size} children per node)")

    def to_dict(self, config: TreeFields) -> dict[str, Any]:
        return {"mode": config.mode, "top_k": config.top_k, "depth": config.depth, "total_tokens": config.total_tokens}


def check_choices(choices: Any) -> None:
    """Refuse paths that are not a tree of ranks: empty, negative ranks, an orphan path, a path listed twice."""
    if not choices:
        raise ValueError("a static tree needs at least one path")
    seen = set()
    for path in choices:
        if not path or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
            raise ValueError(f"a static tree path must be a non-empty list of ranks >= 0, got {list(path)!r}")
        seen.add(tuple(path))
    for path in seen:
        if len(path) > 1 and path[:-1] not in seen:
            raise ValueError(f"static tree path {list(path)} has no parent path {list(path[:-1])} in the tree")
    if len(seen) != len(choices):
        raise ValueError("a static tree lists a path twice")


#: the table: every tree mode by name, in the order help texts list them
TREE_MODES: dict[str, TreeMode] = {}
_BUILTIN: set[str] = set()


def register_mode(mode: TreeMode, *, builtin: bool = False) -> TreeMode:
    """Add a tree mode: ``tree=mode.name`` then parses, and ``--tree`` (``specdec``, ``specdec eval``) offers it.

    Registering a name again replaces its mode; a built-in mode's name, ``"none"``, a name that cannot be typed
    in ``--tree`` or ``defaults`` naming something other than :data:`OPTION_FIELDS` raise ``ValueError``, a
    ``mode`` that is not a :class:`TreeMode` ``TypeError``. Returns ``mode``.
    """
    if not isinstance(mode, TreeMode) or type(mode) is TreeMode:
        raise TypeError(f"a tree mode is a PathTree or TopKTree (or another TreeMode subclass), got {mode!r}")
    if not isinstance(mode.name, str) or mode.name == NONE or not _NAME.fullmatch(mode.name):
        raise ValueError(f"tree mode name must be lowercase letters, digits and '_' (not {NONE!r}), got {mode.name!r}")
    if mode.name in _BUILTIN:
        raise ValueError(f"{mode.name!r} is a built-in tree mode and cannot be registered")
    unknown = set(mode.defaults) - set(OPTION_FIELDS)
    if unknown:
        raise ValueError(f"tree mode {mode.name!r}: unknown defaults {sorted(unknown)}: use {', '.join(OPTION_FIELDS)}")
    if builtin:
        _BUILTIN.add(mode.name)
    TREE_MODES[mode.name] = mode
    return mode


def unregister_mode(name: str) -> None:
    """Remove a registered mode (a built-in one is refused: ``ValueError``); configurations of it stop working."""
    if name in _BUILTIN:
        raise ValueError(f"{name!r} is a built-in tree mode and cannot be removed")
    TREE_MODES.pop(name, None)


def tree_choices() -> tuple[str, ...]:
    """What ``tree=`` / ``--tree`` accept by name: ``"none"`` (chains), then every mode."""
    return (NONE, *TREE_MODES)


def describe_modes() -> str:
    """The modes for help texts: ``"static, dynamic (EAGLE-2), or auto (...)"``."""
    *named, last = [f"{m.name} ({m.help})" if m.help else m.name for m in TREE_MODES.values()]
    return f"{', '.join(named)}, or {last}" if named else last


#: ``auto``'s bounds: the sizer picks depth and size per pass below them
AUTO_BOUNDS = {"top_k": 8, "depth": 8, "total_tokens": 64}

register_mode(PathTree("static"), builtin=True)
register_mode(TopKTree("dynamic", help="EAGLE-2"), builtin=True)
register_mode(TopKTree("auto", help="sized from the verifier's measured cost per pass", defaults=AUTO_BOUNDS,
                       sized_per_pass=True, caps_to_vocab=True), builtin=True)
