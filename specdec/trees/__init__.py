"""Tree drafts: configurations, the tree proposal, growing trees, acceptance over trees, ``auto`` sizing.

See docs/design.md ("Trees"). torch-free at import: :mod:`specdec.trees.config` is what the CLI reads.
"""

from specdec.trees.config import DEFAULT_CHOICES, MODES, TreeConfig, parse_tree

__all__ = ["DEFAULT_CHOICES", "MODES", "TreeConfig", "parse_tree"]
