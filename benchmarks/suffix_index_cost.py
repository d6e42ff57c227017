"""How much of a pass suffix decoding's index work takes (issue 54's target: at most 10%).

Runs ``specdec[suffix]`` greedy over a prompt set in order (the cache learning as in ``specdec eval``'s warm runs) and
prints, per call and in all: verify passes, tokens a pass, the drafter's seconds a pass (``SpecStats.draft_seconds``:
the index catching up and the queries of both sources) against the whole pass, and the cache's tokens and bytes.
Feeding the cache at the end of a call is timed apart (``feed ms``).

    python benchmarks/suffix_index_cost.py [--dataset json-schema] [--prompts 8] [--max-new-tokens 64] [--tree static]

Timings need a quiet machine; the counts do not.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", default="json-schema")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--tree", default=None)
    args = parser.parse_args()

    import specdec
    from specdec.drafters.suffix_cache import SuffixCache
    from specdec.models import load_model
    from specdec.prompts import encode_batch, load_prompts

    model, tok = load_model(args.model)
    fast = specdec.SpeculativeModel(model, "suffix", num_draft_tokens=args.k, tokenizer=tok, tree=args.tree)
    prompts = load_prompts(args.dataset)[: args.prompts]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    totals = [0, 0, 0.0, 0.0]
    print(f"{'prompt':24} {'passes':>6} {'tok/pass':>8} {'draft ms/pass':>13} {'pass ms':>8} {'share':>6} {'feed ms':>7}")
    for p in prompts:
        ids, mask = encode_batch(tok, [p.text], True, model.device)
        out = fast.generate(ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, do_sample=False,
                            pad_token_id=pad)
        s = fast.last_stats
        probe = SuffixCache()  # what feeding this call's output costs, apart
        start = time.perf_counter()
        probe.add(out[0, ids.shape[1]:].tolist())
        feed = time.perf_counter() - start
        passes = max(s.verifier_forwards, 1)
        totals = [totals[0] + s.verifier_forwards, totals[1] + s.new_tokens, totals[2] + s.draft_seconds,
                  totals[3] + s.total_time - s.time_to_first_token]
        print(f"{p.id:24} {s.verifier_forwards:6d} {s.new_tokens / passes:8.2f} {1e3 * s.draft_seconds / passes:13.3f} "
              f"{1e3 * (s.total_time - s.time_to_first_token) / passes:8.2f} "
              f"{s.draft_seconds / max(s.total_time - s.time_to_first_token, 1e-9):6.1%} {1e3 * feed:7.3f}")
    passes = max(totals[0], 1)
    print(f"{'all':24} {totals[0]:6d} {totals[1] / passes:8.2f} {1e3 * totals[2] / passes:13.3f} "
          f"{1e3 * totals[3] / passes:8.2f} {totals[2] / max(totals[3], 1e-9):6.1%}")
    cache = fast.drafter.cache
    print(f"cache: {cache.tokens} tokens in {cache.sequences} sequences, {cache.nbytes()} bytes "
          f"({cache.nbytes() / max(cache.tokens, 1):.0f} a token)")


if __name__ == "__main__":
    main()
