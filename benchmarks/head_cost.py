"""Cost of one draft step of a head against one verifier step, on this machine (medians, same process).

    python benchmarks/head_cost.py --draft eagle --context 300 --repeats 50

Measures, at a context of ``--context`` tokens: the verifier decoding one token (its managed cache,
as specdec runs it), the verifier verifying ``k + 1`` tokens (with the hidden states the head reads),
and the head drafting one token from its own cache (embedding, layer, draft-vocabulary lm_head, argmax).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import LogitsProcessorList

from specdec.drafters import resolve_drafter
from specdec.protocol import DraftContext, Rows
from specdec.models import load_model
from specdec.runners.hf import CausalLMRunner


def _median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--draft", default="eagle")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("-k", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model, _ = load_model(args.model)
    device = model.device
    drafter = resolve_drafter(args.draft, model).for_call()
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (1, args.context), dtype=torch.long, device=device)
    runner = CausalLMRunner(model)
    max_len = args.context + 2 * args.repeats * (args.k + 1) + 64
    with torch.no_grad():
        session, prompt = runner.prefill(ids, None, max_len, hidden_layers=drafter.hidden_layers)
        one = torch.zeros(1, 1, dtype=torch.long, device=device)
        block = torch.zeros(1, args.k + 1, dtype=torch.long, device=device)

        held = session.counts.clone()

        def verify_one():
            session.forward(one)
            session.keep(held)

        def verify_block():
            session.forward(block, hidden_layers=drafter.hidden_layers)
            session.keep(held)

        verifier_step = _median_ms(verify_one, args.repeats)
        verify_pass = _median_ms(verify_block, args.repeats)
        drafter.start(ids, None, max_len, hidden=prompt.hidden)
        rows = Rows(torch.cat([ids, one], dim=1), torch.tensor([args.context + 1], dtype=torch.long, device="cpu"))
        ctx = DraftContext(LogitsProcessorList(), False, None, vocab)
        drafter.propose(rows, 1, ctx)  # feeds the prompt's features: the head's cache now holds the context
        cache = drafter._cache
        base = cache.lengths.clone()
        state = torch.zeros(1, 1, drafter.head.config.hidden_size, dtype=next(drafter.head.parameters()).dtype, device=device)

        def draft_step():
            cache.lengths = base.clone()
            out = drafter._run(one, state, own=True)
            drafter.head.to_target(drafter.head.logits(out[:, -1]).argmax(-1))

        head_step = _median_ms(draft_step, args.repeats)
    result = {"context": args.context, "k": args.k, "verifier_step_ms": round(verifier_step, 3),
              "verify_pass_ms": round(verify_pass, 3), "draft_step_ms": round(head_step, 3),
              "draft_over_verifier_step": round(head_step / verifier_step, 4),
              "verify_pass_over_step": round(verify_pass / verifier_step, 3), "draft": args.draft}
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
