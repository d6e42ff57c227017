"""What an acceptance rule costs on the host, per verify pass: a sampled chain's ``token`` against ``block``, and a
sampled tree's ``token`` against ``traversal``.

``python benchmarks/verify_rule_cost.py [--vocab 49152] [-k 6] [--batch 1] [--repeats 200]`` prints the median
milliseconds of each rule (``specdec.acceptance.CHAIN_RULES``, ``specdec.verification.TREE_RULES``) over random
distributions of that shape; the trees are the default static shape (``specdec.trees.DEFAULT_CHOICES``, 12 nodes),
with sampled nodes (each with its law) and with top-ranked ones (one-hot laws).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.acceptance import CHAIN_RULES
from specdec.trees import DEFAULT_CHOICES
from specdec.trees.build import _static_plan
from specdec.trees.tree import DraftTree
from specdec.verification import TREE_RULES


def _time(rules: dict, args_of: dict, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in rules}
    for _ in range(repeats):
        for name, rule in rules.items():  # interleaved, so noise hits all alike
            t0 = time.perf_counter()
            rule(*args_of[name])
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(ms) for name, ms in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("-k", type=int, default=6)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    g = torch.Generator(device="cpu").manual_seed(0)
    b, v = args.batch, args.vocab
    target = torch.softmax(torch.randn(b, args.k + 1, v, generator=g) * 3, dim=-1)
    draft = torch.softmax(torch.randn(b, args.k, v, generator=g) * 3, dim=-1)
    drafts = torch.multinomial(draft.view(-1, v), 1, generator=g).view(b, args.k)
    chain = _time(CHAIN_RULES, {name: (drafts, draft, target, g) for name in CHAIN_RULES}, args.repeats)
    for name, ms in chain.items():
        print(f"chain {name:9s} {ms:7.3f} ms  (batch {b}, k {args.k}, vocab {v})")
    parents = _static_plan(DEFAULT_CHOICES)[2]
    n = len(parents)
    laws = torch.softmax(torch.randn(b, n, v, generator=g) * 3, dim=-1)
    tokens = torch.multinomial(laws.view(-1, v), 1, generator=g).view(b, n)
    tree_target = torch.softmax(torch.randn(b, n + 1, v, generator=g) * 3, dim=-1)
    for kind, probs in (("sampled", laws), ("top-ranked", None)):
        tree = DraftTree.from_host(tokens, [list(parents)] * b)
        tree.probs = probs
        ms = _time(TREE_RULES, {name: (tree, tree_target, g) for name in TREE_RULES}, args.repeats)
        for name, t in ms.items():
            print(f"tree  {name:9s} {t:7.3f} ms  ({kind} nodes: {n}, batch {b}, vocab {v})")


if __name__ == "__main__":
    main()
