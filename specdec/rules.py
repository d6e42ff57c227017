"""Verification rules by name: what ``verify=`` / ``--verify`` take and which drafts each verifies (torch-free, so
the CLI and ``specdec eval`` check names early).

- ``"token"`` (the default): draft by draft, chains and trees (per-node rejection sampling down a tree);
- ``"block"``: a sampled chain judged as a block (Sun et al. 2024), chains only;
- ``"traversal"``: a tree judged leaf first, whole paths weighed (Weng et al. 2025), trees only; a chain that
  ``tree="auto"`` drafts in its place is verified as a block, which is what traversal is on a chain.

Under greedy decoding every rule commits the same tokens. The functions are :data:`specdec.acceptance.CHAIN_RULES`
and :data:`specdec.verification.TREE_RULES`.
"""

from __future__ import annotations

CHAIN, TREE = "chain", "tree"
#: rule name -> the kinds of drafts it verifies
RULES: dict[str, tuple[str, ...]] = {"token": (CHAIN, TREE), "block": (CHAIN,), "traversal": (TREE,)}
#: what a rule for trees runs on a chain pass (``tree="auto"`` under sampling may draft a chain instead of a tree)
ON_CHAINS = {"traversal": "block"}


def applies(rule: str, tree: bool) -> bool:
    """Whether ``rule`` verifies trees (``tree``) or chains."""
    return (TREE if tree else CHAIN) in RULES.get(rule, ())


def check_rule(verify: str, tree: bool) -> str:
    """``verify=`` checked against the call's drafts (a tree or chains); a one-line ``ValueError`` otherwise."""
    if verify not in RULES:
        raise ValueError(f"verify={verify!r}: choose one of {', '.join(map(repr, RULES))}")
    if not applies(verify, tree):
        if tree:
            raise ValueError(f"verify={verify!r} verifies chains; a tree's rules are 'token' (node by node) and "
                             "'traversal' (leaf first): leave out tree= or choose one of those")
        raise ValueError(f"verify={verify!r} verifies trees; a chain's rules are 'token' and 'block': pass tree= "
                         "or choose one of those")
    return verify


def chain_rule(rule: str) -> str:
    """The rule a chain pass runs under the call's ``rule``."""
    return ON_CHAINS.get(rule, rule)


def rules_for(rules: list[str], tree: bool) -> list[str]:
    """Of ``rules``, those that verify this kind of drafts (``["token"]`` if none does): ``specdec eval`` runs
    each of its methods under each rule that applies."""
    return [r for r in rules if applies(r, tree)] or ["token"]
