"""``specdec quant-report``: what a quantized drafter costs and how often it agrees with its verifier.

An application of :mod:`specdec.quant` (with the models, prompts and verifier cache it loads and runs), kept out of
that package so that ``quant`` stays a leaf the engine and the drafters import.

``quant_report`` measures, for each scheme, on one machine in one run:

* ``bytes``: :func:`model_bytes` of the copy; ``added_bytes``: what it adds to the verifier
  (shared tensors such as the input embedding are not counted twice);
* ``ms_per_token``: one forward over 1 new token with ``ctx`` (~200) tokens cached;
* ``ms_per_8_tokens``: one forward over 8 new tokens with the same cache;
* ``agreement``: top-1 agreement with the fp32 verifier's greedy next token, over ``positions``
  positions of the verifier's own greedy continuations of the prompts, measured the way a drafter
  runs (prefill the prompt, then one token per forward with a KV cache);
* ``weight_error`` / ``head_weight_error``: relative weight error ``||W_q - W|| / ||W||`` of the
  scheme against the verifier's own linear weights (body; LM head), and ``grid_bound``: the
  verifier's weights already lie on the scheme's grid (:func:`specdec.quant.weight_error`), so
  its agreement says nothing about a bf16 checkpoint (the embedded SmolLM2 is a Q4_1 GGUF, and
  ``int4`` with groups of 32 reproduces its weights exactly);
* ``tokens_per_pass`` (expected tokens per verifier pass for draft length ``k``,
  ``(1 - a**(k+1)) / (1 - a)``, :func:`specdec.metrics.expected_tokens`), and
  ``est_speedup``/``best_k``: a cost model using the verifier's own 1- and 8-token forward times
  measured in the same run.

Timings are medians over ``repeats`` rounds, interleaved across schemes (and the verifier), so
noise from other processes on the machine hits every scheme alike.

Torch-free at import (``specdec quant-report --help`` reads the options below): what needs torch is imported
when the report runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from specdec.costs import VerifyCost, chain_rate
from specdec.metrics import expected_tokens
from specdec.prompts import PromptFileError, encode_prompt, plural, read_prompt_file, round_robin
from specdec.quant.schemes import UnknownSchemeError, UnsupportedSchemeError, parse_scheme

if TYPE_CHECKING:
    import torch
    from torch import nn

_F = TypeVar("_F", bound=Callable[..., Any])

DEFAULT_SCHEMES = "fp32,bf16,int8,int8-dynamic,int4,int4+head8"

#: a few built-in prompts of different kinds (used when no --prompts file is given)
BUILTIN_PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a hash table works and when you would use one instead of a sorted array.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "A train travels 120 km in 1.5 hours. What is its average speed? Explain step by step.",
    "Summarize the main causes of the French Revolution in a few paragraphs.",
    "Give me five tips for keeping houseplants healthy during winter.",
    "Translate into French: 'The weather is nice today, let us go for a walk in the park.'",
    "What are the differences between TCP and UDP? Give an example use for each.",
]


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------


def load_model(path: str | None = None, *, device: str = "cpu"):
    """``(model, tokenizer)`` in float32: ``path`` (a local directory or .gguf file), by default the embedded SmolLM2."""
    from specdec.models import load_model as _load

    return _load(path or "smollm2", device=device)


def load_prompts(path: str | None = None, limit: int | None = None) -> list[str]:
    """Prompts from a JSONL file (a ``prompt`` field, or Spec-Bench's ``turns`` list: the first
    turn), taken round-robin over ``category`` when present; default: :data:`BUILTIN_PROMPTS`.

    Raises:
        specdec.prompts.PromptFileError: the file is missing or malformed (one-line message).
    """
    if path is None:
        prompts = list(BUILTIN_PROMPTS)
        return prompts[:limit] if limit else prompts
    return [r.text for r in round_robin(read_prompt_file(path), limit)]


# --------------------------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------------------------


def _inference_mode(fn: _F) -> _F:
    """``@torch.inference_mode()``, with torch imported when ``fn`` runs rather than when this module loads."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        import torch

        with torch.inference_mode():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


@dataclass
class SchemeResult:
    """One row of the report."""

    scheme: str
    backend: str
    bytes: int
    added_bytes: int
    ms_per_token: float
    ms_per_8_tokens: float
    agreement: float
    positions: int
    quantize_s: float
    weight_error: float | None = None
    stored_weight_error: float | None = None
    head_weight_error: float | None = None
    grid_bound: bool = False
    grid_note: str = ""
    tokens_per_pass: dict[int, float] = field(default_factory=dict)
    best_k: int | None = None
    est_speedup: float | None = None


def estimate_speedup(a: float, draft_ms: float, verify_1: float, verify_8: float, k: int) -> float:
    """Greedy speculative speedup over plain decoding under an i.i.d. agreement model.

    One step drafts ``k`` tokens (``k`` drafter forwards) and verifies ``k+1`` positions in one
    pass, whose cost is interpolated linearly between the measured 1- and 8-token forwards.
    """
    verify = VerifyCost((1, 8), (verify_1, verify_8))
    return chain_rate(a, k, k * draft_ms + verify(k + 1)) * verify_1


@_inference_mode
def _greedy_references(model, tokenizer, prompts: Sequence[str], positions: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(prompt ids, greedy continuation ids) per prompt, ``positions`` continuation tokens in all."""
    import torch

    dev = next(model.parameters()).device
    per_prompt = max(1, math.ceil(positions / len(prompts)))
    refs, total = [], 0
    for p in prompts:
        if total >= positions:
            break
        ids = encode_prompt(tokenizer, p).to(dev)
        n = min(per_prompt, positions - total)
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
        cont = out[:, ids.shape[1]:]
        refs.append((ids, cont))
        total += cont.shape[1]
    return refs


@_inference_mode
def measure_agreement(draft: nn.Module, refs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, int]:
    """Top-1 agreement of ``draft`` with the reference continuations, run as a drafter runs:
    prefill the prompt, then one token per forward on a KV cache (dynamic int8 schemes quantize
    activations per call, so a whole-sequence forward would not measure the same thing)."""
    from transformers import DynamicCache

    from specdec.runners.cache import cache_argument

    arg = cache_argument(draft)
    hits = n = 0
    for ids, cont in refs:
        cache = DynamicCache(config=draft.config)
        logits = draft(input_ids=ids, use_cache=True, **{arg: cache}).logits[:, -1]
        for i in range(cont.shape[1]):
            hits += int(logits.argmax(-1).item() == cont[0, i].item())
            n += 1
            if i + 1 < cont.shape[1]:
                logits = draft(input_ids=cont[:, i:i + 1], use_cache=True, **{arg: cache}).logits[:, -1]
    return (hits / n if n else float("nan")), n


def _context(refs, ctx: int, dev) -> torch.Tensor:
    import torch

    seq = torch.cat([torch.cat([i, c], dim=1) for i, c in refs], dim=1)
    while seq.shape[1] < ctx + 8:
        seq = torch.cat([seq, seq], dim=1)
    return seq[:, : ctx + 8].to(dev)


@_inference_mode
def _time_rounds(models: dict[str, nn.Module], seq: torch.Tensor, ctx: int, repeats: int, warmup: int = 2) -> dict[str, tuple[float, float]]:
    """Median ms of a 1-token and an 8-token forward after ``ctx`` cached tokens, interleaved."""
    from transformers import DynamicCache

    from specdec.runners.cache import cache_argument

    caches, args = {}, {name: cache_argument(m) for name, m in models.items()}
    for name, m in models.items():
        c = DynamicCache(config=m.config)
        m(input_ids=seq[:, :ctx], use_cache=True, **{args[name]: c})
        caches[name] = c
    one = seq[:, ctx:ctx + 1]
    eight = seq[:, ctx:ctx + 8]
    t1: dict[str, list[float]] = {k: [] for k in models}
    t8: dict[str, list[float]] = {k: [] for k in models}
    for r in range(warmup + repeats):
        for name, m in models.items():
            c = caches[name]
            for ids, store in ((one, t1), (eight, t8)):
                t0 = time.perf_counter()
                m(input_ids=ids, use_cache=True, **{args[name]: c})
                dt = (time.perf_counter() - t0) * 1e3
                c.crop(-ids.shape[1])
                if r >= warmup:
                    store[name].append(dt)
    return {k: (statistics.median(t1[k]), statistics.median(t8[k])) for k in models}


def quant_report(
    model: nn.Module,
    tokenizer,
    schemes: Sequence[str],
    prompts: Sequence[str],
    *,
    positions: int = 400,
    ctx: int = 200,
    repeats: int = 15,
    device: str | torch.device | None = None,
    max_k: int = 8,
    log=None,
) -> dict[str, Any]:
    """Measure each scheme's size, speed and agreement against ``model`` (see module docstring).

    Returns ``{"schemes": [row, ...], "skipped": [{"scheme", "error"}], "verifier": {...},
    "positions": n, "ctx": ctx, "repeats": repeats, "grid_tolerance": t, "torch": version,
    "threads": n}``; each row is a :class:`SchemeResult` as a dict (``grid_bound``: the
    verifier's weights lie on the scheme's grid, explained in ``grid_note``). A scheme that is
    unknown (found before any work) or unsupported on the device is reported under ``skipped``.

    Raises:
        ValueError: ``positions``, ``ctx``, ``repeats`` or ``max_k`` is below 1.
    """
    _check_sizes(positions=positions, ctx=ctx, repeats=repeats, max_k=max_k)
    import torch

    from specdec.quant import GRID_TOLERANCE, model_bytes, quantize, weight_error

    log = log or (lambda *_: None)
    skipped = []
    known = []
    for s in schemes:  # unknown names are known before the references cost a minute
        try:
            parse_scheme(s)
            known.append(s)
        except UnknownSchemeError as e:
            skipped.append({"scheme": s, "error": str(e)})
            log(f"skip {s}: {e}")
    model.eval()
    dev = next(model.parameters()).device if device is None else torch.device(device)
    refs = _greedy_references(model, tokenizer, prompts, positions)
    log(f"reference: {sum(c.shape[1] for _, c in refs)} greedy positions from {plural(len(refs), 'prompt')}")

    drafts: dict[str, nn.Module] = {}
    meta: dict[str, dict[str, Any]] = {}
    for s in known:
        try:
            t0 = time.perf_counter()
            q = quantize(model, s, device=dev)
            qs = time.perf_counter() - t0
        except (UnknownSchemeError, UnsupportedSchemeError) as e:
            skipped.append({"scheme": s, "error": str(e)})
            log(f"skip {s}: {e}")
            continue
        agreement, n = measure_agreement(q, refs)
        info = q.specdec_quant
        err = weight_error(model, s)
        meta[s] = dict(
            scheme=s, backend=info.backend, bytes=model_bytes(q), added_bytes=model_bytes(q, exclude=model),
            agreement=agreement, positions=n, quantize_s=qs, weight_error=err.weight_error,
            stored_weight_error=err.stored_weight_error, head_weight_error=err.head_weight_error,
            grid_bound=err.grid_bound, grid_note=err.note,
        )
        drafts[s] = q
        log(f"{s}: backend {info.backend}, agreement {agreement:.3f} over {n}, weight error "
            f"{_pct(err.weight_error)}{' (grid-bound)' if err.grid_bound else ''}, quantized in {qs:.1f}s")

    seq = _context(refs, ctx, dev)
    timings = _time_rounds({"__verifier__": model, **drafts}, seq, ctx, repeats)
    v1, v8 = timings["__verifier__"]
    rows = []
    for s, m in meta.items():
        ms1, ms8 = timings[s]
        a = m["agreement"]
        tpp = {k: expected_tokens(a, k) for k in range(1, max_k + 1)}
        speed = {k: estimate_speedup(a, ms1, v1, v8, k) for k in range(1, max_k + 1)}
        best_k = max(speed, key=speed.get)
        rows.append(SchemeResult(
            ms_per_token=ms1, ms_per_8_tokens=ms8, tokens_per_pass=tpp, best_k=best_k,
            est_speedup=speed[best_k], **m,
        ))
    return {
        "schemes": [asdict(r) for r in rows],
        "skipped": skipped,
        "verifier": {"bytes": model_bytes(model), "ms_per_token": v1, "ms_per_8_tokens": v8},
        "positions": sum(c.shape[1] for _, c in refs),
        "ctx": ctx,
        "repeats": repeats,
        "grid_tolerance": GRID_TOLERANCE,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def format_table(report: dict[str, Any]) -> str:
    """A Markdown table of a :func:`quant_report` result.

    ``weight err`` is the relative weight error of the body's linears against the verifier,
    ``head err`` the LM head's; ``grid`` marks a grid-bound scheme, explained under the table.
    """
    lines = [
        "| scheme | backend | bytes (MB) | added (MB) | ms/token | ms/8 tokens | agreement | weight err | head err "
        "| grid | tokens/pass k=4 | est. speedup (best k) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["schemes"]:
        lines.append(
            f"| {r['scheme']} | {r['backend']} | {r['bytes'] / 1e6:.1f} | {r['added_bytes'] / 1e6:.1f} | "
            f"{r['ms_per_token']:.1f} | {r['ms_per_8_tokens']:.1f} | {r['agreement']:.3f} | "
            f"{_pct(r.get('weight_error'))} | {_pct(r.get('head_weight_error'))} | "
            f"{'GRID-BOUND' if r.get('grid_bound') else '-'} | "
            f"{r['tokens_per_pass'][4]:.2f} | {r['est_speedup']:.2f} (k={r['best_k']}) |"
        )
    v = report["verifier"]
    lines.append(
        f"\nverifier (unquantized): {v['bytes'] / 1e6:.1f} MB, {v['ms_per_token']:.1f} ms/token, "
        f"{v['ms_per_8_tokens']:.1f} ms/8 tokens; agreement over {report['positions']} positions, "
        f"ctx {report['ctx']}, median of {report['repeats']} interleaved rounds, "
        f"torch {report['torch']}, threads: {report['threads']}"
    )
    bound = [r["scheme"] for r in report["schemes"] if r.get("grid_bound")]
    if bound:
        from specdec.quant import GRID_BOUND_NOTE, GRID_TOLERANCE

        lines.append(f"GRID-BOUND {', '.join(bound)}: {GRID_BOUND_NOTE} "
                     f"(weight error <= {report.get('grid_tolerance', GRID_TOLERANCE):g})")
    for s in report["skipped"]:
        lines.append(f"skipped {s['scheme']}: {s['error']}")
    return "\n".join(lines)


def _check_sizes(*, positions: int, ctx: int, repeats: int, max_k: int) -> None:
    """One-line ValueError for a count that cannot work (before any reference is generated)."""
    for name, value in (("positions", positions), ("ctx", ctx), ("repeats", repeats), ("max_k", max_k)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


# --------------------------------------------------------------------------------------------
# CLI hooks (wired into specdec/cli.py as `specdec quant-report`)
# --------------------------------------------------------------------------------------------


def add_quant_report_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``quant-report`` options to ``parser``."""
    parser.add_argument("--schemes", default=DEFAULT_SCHEMES,
                        help=f"comma-separated schemes (default: {DEFAULT_SCHEMES})")
    parser.add_argument("--model", default=None,
                        help="local HF model directory or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--prompts", default=None,
                        help="JSONL file with a 'prompt' field or a Spec-Bench 'turns' list per line "
                             "(default: a few built-in prompts)")
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts to use from --prompts (default 8)")
    parser.add_argument("--positions", type=int, default=400,
                        help="greedy positions over which agreement is measured (default 400)")
    parser.add_argument("--ctx", type=int, default=200, help="cached tokens for the timings (default 200)")
    parser.add_argument("--repeats", type=int, default=15, help="timing rounds; medians are reported (default 15)")
    parser.add_argument("--device", default="cpu", help="device (default cpu)")
    parser.add_argument("--no-auto", dest="auto", action="store_false",
                        help="leave out draft='auto''s ranking (every drafter it considers, measured through the real "
                             "loop on this machine: what `--draft auto` would choose; about a minute)")
    parser.add_argument("--num-draft-tokens", "-k", type=int, default=4, help="k of the auto ranking (default 4)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout; "
                        "'auto' holds the ranking (null with --no-auto)")
    return parser


def check_quant_report_arguments(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Check parsed ``args`` before any model is loaded; return ``(schemes, prompts)``.

    Raises ``SystemExit`` with a one-line ``error: ...`` message for a count below 1
    (``--positions``, ``--ctx``, ``--repeats``, ``--num-prompts``), an empty or unknown
    ``--schemes`` entry, a bad ``--device``, a ``--model`` that is not a local model, or a missing
    or malformed ``--prompts`` file.
    """
    for flag, attr in (("--positions", "positions"), ("--ctx", "ctx"), ("--repeats", "repeats"),
                       ("--num-prompts", "num_prompts"), ("--num-draft-tokens", "num_draft_tokens")):
        value = getattr(args, attr, 1)
        if value is not None and value < 1:
            raise SystemExit(f"error: {flag} must be >= 1, got {value}")
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    if not schemes:
        raise SystemExit("error: --schemes is empty; give comma-separated schemes, e.g. int8,int4+head8")
    for s in schemes:
        try:
            parse_scheme(s)
        except UnknownSchemeError as e:
            raise SystemExit(f"error: --schemes: {e}") from None
    import torch

    try:
        torch.device(args.device)
    except (RuntimeError, ValueError, TypeError):
        raise SystemExit(f"error: --device {args.device!r} is not a device (e.g. cpu, cuda, cuda:1)") from None
    if args.model is not None:  # the embedded default is checked when it loads
        from specdec.models import ModelNotFoundError, resolve_model_source

        try:
            resolve_model_source(args.model)
        except ModelNotFoundError as e:
            raise SystemExit(f"error: --model: {e}") from None
    try:
        prompts = load_prompts(args.prompts, limit=getattr(args, "num_prompts", None))
    except PromptFileError as e:
        raise SystemExit(f"error: --prompts: {e}") from None
    return schemes, prompts


def run_quant_report(args: argparse.Namespace) -> int:
    """Run the report described by parsed ``args``; print a table (and JSON with ``--json``).

    Arguments are checked (:func:`check_quant_report_arguments`) before the model loads.
    """
    schemes, prompts = check_quant_report_arguments(args)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731  (stdout stays parseable)
    from specdec.models import ModelNotFoundError

    try:
        model, tok = load_model(args.model, device=args.device)
    except ModelNotFoundError as e:
        raise SystemExit(f"error: {e}") from None
    report = quant_report(
        model, tok, schemes, prompts, positions=args.positions, ctx=getattr(args, "ctx", 200),
        repeats=getattr(args, "repeats", 15), log=log,
    )
    print(format_table(report))
    report["auto"] = None
    if getattr(args, "auto", False):
        log("ranking the drafters draft='auto' considers (each drafts a few calibration prompts) ...")
        choice = auto_ranking(model, tok, getattr(args, "num_draft_tokens", 4))
        print(f"\ndraft='auto' on this machine, k={choice.k} (decode tokens/s through the real loop):\n{choice.table()}\n"
              f"chosen: {choice.reason()}")
        report["auto"] = choice.to_dict()
    if args.json:
        print(json.dumps(report))
    return 0 if report["schemes"] else 1


def auto_ranking(model: nn.Module, tokenizer: Any, k: int = 4) -> Any:
    """What ``draft="auto"`` measures and chooses for ``model`` at ``k`` on this machine (an ``AutoChoice``)."""
    from specdec.api import SpeculativeModel

    drafter = SpeculativeModel(model, "auto", num_draft_tokens=k, tokenizer=tokenizer).drafter
    drafter.choose()
    return drafter.decision


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m specdec.quant_report``: the same as ``specdec quant-report``."""
    p = add_quant_report_arguments(argparse.ArgumentParser(prog="specdec quant-report", description=__doc__))
    return run_quant_report(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
