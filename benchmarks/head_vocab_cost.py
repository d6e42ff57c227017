"""Draft step cost of an EAGLE-3 head by draft-vocabulary size, against the verifier's step (issue 24: size the
draft vocabulary by coverage *and* cost). Random heads of the embedded model's shape, one per size, each measured
by ``benchmarks/head_cost.py`` in its own process; quiet machine.

    python benchmarks/head_vocab_cost.py --sizes 4096 8192 16384 32768 49152 --out benchmarks/results/heads/vocab_cost.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from specdec.heads import EagleHead, HeadConfig, save_head
from specdec.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 49152])
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    model, _ = load_model("smollm2")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            config = HeadConfig.for_verifier(model.config, "eagle3", draft_vocab_size=size)
            torch.manual_seed(0)
            head = EagleHead(config)
            keep = torch.randperm(config.vocab_size, device="cpu")[:size].sort().values
            head.d2t.copy_(keep - torch.arange(size, device="cpu"))
            head.t2d.zero_()
            head.t2d[keep] = True
            directory = save_head(head, Path(tmp) / str(size), dtype=torch.float32)
            out = subprocess.run([sys.executable, str(Path(__file__).with_name("head_cost.py")), "--draft",
                                  f"eagle:{directory}", "--context", str(args.context), "--repeats",
                                  str(args.repeats), "--json"], capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"draft_vocab": size, **result})
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": "python benchmarks/head_vocab_cost.py " + " ".join(sys.argv[1:]),
                                    "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
