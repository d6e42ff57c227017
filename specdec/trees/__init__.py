"""Tree drafts: configurations, the tree proposal, growing trees, acceptance over trees, ``auto`` sizing.

See docs/design.md ("Trees"). torch-free at import: :mod:`specdec.trees.config` is what the CLI reads, and
:mod:`specdec.trees.modes` the table of tree modes it parses.
"""

from typing import Any

from specdec.trees.config import DEFAULT_CHOICES, TreeConfig, parse_tree
from specdec.trees.modes import TREE_MODES, PathTree, TopKTree, TreeMode, register_mode, tree_choices, unregister_mode

__all__ = ["DEFAULT_CHOICES", "MODES", "TREE_MODES", "PathTree", "TopKTree", "TreeConfig", "TreeMode", "parse_tree",
           "register_mode", "tree_choices", "unregister_mode"]


def __getattr__(name: str) -> Any:
    # MODES was a constant tuple of names; read from the table now, so modes registered later show too
    if name == "MODES":
        return tree_choices()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
