"""``specdec`` command line: demo, generate, plan, quant-report.

Machine-readable output (``--json``) is one JSON object on the last line of stdout; everything
else (progress, tables) goes to stderr or before it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# Measured best on the embedded SmolLM2 (docs/quantization.md, BENCHMARKS.md): int4 weights in groups of
# 32 with an int8 head agree ~0.98 with fp32 at half the verifier's cost per token.
DEMO_DRAFT = "self:int4+head8"


def _add_model_args(p: argparse.ArgumentParser, default_new_tokens: int) -> None:
    p.add_argument("--model", default="smollm2", help="'smollm2' (embedded default) or a local model directory / .gguf")
    p.add_argument("--draft", default=DEMO_DRAFT,
                   help="drafter: self:SCHEME (e.g. self:int8), prompt-lookup, composite[:SCHEME], layer-skip:N, "
                        "or a local model path")
    p.add_argument("--adaptive", action="store_true", help="choose the draft length per step (up to -k)")
    p.add_argument("--compile-drafter", action="store_true",
                   help="run the drafter through torch.compile (faster steps; the first calls compile for about a minute)")
    p.add_argument("--max-new-tokens", type=int, default=default_new_tokens)
    p.add_argument("--num-draft-tokens", "-k", type=int, default=None, help="tokens drafted per verifier pass")
    p.add_argument("--no-chat-template", action="store_true", help="feed prompts raw instead of as a chat turn")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")


def _log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def _load(args: argparse.Namespace):
    import specdec
    from specdec.models import load_model

    _log(f"loading {args.model} ...")
    model, tokenizer = load_model(args.model)
    k = args.num_draft_tokens or specdec.DEFAULT_NUM_DRAFT_TOKENS
    _log(f"building drafter {args.draft} (k={k}) ...")
    spec = specdec.SpeculativeModel(model, args.draft, num_draft_tokens=k, tokenizer=tokenizer, adaptive=args.adaptive,
                                    compile_drafter=args.compile_drafter)
    if args.compile_drafter:
        _log("compiling the drafter (about a minute; cached on disk for later runs) ...")
        spec.drafter.prime()
    spec.draft_name = args.draft
    return model, tokenizer, spec


def _check_lengths(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise SystemExit("error: --max-new-tokens must be >= 1")
    if args.num_draft_tokens is not None and args.num_draft_tokens < 1:
        raise SystemExit("error: --num-draft-tokens must be >= 1")


def _read_prompts(path: str) -> list[dict[str, str]]:
    """JSONL with a ``prompt`` field per line, or Spec-Bench style ``turns`` (first turn) + ``category``."""
    prompts = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        text = row.get("prompt") or (row.get("turns") or [None])[0]
        if not isinstance(text, str) or not text.strip():
            raise SystemExit(f"error: {path}:{n} has no non-empty 'prompt' (or 'turns') field")
        prompts.append({"task": row.get("task") or row.get("category") or "prompt", "prompt": text})
    if not prompts:
        raise SystemExit(f"error: {path} holds no prompts")
    return prompts


def _run_compare(args: argparse.Namespace, prompts: list[dict[str, str]]) -> int:
    from specdec.eval.side_by_side import compare

    model, tokenizer, spec = _load(args)
    _log(f"running {len(prompts)} prompts, {args.max_new_tokens} new tokens, plain generate vs specdec ...")
    result = compare(
        model,
        tokenizer,
        spec,
        prompts,
        max_new_tokens=args.max_new_tokens,
        chat=not args.no_chat_template,
        progress=lambda r: _log(
            f"  {r.task:<14} {r.new_tokens} tokens  plain {r.plain_seconds:.2f}s  specdec {r.spec_seconds:.2f}s  "
            f"accept {r.acceptance_rate:.2f}  {'identical' if r.identical else 'DIFFERENT'}"
        ),
    )
    print(result.table())
    if not args.json:
        print(f"\nspeedup {result.speedup:.2f}x, acceptance {result.acceptance_rate:.2f}, "
              f"mean accepted length {result.mean_accepted_length:.2f}, identical {sum(r.identical for r in result.results)}/{len(result.results)}")
        print(f"\nexample output ({result.results[0].task}):\n{result.results[0].text}")
    else:
        print(json.dumps(result.summary()))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from specdec.eval.side_by_side import BUILTIN_PROMPTS

    _check_lengths(args)
    if args.prompts is not None and args.prompts < 1:
        raise SystemExit("error: --prompts must be >= 1")
    return _run_compare(args, BUILTIN_PROMPTS[: args.prompts])


def cmd_generate(args: argparse.Namespace) -> int:
    _check_lengths(args)
    if (args.prompt is None) == (args.prompts is None):
        raise SystemExit("error: give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    prompts = [{"task": "prompt", "prompt": args.prompt}] if args.prompt is not None else _read_prompts(args.prompts)
    if any(not p["prompt"].strip() for p in prompts):
        raise SystemExit("error: empty prompt")
    if args.compare:
        return _run_compare(args, prompts)

    import torch
    from transformers import TextStreamer

    from specdec.eval.side_by_side import encode_prompt

    model, tokenizer, spec = _load(args)
    generator = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    sampling = {}
    if args.do_sample:
        sampling = {k: v for k, v in dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p).items() if v is not None}
    records = []
    for item in prompts:
        ids = encode_prompt(tokenizer, item["prompt"], not args.no_chat_template)
        streamer = None if args.json else TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        out = spec.generate(
            ids, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, streamer=streamer, generator=generator,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **sampling,
        )
        stats = spec.last_stats
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        records.append({"prompt": item["prompt"], "text": text, **stats.to_dict()})
        if not args.json:
            _log(f"[{stats.new_tokens} tokens, {stats.tokens_per_second:.1f} tok/s, acceptance {stats.acceptance_rate:.2f}, "
                 f"mean accepted length {stats.mean_accepted_length:.2f}]")
    if args.json:
        print(json.dumps({"prompts": len(records), "outputs": records}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for Hugging Face causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="built-in prompts through model.generate and specdec, side by side")
    _add_model_args(demo, default_new_tokens=96)
    demo.add_argument("--prompts", type=int, default=None, help="how many of the built-in prompts to run (default: all)")
    demo.set_defaults(func=cmd_demo)

    gen = sub.add_parser("generate", help="generate with specdec for a prompt or a JSONL file of prompts")
    _add_model_args(gen, default_new_tokens=128)
    gen.add_argument("--prompt", help="prompt text")
    gen.add_argument("--prompts", help="JSONL file with a 'prompt' field per line")
    gen.add_argument("--compare", action="store_true", help="also run plain model.generate and report the speedup")
    gen.add_argument("--do-sample", action="store_true")
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--seed", type=int)
    gen.set_defaults(func=cmd_generate)

    _add_optional(sub, "plan", "specdec.sizing", "add_plan_arguments", "run_plan",
                  "KV-cache sizing and memory plan for a model (+ drafter)")
    _add_optional(sub, "quant-report", "specdec.quant.report", "add_quant_report_arguments", "run_quant_report",
                  "cost and agreement of quantized drafter schemes")
    _add_optional(sub, "eval", "specdec.eval.__main__", "add_eval_arguments", "run_eval",
                  "speedup, acceptance and identity against transformers' baselines on a prompt set")
    return parser


def _add_optional(sub: Any, name: str, module: str, add: str, run: str, help_text: str) -> None:
    """Subcommands implemented in their own modules (kept thin here)."""
    import importlib

    mod = importlib.import_module(module)
    p = sub.add_parser(name, help=help_text)
    add_fn, run_fn = getattr(mod, add), getattr(mod, run)
    add_fn(p)
    p.set_defaults(func=run_fn)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
