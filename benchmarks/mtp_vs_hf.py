"""``draft="mtp"`` against transformers' ``generate(use_mtp=True)`` and plain ``generate``, in one run, batch 1.

One tiny random DeepSeek-V3 checkpoint with MTP weights (``tests/test_mtp_drafter.write_mtp_checkpoint``: saved
and reloaded with ``from_pretrained``, the real loading path); each method generates the same greedy continuation
of the same prompts, ``--repeats`` times after a warm-up, and the best time counts. Reported per method: ms per
new token, tokens per verify pass (specdec: its stats; transformers: new tokens over its candidate generator's
calls after the prefill), and whether its output equals plain ``generate``'s.

Random MTP layers draft nearly nothing the verifier accepts, so tokens per pass stay near 1 and this measures
the cost of drafting and verifying with them: the engine's overhead against transformers' on the same weights,
not the speedup of a trained model's MTP layers.

    .venv/bin/python benchmarks/mtp_vs_hf.py --json benchmarks/results/mtp_vs_hf.json
    .venv/bin/python benchmarks/mtp_vs_hf.py --mtp-layers 2 --k 1 2 4 --new-tokens 64 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

REPO = Path(__file__).resolve().parents[1]
for path in (REPO, REPO / "tests"):  # specdec from the checkout; the checkpoint writer from the tests
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import transformers as tf  # noqa: E402
from transformers.generation import candidate_generator  # noqa: E402

import specdec  # noqa: E402
from specdec.drafters.mtp import checkpoint_mtp_patterns  # noqa: E402
from test_mtp_drafter import write_mtp_checkpoint  # noqa: E402


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best wall seconds of ``repeats`` calls after one warm-up, and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def _hf_mtp_passes(model: Any, prompt: torch.Tensor, new: int) -> tuple[torch.Tensor, int]:
    """``generate(use_mtp=True)`` once, counting its verify passes (candidate generator calls after the prefill)."""
    calls = []
    original = candidate_generator.MTPCandidateGenerator.get_candidates

    def counting(self, input_ids, *args, **kwargs):
        ids, logits = original(self, input_ids, *args, **kwargs)
        calls.append(logits is not None)
        return ids, logits

    candidate_generator.MTPCandidateGenerator.get_candidates = counting
    try:
        with checkpoint_mtp_patterns(model):
            out = model.generate(prompt, max_new_tokens=new, do_sample=False, use_mtp=True)
    finally:
        candidate_generator.MTPCandidateGenerator.get_candidates = original
    return out, sum(calls)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtp-layers", type=int, default=1, help="MTP layers of the tiny checkpoint (default 1)")
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2], help="specdec draft lengths (default 1 2)")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "tiny-deepseek-v3-mtp"
        write_mtp_checkpoint(directory, "deepseek_v3", args.mtp_layers)
        model = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        gen = torch.Generator(device="cpu").manual_seed(0)
        prompts = [torch.randint(3, 96, (1, 8 + 4 * i), generator=gen, device="cpu") for i in range(args.prompts)]
        new = args.new_tokens
        plain_out = [model.generate(p, max_new_tokens=new, do_sample=False) for p in prompts]

        results: dict[str, dict[str, Any]] = {}

        def record(name: str, seconds: list[float], outs: list[torch.Tensor], per_pass: float) -> None:
            tokens = sum(o.shape[1] - p.shape[1] for o, p in zip(outs, prompts))
            results[name] = {"ms_per_token": round(1000 * sum(seconds) / tokens, 3), "tokens_per_pass": round(per_pass, 3),
                             "identical": all(torch.equal(o, r) for o, r in zip(outs, plain_out))}

        timed = [_timed(lambda p=p: model.generate(p, max_new_tokens=new, do_sample=False), args.repeats) for p in prompts]
        record("generate", [t for t, _ in timed], [o for _, o in timed], 1.0)

        timed = [_timed(lambda p=p: _hf_mtp_passes(model, p, new), args.repeats) for p in prompts]
        passes = [o[1] for _, o in timed]
        outs = [o[0] for _, o in timed]
        record("generate(use_mtp=True)", [t for t, _ in timed], outs,
               sum(o.shape[1] - p.shape[1] - 1 for o, p in zip(outs, prompts)) / max(sum(passes), 1))

        for k in args.k:
            spec = specdec.SpeculativeModel(model, "mtp", num_draft_tokens=k)
            timed, per_pass = [], []
            for p in prompts:
                timed.append(_timed(lambda p=p: spec.generate(p, max_new_tokens=new, do_sample=False), args.repeats))
                stats = spec.last_stats
                per_pass.append((sum(stats.committed_per_step)) / max(stats.verifier_forwards, 1))
            record(f"specdec mtp k={k}", [t for t, _ in timed], [o for _, o in timed], statistics.mean(per_pass))

    meta = {"torch": torch.__version__, "transformers": tf.__version__, "device": "cpu",
            "threads": torch.get_num_threads(), "mtp_layers": args.mtp_layers, "new_tokens": new,
            "prompts": args.prompts, "repeats": args.repeats}
    base = results["generate(use_mtp=True)"]["ms_per_token"]
    print(f"tiny DeepSeek-V3, {args.mtp_layers} MTP layer(s), batch 1, {new} new tokens x {args.prompts} prompts, "
          f"best of {args.repeats} (transformers {tf.__version__}, torch {torch.__version__}, CPU)")
    print(f"{'method':<26}{'ms/token':>10}{'tokens/pass':>13}{'vs use_mtp':>12}  identical")
    for name, r in results.items():
        print(f"{name:<26}{r['ms_per_token']:>10.2f}{r['tokens_per_pass']:>13.2f}{base / r['ms_per_token']:>11.2f}x  "
              f"{r['identical']}")
    report = {"meta": meta, "results": results}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
