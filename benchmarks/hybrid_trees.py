"""Tree drafts on hybrid models: tokens committed per verify pass, chain against tree at the same k.

Issue 60's target: on a tiny ``qwen3_next`` and ``nemotron_h`` (tests/tiny_hybrids.py) with a ``self:bf16`` drafter, a
static tree commits more tokens a pass than the chain of the same k, and every output equals ``generate``'s. Each
model drafts the same prompts greedily as a chain and as ``tree="static"``, ``"dynamic"`` and ``"auto"`` trees; the
script reports tokens per verify pass (committed tokens / verify passes, over the batch) and checks identity.

    .venv/bin/python benchmarks/hybrid_trees.py                   # k=4, 4 prompts of 48 new tokens
    .venv/bin/python benchmarks/hybrid_trees.py --json out.json

Counts, not times: they do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny_hybrids import make_hybrid  # noqa: E402
from tiny_models import VOCAB  # noqa: E402

import specdec  # noqa: E402

MODES = (None, "static", "dynamic", "auto")


def run(arch: str, k: int, prompts: int, new: int, seed: int = 0) -> dict:
    """Tokens per verify pass of a chain and each tree mode on ``arch``, with identity to ``generate``."""
    model = make_hybrid(arch, seed)
    ids = torch.randint(3, VOCAB, (prompts, 12), generator=torch.Generator().manual_seed(seed))
    kwargs = dict(max_new_tokens=new, do_sample=False, eos_token_id=None)
    expected = model.generate(ids, **kwargs)
    out = {}
    for tree in MODES:
        spec = specdec.SpeculativeModel(model, "self:bf16", num_draft_tokens=k, **({"tree": tree} if tree else {}))
        got = spec.generate(ids, **kwargs)
        stats = spec.last_stats
        committed = int((got.shape[1] - ids.shape[1]) * got.shape[0])
        out[tree or "chain"] = {"identical": bool(torch.equal(got, expected)), "verify_passes": stats.verifier_forwards,
                                "tokens_per_pass": committed / stats.verifier_forwards / got.shape[0],
                                "acceptance": stats.acceptance_rate}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", nargs="+", default=["qwen3_next", "nemotron_h"])
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new", type=int, default=48)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = {"config": vars(args), "torch": torch.__version__, "archs": {}}
    for arch in args.archs:
        results["archs"][arch] = row = run(arch, args.k, args.prompts, args.new)
        chain = row["chain"]["tokens_per_pass"]
        for mode, r in row.items():
            print(f"{arch:12s} {mode:8s} tokens/pass {r['tokens_per_pass']:.2f} ({r['tokens_per_pass'] / chain:.2f}x "
                  f"the chain)  passes {r['verify_passes']:3d}  identical {r['identical']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
