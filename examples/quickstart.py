#!/usr/bin/env python
"""Quick start without Jupyter: drop-in ``generate``, ``specdec.patch`` with a pipeline, streaming.

    python examples/quickstart.py            # 64 new tokens
    python examples/quickstart.py --small    # 16 new tokens

Runs offline on the embedded SmolLM2-135M-Instruct. Exits 1 if a speculative output differs from the
plain model's (greedy decoding must give identical tokens). Same content as ``01_quickstart.ipynb``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import torch
from transformers import TextStreamer, pipeline
from transformers.generation.streamers import BaseStreamer

import specdec
from specdec.models import load_model


class BlockStreamer(BaseStreamer):
    """Prints tokens as they are committed, with ``|`` before each block one verifier pass produced.

    A forward hook on the verifier counts its passes (the drafter is a separate model, so its passes
    are not counted); a token arriving after a new pass starts a new block.
    """

    def __init__(self, tokenizer: Any, verifier: torch.nn.Module) -> None:
        self.tokenizer = tokenizer
        self.passes = 0
        self.hook = verifier.register_forward_hook(self._count)
        self.blocks: list[list[int]] = []
        self.block_pass: int | None = None
        self.prompt_seen = False
        self.text = ""

    def _count(self, *args: Any) -> None:
        self.passes += 1

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # the first call carries the prompt
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            if self.passes != self.block_pass:
                self.block_pass = self.passes
                self.blocks.append([])
                print("|", end="")
            self.blocks[-1].append(token)
            text = self.tokenizer.decode(sum(self.blocks, []), skip_special_tokens=True)
            print(text[len(self.text):], end="", flush=True)
            self.text = text

    def end(self) -> None:
        print()
        self.hook.remove()


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="16 new tokens instead of 64 (quick check)")
    parser.add_argument("--prompt", default="Explain what a hash table is to a beginner programmer.")
    parser.add_argument("--draft", default="self:int8", help="drafter: self:SCHEME, prompt-lookup, composite, layer-skip:N")
    parser.add_argument("-k", "--num-draft-tokens", type=int, default=4)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, model: Any = None, tokenizer: Any = None) -> int:
    """Run the quick start; ``model``/``tokenizer`` may be passed in (tests reuse a loaded model)."""
    args = parse_args(argv)
    max_new = 16 if args.small else 64
    if model is None:
        model, tokenizer = load_model("smollm2")
    greedy = dict(max_new_tokens=max_new, do_sample=False)
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    ok = True

    print("== 1. drop-in generate ==")
    fast = specdec.SpeculativeModel(model, draft=args.draft, num_draft_tokens=args.num_draft_tokens, tokenizer=tokenizer)
    model.generate(**inputs, max_new_tokens=2, do_sample=False)  # warm-up
    fast.generate(**inputs, max_new_tokens=2, do_sample=False)
    plain, plain_s = timed(lambda: model.generate(**inputs, **greedy))
    spec, spec_s = timed(lambda: fast.generate(**inputs, **greedy))
    n_prompt = inputs["input_ids"].shape[1]
    new_tokens = spec.shape[1] - n_prompt
    print(tokenizer.decode(spec[0, n_prompt:], skip_special_tokens=True))
    same = torch.equal(plain, spec)
    ok &= same
    print(f"\nidentical to model.generate: {same}")
    print(f"model.generate: {new_tokens / plain_s:.2f} tokens/s; specdec: {new_tokens / spec_s:.2f} tokens/s "
          f"({plain_s / spec_s:.2f}x in this one run)")
    print(fast.last_stats)

    print("\n== 2. specdec.patch + transformers.pipeline ==")
    messages = [{"role": "user", "content": "Give me a short recipe for pancakes."}]
    runner = specdec.patch(model, fast.drafter, tokenizer=tokenizer, num_draft_tokens=args.num_draft_tokens)
    pipe = pipeline("text-generation", model=model, tokenizer=tokenizer)
    try:
        patched = pipe(messages, **greedy)[0]["generated_text"][-1]["content"]
    finally:
        specdec.unpatch(model)
    unpatched = pipe(messages, **greedy)[0]["generated_text"][-1]["content"]
    print(patched)
    ok &= patched == unpatched
    print(f"\nsame text as the unpatched pipeline: {patched == unpatched}")
    print(runner.last_stats)

    print("\n== 3. streaming ==")
    fast.generate(**inputs, **greedy, streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True))
    streamer = BlockStreamer(tokenizer, model)
    fast.generate(**inputs, **greedy, streamer=streamer)
    sizes = [len(block) for block in streamer.blocks]
    print(f"tokens per block: {sizes} (the first from the prefill pass); "
          f"SpecStats.committed_per_step: {fast.last_stats.committed_per_step}")
    ok &= sizes[1:] == fast.last_stats.committed_per_step
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
