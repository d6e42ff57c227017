"""Tree configurations: what ``tree=`` / ``--tree`` accept (torch-free, so the CLI checks them early).

- ``"none"`` / ``None``: chains of ``k`` drafts (the default).
- ``"static"`` or a list of paths of top-k ranks (Medusa / EAGLE-1 "choices"): ``[[0], [1], [0, 0]]`` is a
  tree with the two best first tokens and the best continuation of the first.
- ``"dynamic"`` (EAGLE-2): expand the ``top_k`` best frontier nodes by cumulative draft log-probability
  for ``depth`` steps, then keep the best ``total_tokens`` nodes.
- ``"auto"``: a dynamic tree sized per pass from the verifier's measured cost against the number of tokens
  in a pass and the drafter's calibrated confidence (:mod:`specdec.trees.sizing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

MODES = ("none", "static", "dynamic", "auto")

#: the default static tree: 2 first tokens, the best path 5 deep, second choices along its first steps (12 nodes)
DEFAULT_CHOICES: tuple[tuple[int, ...], ...] = (
    (0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0), (0, 0, 0, 1),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 0),
)


#: ``auto``'s bounds: the sizer picks depth and size per pass below them
AUTO_BOUNDS = {"top_k": 8, "depth": 8, "total_tokens": 64}


@dataclass(frozen=True)
class TreeConfig:
    """One tree configuration (see the module docstring). ``choices`` only for ``static``; ``top_k``,
    ``depth`` and ``total_tokens`` for ``dynamic`` (``auto`` treats them as upper bounds)."""

    mode: str = "dynamic"
    choices: tuple[tuple[int, ...], ...] = field(default=DEFAULT_CHOICES)
    top_k: int = 4
    depth: int = 5
    total_tokens: int = 16

    def __post_init__(self) -> None:
        if self.mode not in MODES[1:]:
            raise ValueError(f"tree mode must be one of {MODES[1:]}, got {self.mode!r}")
        for name in ("top_k", "depth", "total_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"tree {name} must be a positive integer, got {value!r}")
        if self.mode == "static":
            _check_choices(self.choices)

    @property
    def max_nodes(self) -> int:
        """The most draft tokens one pass can hold (sizes the caches)."""
        return len(self.choices) if self.mode == "static" else self.total_tokens

    @property
    def max_fed(self) -> int:
        """The most nodes one tree feeds through its drafter (the parents it expands)."""
        if self.mode == "static":
            return len({c[:-1] for c in self.choices if len(c) > 1})
        return self.top_k * max(self.depth - 1, 0)

    @property
    def extra_slots(self) -> int:
        """Cache slots a tree pass may need past a chain's: the verifier scores every node, and a model
        drafter writes every node it expands, whatever the depth left in the call."""
        return self.max_nodes + self.max_fed + 1

    @property
    def max_depth(self) -> int:
        return max(len(c) for c in self.choices) if self.mode == "static" else self.depth

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
        depth = max(1, min(self.max_depth, new_tokens))
        if self.mode == "static":
            if depth >= self.max_depth:
                return self
            return replace(self, choices=tuple(c for c in self.choices if len(c) <= depth))
        total = min(self.total_tokens, self.top_k + (depth - 1) * self.top_k**2)
        if (depth, total) == (self.depth, self.total_tokens):
            return self
        return replace(self, depth=depth, total_tokens=total)

    def fit_vocab(self, vocab_size: int) -> "TreeConfig":
        """Check this tree against a vocabulary of ``vocab_size`` tokens: a node's children are its drafter's
        top-ranked tokens, so a static rank or a ``top_k`` past the vocabulary cannot be drawn. ``static`` and
        ``dynamic`` raise a one-line ``ValueError`` (the user chose those numbers); ``auto`` treats its numbers
        as upper bounds and is capped to the vocabulary instead."""
        if self.mode == "static":
            rank = max(r for c in self.choices for r in c)
            if rank >= vocab_size:
                raise ValueError(f"tree: static path rank {rank} is out of range for a vocabulary of {vocab_size} "
                                 f"tokens (ranks are 0..{vocab_size - 1})")
            return self
        if self.top_k <= vocab_size:
            return self
        if self.mode == "auto":
            return replace(self, top_k=vocab_size)
        raise ValueError(f"tree: top_k={self.top_k} is more than the vocabulary of {vocab_size} tokens "
                         f"(at most {vocab_size} children per node)")

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain JSON (``summary.json``'s ``tree``)."""
        if self.mode == "static":
            return {"mode": "static", "choices": [list(c) for c in self.choices], "nodes": len(self.choices),
                    "depth": self.max_depth}
        return {"mode": self.mode, "top_k": self.top_k, "depth": self.depth, "total_tokens": self.total_tokens}


def _check_choices(choices: Any) -> None:
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


def parse_tree(value: Any) -> TreeConfig | None:
    """``tree=`` as given by a user -> a :class:`TreeConfig`, or ``None`` for chains.

    Accepts ``None``, ``"none"``, ``"static"``, ``"dynamic"``, ``"auto"``, a list of paths (static), a dict
    of :class:`TreeConfig` fields, or a :class:`TreeConfig`.
    """
    if value is None or value == "none":
        return None
    if isinstance(value, TreeConfig):
        return value
    if isinstance(value, str):
        if value not in MODES:
            raise ValueError(f"tree must be one of {'|'.join(MODES)}, a list of paths or a dict, got {value!r}")
        return TreeConfig(mode=value, **AUTO_BOUNDS) if value == "auto" else TreeConfig(mode=value)
    if isinstance(value, dict):
        options = dict(value)
        if "choices" in options:
            options["choices"] = tuple(tuple(p) for p in options["choices"])
            options.setdefault("mode", "static")
        unknown = set(options) - {"mode", "choices", "top_k", "depth", "total_tokens"}
        if unknown:
            raise ValueError(f"unknown tree options {sorted(unknown)}: use mode, choices, top_k, depth, total_tokens")
        return TreeConfig(**options)
    if isinstance(value, (list, tuple)):
        if not all(isinstance(p, (list, tuple)) for p in value):
            raise ValueError(f"a static tree is a list of paths of ranks, e.g. [[0], [1], [0, 0]]; got {value!r}")
        return TreeConfig(mode="static", choices=tuple(tuple(p) for p in value))
    raise ValueError(f"tree must be one of {'|'.join(MODES)}, a list of paths or a dict, got {type(value).__name__}")
