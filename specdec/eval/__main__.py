"""``python -m specdec.eval`` / ``specdec eval``: evaluate specdec against transformers' baselines on a prompt set.

    python -m specdec.eval --per-group 1 --max-new-tokens 64 --num-draft-tokens 2 4 --out eval-out
    accelerate launch --multi_gpu --num_processes 2 -m specdec.eval ...   # prompts split over 2 processes

(On a CPU-only machine ``accelerate launch`` needs ``--multi_gpu`` to start several processes; each
then runs on the CPU.) ``add_eval_arguments`` and ``run_eval`` are the hooks ``specdec.cli`` mounts as
``specdec eval``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from specdec.draft_spec import forms
from specdec.eval.config import SEEDING
from specdec.eval.baselines import baseline_names
from specdec.eval.methods import DEFAULT_BASELINES, DEFAULT_DRAFT, DEFAULT_PROMPT_LOOKUP_TOKENS, VERIFY_RULES
from specdec.trees.modes import tree_choices

DEFAULT_OUT = "specdec-eval"
_AUTO = "auto"
_DTYPES = ("float32", "bfloat16", "float16")


def _per_group(value: str) -> int | str | None:
    if value in ("all", _AUTO):
        return None if value == "all" else _AUTO
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (or 'all'), got {n}")
    return n


def _baselines(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in baseline_names()]  # the registry now: it may have grown since import
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown baseline(s) {unknown}; choose from {','.join(baseline_names())}")
    return names


def _out_dir(value: str) -> str:
    """``--out``: refused at parse time (before the model loads) when it is a file or cannot be written."""
    from specdec.eval.records import OutputDirError, check_out_dir

    try:
        check_out_dir(value)
    except OutputDirError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return value


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``specdec eval``'s arguments to ``parser`` (returned for chaining)."""
    data = parser.add_argument_group("prompts")
    data.add_argument("--dataset", default=None,
                      help="local .json/.jsonl/.csv/.tsv/.parquet file or dataset directory, 'json-schema' (shipped: "
                           "JSON answers against schemas), or a hub dataset name (needs the hub); default: the "
                           "Spec-Bench questions when present ($SPECDEC_SPEC_BENCH or "
                           "shared/data/spec_bench/question.jsonl beside the repository; a clone has none)")
    data.add_argument("--split", default="train", help="split of a dataset directory or hub dataset (default: train)")
    data.add_argument("--dataset-config", default=None, help="configuration name of a hub dataset")
    data.add_argument("--prompt-column", default=None, help="text column (default: 'prompt', or Spec-Bench 'turns')")
    data.add_argument("--group-column", default=None,
                      help="task-group column (default: 'category'/'task'/'group'; Spec-Bench ids 81-160 form mt_bench)")
    data.add_argument("--per-group", type=_per_group, default=_AUTO, metavar="N|all",
                      help="first N prompts of each task group (default: 1 per group); in a set without groups "
                           "(no category/task/group on any row) each prompt is its own group, so every prompt runs")

    gen = parser.add_argument_group("methods")
    gen.add_argument("--model", default="smollm2", help="'smollm2' (embedded default), 'gemma3-270m' (specdec[gemma]) or a local model directory / .gguf")
    gen.add_argument("--dtype", choices=_DTYPES, default="float32", help="verifier dtype (default: float32)")
    gen.add_argument("--device", default="auto",
                     help="'auto' (this process's accelerate device: cuda:N or cpu), 'cpu', 'cuda:0', ...")
    gen.add_argument("--draft", nargs="+", default=[DEFAULT_DRAFT], metavar="DRAFT",
                     help=f"drafter(s): {forms()} (hf-assisted is skipped for drafters that are not causal LMs)")
    gen.add_argument("--draft-tokenizer", metavar="DIR",
                     help="the drafters' tokenizer (a local directory), where it differs from the model's and is not "
                          "beside the drafter: drafts then go by text (hf-uag compares transformers' own)")
    gen.add_argument("--adaptive", action="store_true",
                     help="also run each specdec method with adaptive draft length (up to its k); mean_draft_length "
                          "in summary.json and the report shows the k each method actually drafted")
    gen.add_argument("--tree", nargs="+", choices=tree_choices(), default=["none"],
                     help="verify chains (none) or trees of drafts per pass; several run each specdec method with each "
                          "(e.g. --tree none auto compares chain and tree in one run)")
    gen.add_argument("--verify", nargs="+", choices=VERIFY_RULES, default=["token"],
                     help="how sampled drafts are verified: token (draft by draft, chains and trees), block (chains "
                          "judged as a block, Sun et al. 2024) or traversal (trees judged leaf first, Weng et al. 2025); "
                          "several run each method with each rule that applies to it (e.g. --verify token block "
                          "traversal); greedy outputs are the same under every rule")
    gen.add_argument("--compile-drafter", action="store_true",
                     help="run specdec's model drafters and draft heads through torch.compile (compiled during the warm-up)")
    gen.add_argument("--compile-verifier", nargs="?", const="on", choices=("on", "both"), default=None,
                     help="run specdec's verify passes through torch.compile over a static cache (CUDA graphs on CUDA); "
                          "every pass shape is compiled before timing and reported apart (verifier_compile_seconds); "
                          "'both' runs each specdec method eagerly and compiled (specdec[...,compiled]) in one run")
    gen.add_argument("--num-draft-tokens", "-k", nargs="+", type=_positive, default=[4], metavar="K",
                     help="draft lengths to evaluate specdec at (default: 4)")
    gen.add_argument("--baselines", type=_baselines, default=list(DEFAULT_BASELINES),
                     help=f"comma-separated among {','.join(baseline_names())} (default: {','.join(DEFAULT_BASELINES)}); "
                          "hf always runs: it is the reference; hf-compiled is generate with a static cache and its "
                          "decode step compiled by torch.compile (compiled before timing, compile time reported apart)")
    gen.add_argument("--prompt-lookup-tokens", type=_positive, default=DEFAULT_PROMPT_LOOKUP_TOKENS,
                     help=f"prompt_lookup_num_tokens of hf-prompt-lookup (default: {DEFAULT_PROMPT_LOOKUP_TOKENS})")
    gen.add_argument("--max-new-tokens", type=_positive, default=64)
    gen.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    gen.add_argument("--temperature", type=float, default=None)
    gen.add_argument("--top-p", type=float, default=None)
    gen.add_argument("--seed", type=int, default=0, help="sampling seed (prompt i uses seed + i)")
    gen.add_argument("--seeding", choices=SEEDING, default="generator",
                     help="how specdec's sampled calls take the seed: a seeded generator per call (default: "
                          "reproducible, tree=auto and adaptive k size from cost models) or global (torch.manual_seed, "
                          "no generator: the call most users make, learning from the clock across calls)")
    gen.add_argument("--no-chat-template", action="store_true", help="feed prompts raw instead of as a chat turn")
    gen.add_argument("--json-schema", action=argparse.BooleanOptionalAction, default=False,
                     help="generate each prompt under its JSON schema (its 'schema' field, e.g. --dataset json-schema) "
                          "with xgrammar, every method alike; answers of prompts with a schema are checked against it "
                          "either way (valid in records and report)")
    gen.add_argument("--batch-size", type=_positive, default=1,
                     help="prompts per generate call, left padded into one batch (default: 1); with more, "
                          "summary.json reports batched throughput, and hf-assisted/hf-prompt-lookup (one row "
                          "only in transformers) are skipped")

    run = parser.add_argument_group("output")
    run.add_argument("--out", type=_out_dir, default=DEFAULT_OUT,
                     help=f"output directory; a rerun with the same directory resumes, and is refused if any setting "
                          f"that changes a measurement, or a prompt's text, differs (default: {DEFAULT_OUT})")
    run.add_argument("--overwrite", action="store_true", help="discard results already in --out instead of resuming")
    run.add_argument("--no-warmup", action="store_true",
                     help="skip the untimed warm-up generation of each method (hf-compiled still compiles untimed)")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")
    run.add_argument("--json", action="store_true", help="print summary.json as one line, last on stdout")
    return parser


def _log(*args: Any) -> None:
    print(*args, file=sys.stderr, flush=True)


def _command_line(argv: list[str]) -> str:
    """The command as typed, for the report (``specdec eval ...`` or ``python -m specdec.eval ...``)."""
    if argv[:1] == ["eval"]:
        return shlex.join(["specdec", *argv])
    return shlex.join(["python", "-m", "specdec.eval", *argv])


def _select(prompts: list, per_group: Any) -> tuple[list, int | None]:
    """``--per-group``: the default takes 1 per task group. A set without groups has each prompt as its own
    group, so every ``N`` keeps every prompt (recorded as ``all``)."""
    from specdec.prompts import select_per_group, ungrouped

    if ungrouped(prompts):
        per_group = None
    elif per_group == _AUTO:
        per_group = 1
    return select_per_group(prompts, per_group), per_group


def run_eval(args: argparse.Namespace) -> int:
    """Run ``specdec eval`` for parsed ``args``; returns the exit status."""
    from specdec.errors import SpecdecError
    from specdec.user_input import DeviceError, check_device, check_model_and_draft

    if args.do_sample is False and (args.temperature is not None or args.top_p is not None):
        _log("note: --temperature/--top-p only apply with --do-sample; decoding greedily")
    # as `specdec generate` does: a bad --model, --draft or --device fails now, not after the prompts and the model load
    check_model_and_draft(args.model, args.draft)
    if args.device != _AUTO:
        try:
            check_device(args.device)
        except DeviceError as err:
            raise SystemExit(f"error: --device {err}") from None
    from specdec.prompts import default_dataset, missing_default_dataset, plural

    # a clone has no Spec-Bench file: say so, with the shipped sets, before torch and the model load
    dataset = args.dataset or default_dataset()
    if dataset is None:
        raise SystemExit(f"error: {missing_default_dataset('--dataset')}")

    if args.draft_tokenizer:  # a directory that holds no tokenizer fails now, not after the model load
        from transformers import AutoTokenizer

        try:
            AutoTokenizer.from_pretrained(args.draft_tokenizer, local_files_only=True)
        except (OSError, ValueError) as err:
            raise SystemExit(f"error: --draft-tokenizer {args.draft_tokenizer}: {' '.join(str(err).split())}") from None
    import torch
    from accelerate import PartialState

    from specdec.eval.config import EvalConfig
    from specdec.eval.json_schema import require_schemas
    from specdec.eval.runner import run_eval as evaluate_model
    from specdec.models import load_model
    from specdec.prompts import load_prompts

    try:
        prompts = load_prompts(dataset, split=args.split, config=args.dataset_config,
                               prompt_column=args.prompt_column, group_column=args.group_column)
        prompts, per_group = _select(prompts, args.per_group)
        if args.json_schema:  # before the model loads
            require_schemas(prompts)
    except SpecdecError as err:  # a prompt set that cannot be read, prompts without a schema
        raise SystemExit(f"error: {err}") from None

    on_cpu = args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available())
    state = PartialState(cpu=on_cpu)
    device = state.device if args.device == "auto" else torch.device(args.device)
    say = _log if state.is_main_process else (lambda *a: None)
    say(f"{plural(len(prompts), 'prompt')} from {dataset}; loading {args.model} ({args.dtype}) on {device} ...")
    try:
        model, tokenizer = load_model(args.model, dtype=getattr(torch, args.dtype), device=device)
    except SpecdecError as err:  # no such model, a torch too old
        raise SystemExit(f"error: {err}") from None

    command = getattr(args, "command_line", None) or _command_line(sys.argv[1:])
    config = EvalConfig(
        out_dir=args.out, draft=args.draft, num_draft_tokens=args.num_draft_tokens, baselines=args.baselines,
        adaptive=args.adaptive, tree=args.tree, verify=args.verify, max_new_tokens=args.max_new_tokens, do_sample=args.do_sample,
        temperature=args.temperature, top_p=args.top_p, seed=args.seed, seeding=args.seeding, chat=not args.no_chat_template,
        prompt_lookup_num_tokens=args.prompt_lookup_tokens, batch_size=args.batch_size, json_schema=args.json_schema,
        draft_tokenizer=args.draft_tokenizer, compile_drafter=args.compile_drafter, compile_verifier={None: False, "on": True, "both": "both"}[args.compile_verifier], warmup=not args.no_warmup, progress=not args.no_progress,
        plots=not args.no_plots, overwrite=args.overwrite, model_name=args.model, dataset=str(dataset),
        summary_config={"per_group": "all" if per_group is None else per_group, "drafts": args.draft,
                        "num_draft_tokens": args.num_draft_tokens, "baselines": args.baselines, "tree": args.tree,
                        "command": command},
    )
    try:
        report = evaluate_model(model, tokenizer, prompts, config)
    except SpecdecError as err:
        # an --out of other settings, a drafter or tree the model cannot use (no shipped head, a missing head
        # directory, a sliding-window model with --tree): one line, like every other error here
        raise SystemExit(f"error: {' '.join(str(err).splitlines())}") from None
    if state.is_main_process:
        print(report.markdown())
        _log(f"wrote {args.out}/summary.json, report.md, records*.jsonl and plots")
        if args.json:
            print(json.dumps(report.to_dict()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m specdec.eval``."""
    parser = argparse.ArgumentParser(
        prog="python -m specdec.eval",
        description="Evaluate specdec against transformers' baselines on a prompt set (speedup, acceptance, identity).",
    )
    args = add_eval_arguments(parser).parse_args(argv)
    args.command_line = _command_line(sys.argv[1:] if argv is None else list(argv))
    return run_eval(args)


if __name__ == "__main__":
    sys.exit(main())
