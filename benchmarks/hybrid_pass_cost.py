"""What a verify pass costs on a hybrid model (Gated DeltaNet + attention) against a dense model of the same size.

Issue 60's target: a hybrid's verify pass, with what its exact rollback needs (the states it keeps per position, the
selection of the accepted one), costs at most 1.15x transformers' bare forward of the same hybrid and width, with all
drafts accepted and with some rejected (``vs bare`` below). One run builds two random-weight models of the same hidden size, depth and attention:
a ``qwen3_next`` hybrid (three Gated DeltaNet layers to one attention layer, as the real model) and a dense
``qwen3`` (attention everywhere), and for each times greedy calls through an oracle drafter
(:class:`specdec.drafters.oracle.OracleDrafter`: drafting costs nothing, so the time is the verifier's passes):

- ``accept-all``: every draft accepted: each pass pays its forward and, on the hybrid, one state checkpoint;
- ``reject-some``: the oracle's tokens are corrupted every ``--corrupt`` positions, so rows reject drafts mid-pass:
  the hybrid then also selects each such row's state after its last kept token.

It reports ms per verify pass (best of ``--repeats`` calls), the hybrid/dense ratio of each, and, as the floor, the
hybrid's and the dense model's bare transformers forward of ``k + 1`` tokens over their own ``DynamicCache`` (no
specdec code), so that what specdec adds is visible apart from what a Gated DeltaNet costs by itself. Also the
recurrent state per row the planner counts (:func:`specdec.sizing.state.state_bytes_per_row`).

    .venv/bin/python benchmarks/hybrid_pass_cost.py                 # hidden 256, 8 layers, k=4, batch 1 and 4
    .venv/bin/python benchmarks/hybrid_pass_cost.py --quick         # a short check that it runs
    .venv/bin/python benchmarks/hybrid_pass_cost.py --json out.json

Times are trends on a busy machine; compare only numbers from one run.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import transformers as tf

from specdec import SpeculativeModel
from specdec.drafters.oracle import OracleDrafter
from specdec.sizing.state import state_bytes_per_row


def models(hidden: int, layers: int, seed: int = 0) -> dict[str, torch.nn.Module]:
    """A qwen3_next hybrid and its dense qwen3 twin (same hidden size, depth, attention heads, MLP)."""
    heads = max(hidden // 64, 2)
    common = dict(vocab_size=512, hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=max(heads // 2, 1), head_dim=64,
                  initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    configs = {
        "hybrid": tf.Qwen3NextConfig(**common, layer_types=types, num_experts=0, linear_conv_kernel_dim=4,
                                     linear_key_head_dim=64, linear_value_head_dim=64,
                                     linear_num_key_heads=heads, linear_num_value_heads=heads),
        "dense": tf.Qwen3Config(**common),
    }
    out = {}
    for name, config in configs.items():
        torch.manual_seed(seed)
        out[name] = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return out


def prompts(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 512, (batch, length), generator=torch.Generator().manual_seed(seed))


def pass_ms(model: torch.nn.Module, ids: torch.Tensor, k: int, new: int, corrupt: int, repeats: int) -> dict:
    """ms per verify pass of greedy calls through an oracle (every ``corrupt``-th expected token wrong, 0: none)."""
    expected = model.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None)
    if corrupt:
        expected = expected.clone()
        at = torch.arange(ids.shape[1] + corrupt - 1, expected.shape[1], corrupt)
        expected[:, at] = (expected[:, at] + 1) % 512
    spec = SpeculativeModel(model, OracleDrafter(expected), num_draft_tokens=k)
    best, stats = float("inf"), None
    for _ in range(repeats + 1):  # the first call warms up
        start = time.perf_counter()
        spec.generate(ids, max_new_tokens=new, do_sample=False, eos_token_id=None)
        elapsed = time.perf_counter() - start
        if stats is not None:
            best = min(best, elapsed / spec.last_stats.verifier_forwards)
        stats = spec.last_stats
    return {"ms_per_pass": best * 1000, "passes": stats.verifier_forwards, "acceptance": stats.acceptance_rate}


@torch.inference_mode()
def bare_ms(model: torch.nn.Module, ids: torch.Tensor, k: int, repeats: int) -> float:
    """ms of a plain transformers forward of ``k + 1`` tokens after the prompt (its own DynamicCache)."""
    best = float("inf")
    for _ in range(repeats + 1):
        cache = tf.DynamicCache(config=model.config)
        model(ids, past_key_values=cache, use_cache=True)
        start = time.perf_counter()
        model(ids[:, : k + 1], past_key_values=cache, use_cache=True)
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--corrupt", type=int, default=3, help="every N-th oracle token is wrong in reject-some")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small and short: check that it runs")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.layers, args.new, args.repeats, args.batch = 128, 4, 16, 1, [1]
    built = models(args.hidden, args.layers)
    results: dict = {"config": vars(args), "transformers": tf.__version__, "torch": torch.__version__,
                     "state_bytes_per_row_bf16": {
                         "live": state_bytes_per_row(built["hybrid"].config, "bfloat16", checkpoints=0, tokens=0),
                         "verifier_with_rollback": state_bytes_per_row(built["hybrid"].config, "bfloat16", 1, args.k + 1),
                     }, "batches": {}}
    for batch in args.batch:
        ids = prompts(batch, args.prompt)
        row: dict = {}
        for mode, corrupt in (("accept-all", 0), ("reject-some", args.corrupt)):
            row[mode] = {name: pass_ms(m, ids, args.k, args.new, corrupt, args.repeats) for name, m in built.items()}
            row[mode]["ratio"] = row[mode]["hybrid"]["ms_per_pass"] / row[mode]["dense"]["ms_per_pass"]
        row["bare"] = {name: bare_ms(m, ids, args.k, args.repeats) for name, m in built.items()}
        row["bare"]["ratio"] = row["bare"]["hybrid"] / row["bare"]["dense"]
        for mode in ("accept-all", "reject-some"):
            row[mode]["hybrid_vs_bare"] = row[mode]["hybrid"]["ms_per_pass"] / row["bare"]["hybrid"]
        results["batches"][batch] = row
        print(f"batch {batch}: ms per verify pass of {args.k + 1} tokens, hybrid / dense")
        for mode in ("accept-all", "reject-some"):
            r = row[mode]
            print(f"  {mode:12s} hybrid {r['hybrid']['ms_per_pass']:7.2f}  dense {r['dense']['ms_per_pass']:7.2f}  "
                  f"ratio {r['ratio']:.2f}  vs bare {r['hybrid_vs_bare']:.2f}  "
                  f"(acceptance {r['hybrid']['acceptance']:.2f} / {r['dense']['acceptance']:.2f})")
        print(f"  {'bare forward':12s} hybrid {row['bare']['hybrid']:7.2f}  dense {row['bare']['dense']:7.2f}  "
              f"ratio {row['bare']['ratio']:.2f}  (transformers alone, no specdec)")
    print("recurrent state per row (bf16):", results["state_bytes_per_row_bf16"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
