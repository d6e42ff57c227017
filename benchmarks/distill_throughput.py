"""Response tokens per second of the verifier writing training data: ``generate`` in padded batches (what
train-head did) against transformers' continuous batching (``generate_batch``), same prompts, same run.

    python benchmarks/distill_throughput.py --prompts 64 --max-new-tokens 256 --batch 32 64
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from transformers import GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from specdec.models import load_model
from specdec.prompts import encode_prompt

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "train_prompts"


def _prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    rows = [json.loads(line) for f in sorted(DATA.glob("*.jsonl")) for line in f.read_text(encoding="utf-8").split("\n") if line.strip()]
    random.Random(seed).shuffle(rows)
    return [encode_prompt(tokenizer, r["prompt"])[0].tolist() for r in rows[:n]]


def _eos(model) -> set[int]:
    eos = model.generation_config.eos_token_id
    return set(eos if isinstance(eos, list) else [eos])


def padded_batches(model, tokenizer, prompts, batch: int, new: int) -> tuple[int, float]:
    """train-head's way: sort by length, left-pad, ``generate`` until every row of the batch stops."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(prompts, key=len)
    tokens, start, eos = 0, time.perf_counter(), _eos(model)
    for i in range(0, len(order), batch):
        chunk = order[i:i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long, device="cpu")
        mask = torch.zeros_like(ids)
        for b, p in enumerate(chunk):
            ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long, device="cpu")
            mask[b, width - len(p):] = 1
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=pad)
        for row in out[:, width:].tolist():
            tokens += next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
    return tokens, time.perf_counter() - start


def continuous(model, prompts, batch: int, new: int) -> tuple[int, float]:
    """transformers' continuous batching: finished rows are replaced by waiting prompts at once."""
    config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=model.generation_config.eos_token_id,
                              pad_token_id=model.generation_config.pad_token_id)
    cb = ContinuousBatchingConfig(max_requests_per_batch=batch, max_memory_percent=0.3)
    start = time.perf_counter()
    with torch.no_grad():
        outputs = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb,
                                       max_new_tokens=new, warmup=False)
    seconds = time.perf_counter() - start
    return sum(len(o.generated_tokens) for o in outputs.values()), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--methods", nargs="+", default=["padded", "continuous"])
    args = parser.parse_args()
    model, tokenizer = load_model("smollm2")
    prompts = _prompts(tokenizer, args.prompts)
    for batch in args.batch:
        for method in args.methods:
            if method == "padded":
                tokens, seconds = padded_batches(model, tokenizer, prompts, batch, args.max_new_tokens)
            else:
                tokens, seconds = continuous(model, prompts, batch, args.max_new_tokens)
            print(json.dumps({"method": method, "batch": batch, "prompts": len(prompts), "response_tokens": tokens,
                              "seconds": round(seconds, 1), "tokens_per_s": round(tokens / seconds, 1)}), flush=True)


if __name__ == "__main__":
    main()
