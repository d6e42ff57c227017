"""``specdec export-head``: write a draft head in speculators' ``eagle3`` layout, for ``speculators`` and vLLM.

specdec saves heads in the public EAGLE-3 layout (vLLM and SGLang serve it as it is); speculators' layout is what
vLLM serves as a speculators model and what speculators' own tools read. specdec loads both.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FORMATS = ("speculators",)


def add_export_head_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--head", default="eagle", help="'eagle' (the head shipped for --model) or a head directory")
    p.add_argument("--out", required=True, help="directory to write (config.json and model.safetensors)")
    p.add_argument("--model", default="smollm2", help="the verifier: 'smollm2' (embedded) or a local directory / .gguf")
    p.add_argument("--format", choices=FORMATS, default="speculators", help="layout to write")
    p.add_argument("--verifier-name", default=None,
                   help="the verifier's hub id or path recorded in the export (speculators_config.verifier: vLLM and "
                        "speculators read its config and embedding from there); default: the directory the model was "
                        "loaded from, or HuggingFaceTB/SmolLM2-135M-Instruct for the embedded model")
    p.add_argument("--speculative-tokens", type=int, default=3,
                   help="draft length the export proposes (vLLM's default num_speculative_tokens)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default=None,
                   help="weights' dtype (default: the head's own)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")


def run_export_head(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"specdec export-head: error: {message}", file=sys.stderr)
        return 2

    # every check that needs no model first
    if args.speculative_tokens < 1:
        return fail(f"--speculative-tokens must be >= 1, got {args.speculative_tokens}")
    out = Path(args.out).expanduser()
    if args.head != "eagle":
        head = Path(args.head).expanduser()
        if not (head / "config.json").is_file():
            return fail(f"--head {args.head}: no config.json there (a head directory, or 'eagle' for the shipped head)")
        if out.resolve() == head.resolve():
            return fail("--out is the head directory itself: the export would overwrite the head it reads")
    if out.exists() and not out.is_dir():
        return fail(f"--out {args.out} exists and is not a directory")

    import torch

    from specdec.errors import SpecdecError
    from specdec.heads.export import export_speculators
    from specdec.heads.shipped import shipped_head
    from specdec.models import DEFAULT_ALIASES, SMOLLM2_HUB_ID, load_model

    try:
        model, _ = load_model(args.model)
    except SpecdecError as e:
        return fail(str(e))
    try:
        head_dir = shipped_head(model) if args.head == "eagle" else Path(args.head).expanduser()
        if out.resolve() == Path(head_dir).resolve():
            return fail("--out is the head directory itself: the export would overwrite the head it reads")
        name = args.verifier_name or (SMOLLM2_HUB_ID if args.model in DEFAULT_ALIASES else None)
        export_speculators(head_dir, out, model, verifier_name_or_path=name,
                           speculative_tokens=args.speculative_tokens,
                           dtype=getattr(torch, args.dtype) if args.dtype else None)
    except SpecdecError as e:  # a head that cannot serve the model, or that speculators' layout cannot hold
        return fail(str(e))
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    summary = {"out": str(out), "format": args.format, "head": str(head_dir),
               "verifier": config["speculators_config"]["verifier"]["name_or_path"],
               "draft_vocab_size": config["draft_vocab_size"],
               "eagle_aux_hidden_state_layer_ids": config["eagle_aux_hidden_state_layer_ids"],
               "speculative_tokens": args.speculative_tokens, "torch_dtype": config["torch_dtype"],
               "files": sorted(p.name for p in out.iterdir() if p.is_file())}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"wrote {out} ({args.format} eagle3 layout, draft vocabulary {summary['draft_vocab_size']}, "
              f"{summary['torch_dtype']}); serve it with vLLM: --speculative-config "
              f"'{{\"model\": \"{out}\", \"num_speculative_tokens\": {args.speculative_tokens}}}'")
    return 0
