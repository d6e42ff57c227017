"""``specdec head-report``: teacher-forced top-1, coverage and online acceptance of a draft head on responses."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from specdec.errors import SpecdecError
from specdec.prompts.files import PromptFileError, json_rows


class ReportDataError(SpecdecError, ValueError):
    """A ``--data`` file head-report cannot use (missing, not JSON lines, rows without what it needs)."""


def read_report_data(path: str | Path, limit: int | None = None, vocab_size: int | None = None) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file, each either a verifier response (``prompt_ids`` and ``response_ids``, as
    ``train-head`` writes them in ``OUT/work/samples.jsonl``) or a prompt (``prompt``: text the verifier answers
    greedily first). Torch-free, so a bad file fails before any model loads; with ``vocab_size`` (the verifier's,
    known once it has loaded) a token id at or past it is refused too."""
    rows = []
    try:
        for number, row in json_rows(path, "(a verifier response or a prompt)"):
            ids = {key: row.get(key) for key in ("prompt_ids", "response_ids")}
            if all(isinstance(v, list) for v in ids.values()):
                problem = _token_ids_problem(ids, vocab_size)
                if problem is not None:
                    raise ReportDataError(f"{path}:{number}: prompt_ids and response_ids must be non-empty lists of "
                                          f"token ids{problem}")
            elif not (isinstance(row.get("prompt"), str) and row["prompt"].strip()):
                raise ReportDataError(f"{path}:{number}: a row needs prompt_ids + response_ids (a verifier response) "
                                      "or a non-empty 'prompt' text")
            rows.append(row)
            if limit and len(rows) >= limit:
                break
    except PromptFileError as e:
        raise ReportDataError(str(e)) from None
    if not rows:
        raise ReportDataError(f"{path}: no rows")
    return rows


def _token_ids_problem(ids: dict[str, list[Any]], vocab_size: int | None) -> str | None:
    """What is wrong with a row's token id lists, as the end of a sentence (None: nothing)."""
    for key, values in ids.items():
        if not values:
            return f" ({key} is empty)"
        for t in values:
            # JSON true is a Python bool, an int subclass: it would be read as token 1
            if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                return f" (>= 0): {key} holds {json.dumps(t)}"
            if vocab_size is not None and t >= vocab_size:
                return f": {key} holds {t}, past the verifier's vocabulary of {vocab_size} ids (0 to {vocab_size - 1})"
    return None


def add_head_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", default="eagle", help="'eagle' (the head shipped for --model) or a head directory")
    p.add_argument("--data", required=True, help="JSON lines: verifier responses (prompt_ids, response_ids) or prompts")
    p.add_argument("--model", default="smollm2", help="the verifier: 'smollm2' (embedded) or a local directory / .gguf")
    p.add_argument("--limit", type=int, default=20, help="at most this many rows (0: all)")
    p.add_argument("--steps", type=int, default=3, help="training-time steps to teacher-force (>= 1)")
    p.add_argument("-k", "--num-draft-tokens", type=int, default=5, help="draft length of the online chain")
    p.add_argument("--tree", default=None, help="online trees instead of chains: static, dynamic or auto")
    p.add_argument("--max-new-tokens", type=int, default=128, help="response length for 'prompt' rows")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run_head_report(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"specdec head-report: error: {message}", file=sys.stderr)
        return 2

    for name in ("steps", "num_draft_tokens", "max_new_tokens"):
        if getattr(args, name) < 1:
            return fail(f"--{name.replace('_', '-')} must be at least 1")
    if args.limit < 0:
        return fail("--limit must be >= 0")
    if args.head != "eagle" and not Path(args.head).is_dir():
        return fail(f"--head {args.head!r}: no such directory")
    from specdec.user_input import DeviceError, check_device

    device = None
    if args.device is not None:
        try:
            device = check_device(args.device)
        except DeviceError as e:
            return fail(f"--device {e}")
    try:
        rows = read_report_data(args.data, args.limit or None)
    except ReportDataError as e:
        return fail(str(e))
    from specdec.trees.config import parse_tree

    try:
        parse_tree(args.tree)  # a bad --tree fails before the model loads
    except ValueError as e:
        return fail(f"--tree: {e}")
    tree = None if args.tree in (None, "none") else args.tree

    import torch

    from specdec.heads.checkpoint import load_head
    from specdec.heads.shipped import shipped_head
    from specdec.models import load_model
    from specdec.training.report import head_report

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model, tokenizer = load_model(args.model, device=device)
        # read again against the verifier's vocabulary, which only now is known: an id past it would be an IndexError
        rows = read_report_data(args.data, args.limit or None, vocab_size=model.get_input_embeddings().num_embeddings)
        head = load_head(shipped_head(model) if args.head == "eagle" else args.head, model)
    except SpecdecError as e:  # no such model, a head that cannot serve it, data outside its vocabulary
        return fail(str(e))
    samples = [_as_sample(model, tokenizer, row, args.max_new_tokens) for row in rows]
    report = head_report(model, head, samples, steps=args.steps, k=args.num_draft_tokens, tree=tree)
    report["head"], report["data"] = args.head, str(args.data)
    if args.json:
        print(json.dumps(report))
        return 0
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    first = report["first_draft"]
    print(f"{report['samples']} responses, {report['response_tokens']} target tokens ({args.head})\n"
          f"teacher-forced top-1 per step:        {fmt(report['teacher_forced'])}\n"
          f"  among draft-vocabulary targets:     {fmt(report['teacher_forced_in_vocab'])}\n"
          f"draft-vocabulary coverage:            {report['coverage']:.3f}\n"
          f"online, given earlier drafts right:   {fmt(report['online_by_position'])}\n"
          f"mean accepted length:                 {report['mean_accepted_length']:.2f} tokens / pass\n"
          f"first drafts equal to teacher forcing: {first['equal_to_teacher_forced']} of {first['passes']} "
          f"({first['near_ties']} near-ties, {first['mismatches']} mismatches)")
    return 0


def _as_sample(model: Any, tokenizer: Any, row: dict[str, Any], max_new_tokens: int) -> dict[str, Any]:
    """A verifier response for ``row``: as given, or written now (greedy) for a ``prompt`` row."""
    if "prompt_ids" in row and "response_ids" in row:
        return row
    from specdec.prompts import encode_prompt

    ids = encode_prompt(tokenizer, row["prompt"]).to(model.device)
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return {"prompt_ids": ids[0].tolist(), "response_ids": out[0, ids.shape[1]:].tolist()}
