"""Tree configurations: what ``tree=`` / ``--tree`` accept (torch-free, so the CLI checks them early).

- ``"none"`` / ``None``: chains of ``k`` drafts (the default).
- ``"static"`` or a list of paths of top-k ranks (Medusa / EAGLE-1 "choices"): ``[[0], [1], [0, 0]]`` is a
  tree with the two best first tokens and the best continuation of the first.
- ``"dynamic"`` (EAGLE-2): expand the ``top_k`` best frontier nodes by cumulative draft log-probability
  for ``depth`` steps, then keep the best ``total_tokens`` nodes.
- ``"auto"``: a dynamic tree sized per pass from the verifier's measured cost against the number of tokens
  in a pass and the drafter's calibrated confidence (:mod:`specdec.trees.auto`).

Each mode is one declaration in :mod:`specdec.trees.modes` (its defaults, counts, caps and checks); this module
reads that table and branches on no mode name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specdec.trees.modes import LISTED_PATHS, NONE, TREE_MODES, TreeMode, tree_choices

#: the default static tree: 2 first tokens, the best path 5 deep, second choices along its first steps (12 nodes)
DEFAULT_CHOICES: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0), (0, 0, 0, 1),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0),
)


@dataclass(frozen=True)
class TreeConfig:
    """One tree configuration (see the module docstring). ``choices`` only for ``static``; ``top_k``,
    ``depth`` and ``total_tokens`` for ``dynamic`` (``auto`` treats them as upper bounds). What each depends
    on is the mode's declaration (:attr:`tree_mode`)."""

    mode: str = "dynamic"
    choices: tuple[tuple[int, ...], ...] = field(default=DEFAULT_CHOICES)
    top_k: int = 4
    depth: int = 5
    total_tokens: int = 16

    def __post_init__(self) -> None:
        if self.mode not in TREE_MODES:
            raise ValueError(f"tree mode must be one of {tuple(TREE_MODES)}, got {self.mode!r}")
        for name in ("top_k", "depth", "total_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"tree {name} must be a positive integer, got {value!r}")
        self.tree_mode.check(self)

    @property
    def tree_mode(self) -> TreeMode:
        """The declaration of :attr:`mode` (:data:`specdec.trees.modes.TREE_MODES`)."""
        return TREE_MODES[self.mode]

    @property
    def max_nodes(self) -> int:
        """The most draft tokens one pass can hold (sizes the caches)."""
        return self.tree_mode.max_nodes(self)

    @property
    def max_fed(self) -> int:
        """The most nodes one tree feeds through its drafter (the parents it expands)."""
        return self.tree_mode.max_fed(self)

    @property
    def extra_slots(self) -> int:
        """Cache slots a tree pass may need past a chain's: the verifier scores every node, and a model
        drafter writes every node it expands, whatever the depth left in the call."""
        return self.max_nodes + self.max_fed + 1

    @property
    def max_depth(self) -> int:
        """The deepest node of a tree."""
        return self.tree_mode.max_depth(self)

    def for_call(self, new_tokens: int) -> "TreeConfig":
        """This configuration capped to what a call of ``new_tokens`` new tokens can use, so caches are sized by
        the call rather than by the configured depth (``depth=10**7`` would otherwise ask for tens of GiB).

        No pass drafts deeper than the tokens the call has left, so deeper static paths go and ``depth`` is
        capped; a dynamic tree of depth ``d`` has at most ``top_k + (d - 1) * top_k**2`` candidates (the root's
        ``top_k`` children, then ``top_k`` children of each of the ``top_k`` frontier nodes per further depth),
        which caps ``total_tokens``. The trees drawn are the same as with the uncapped configuration.
        """
        if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or new_tokens < 0:
            raise ValueError(f"new_tokens must be a non-negative integer, got {new_tokens!r}")
        return self.tree_mode.for_call(self, max(1, min(self.max_depth, new_tokens)))

    def fit_vocab(self, vocab_size: int) -> "TreeConfig":
        """Check this tree against a vocabulary of ``vocab_size`` tokens: a node's children are its drafter's
        top-ranked tokens, so a static rank or a ``top_k`` past the vocabulary cannot be drawn. ``static`` and
        ``dynamic`` raise a one-line ``ValueError`` (the user chose those numbers); ``auto`` treats its numbers
        as upper bounds and is capped to the vocabulary instead (:attr:`TreeMode.caps_to_vocab`)."""
        return self.tree_mode.fit_vocab(self, vocab_size)

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain JSON (``summary.json``'s ``tree``)."""
        return self.tree_mode.to_dict(self)


def parse_tree(value: Any) -> TreeConfig | None:
    """``tree=`` as given by a user -> a :class:`TreeConfig`, or ``None`` for chains.

    Accepts ``None``, ``"none"``, a mode's name (``"static"``, ``"dynamic"``, ``"auto"``: its declared
    defaults), a list of paths (static), a dict of :class:`TreeConfig` fields, or a :class:`TreeConfig`.
    """
    if value is None or value == NONE:
        return None
    if isinstance(value, TreeConfig):
        return value
    if isinstance(value, str):
        if value not in TREE_MODES:
            raise ValueError(f"tree must be one of {'|'.join(tree_choices())}, a list of paths or a dict, "
                             f"got {value!r}")
        return TreeConfig(mode=value, **TREE_MODES[value].defaults)
    if isinstance(value, dict):
        options = dict(value)
        if "choices" in options:
            options["choices"] = tuple(tuple(p) for p in options["choices"])
            options.setdefault("mode", LISTED_PATHS)
        unknown = set(options) - {"mode", "choices", "top_k", "depth", "total_tokens"}
        if unknown:
            raise ValueError(f"unknown tree options {sorted(unknown)}: use mode, choices, top_k, depth, total_tokens")
        return TreeConfig(**options)
    if isinstance(value, (list, tuple)):
        if not all(isinstance(p, (list, tuple)) for p in value):
            raise ValueError(f"a static tree is a list of paths of ranks, e.g. [[0], [1], [0, 0]]; got {value!r}")
        return TreeConfig(mode=LISTED_PATHS, choices=tuple(tuple(p) for p in value))
    raise ValueError(f"tree must be one of {'|'.join(tree_choices())}, a list of paths or a dict, "
                     f"got {type(value).__name__}")
