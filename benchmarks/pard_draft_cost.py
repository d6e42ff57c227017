"""The draft cost of one pass: a PARD drafter's and a DFlash drafter's one forward against k sequential steps of
``self:int8`` (issue 62).

``self:int8`` and PARD are int8 copies of the embedded SmolLM2-135M (the PARD one with ``pard_token`` set: what it
drafts does not change its cost); DFlash is a one-layer drafter in SmolLM2's hidden size with a block of
``max(ks) + 1`` reading three of its layers (random weights: its cost does not depend on them either), fed the
prompt's features in the same forward (its first pass: an upper bound on a steady pass, which feeds k + 1). Each
proposes k tokens for the same rows after the same prompt; each proposal is timed alone (median of ``--repeats``),
the three alternating. Run on a quiet machine:

    python benchmarks/pard_draft_cost.py --out benchmarks/results/pard/draft-cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specdec.drafters.base import DraftContext, Rows
from specdec.drafters.dflash import DFlashDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.pard import PardDrafter
from specdec.models import load_model
from specdec.quant import quantize
from specdec.training.dflash import DFlashRecipe, new_dflash


def _time(drafter, prompt: torch.Tensor, rows: Rows, k: int, ctx: DraftContext, hidden: dict) -> float:
    d = drafter.for_call()
    if isinstance(drafter, DFlashDrafter):
        d.start(prompt, None, prompt.shape[1] + 64, hidden=hidden[prompt.shape[0]])
    else:
        d.start(prompt, None, prompt.shape[1] + 64)
    t0 = time.perf_counter()
    d.propose(rows, k, ctx)
    seconds = time.perf_counter() - t0
    d.finish()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 6, 8])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, tokenizer = load_model("smollm2", note=None)
    int8 = quantize(model, "int8")
    pard_model = quantize(model, "int8")
    pard_model.config.pard_token = max(tokenizer.get_vocab().values())
    dflash = new_dflash(model, DFlashRecipe(block_size=max(args.ks) + 1), pard_model.config.pard_token).eval()
    drafters = {"self:int8": ModelDrafter(int8), "pard (int8)": PardDrafter(pard_model),
                "dflash (1 layer)": DFlashDrafter(dflash, model)}
    layers = drafters["dflash (1 layer)"].hidden_layers
    text = "Explain in a few sentences why the sky is blue, and what changes at sunset."
    results = []
    with torch.inference_mode():
        for batch in args.batch:
            prompt = tokenizer([text] * batch, return_tensors="pt").input_ids
            states = model(prompt, output_hidden_states=True).hidden_states
            hidden = {batch: torch.cat([states[i] for i in layers], dim=-1)}
            rows = Rows(torch.cat([prompt, prompt[:, -1:]], dim=1), [prompt.shape[1] + 1] * batch)
            ctx = DraftContext(None, False, vocab_size=model.config.vocab_size)
            for k in args.ks:
                times: dict[str, list[float]] = {name: [] for name in drafters}
                for _ in range(args.repeats):
                    for name, drafter in drafters.items():  # alternating, so drift hits both alike
                        times[name].append(_time(drafter, prompt, rows, k, ctx, hidden))
                row = {"batch": batch, "k": k, **{f"{n} ms": round(1000 * statistics.median(t), 2) for n, t in times.items()}}
                row["pard / self:int8"] = round(row["pard (int8) ms"] / row["self:int8 ms"], 3)
                row["dflash / self:int8"] = round(row["dflash (1 layer) ms"] / row["self:int8 ms"], 3)
                print(row, flush=True)
                results.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python benchmarks/pard_draft_cost.py " + " ".join(
                f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in vars(args).items() if v is not None), "torch_threads": torch.get_num_threads(),
                "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
