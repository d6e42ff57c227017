"""What a sampled chain's acceptance rule costs on the host, per verify pass: ``token`` against ``block``.

``python benchmarks/verify_rule_cost.py [--vocab 49152] [-k 6] [--batch 1] [--repeats 200]`` prints the median
milliseconds of each rule (``specdec.acceptance.CHAIN_RULES``) over random distributions of that shape.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.acceptance import CHAIN_RULES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("-k", type=int, default=6)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    g = torch.Generator(device="cpu").manual_seed(0)
    target = torch.softmax(torch.randn(args.batch, args.k + 1, args.vocab, generator=g) * 3, dim=-1)
    draft = torch.softmax(torch.randn(args.batch, args.k, args.vocab, generator=g) * 3, dim=-1)
    drafts = torch.multinomial(draft.view(-1, args.vocab), 1, generator=g).view(args.batch, args.k)
    times: dict[str, list[float]] = {name: [] for name in CHAIN_RULES}
    for _ in range(args.repeats):
        for name, rule in CHAIN_RULES.items():  # interleaved, so noise hits both alike
            t0 = time.perf_counter()
            rule(drafts, draft, target, g)
            times[name].append((time.perf_counter() - t0) * 1e3)
    for name, ms in times.items():
        print(f"{name:6s} {statistics.median(ms):7.3f} ms  (batch {args.batch}, k {args.k}, vocab {args.vocab})")


if __name__ == "__main__":
    main()
