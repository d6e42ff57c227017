"""Host overhead per verify pass: the CPU proxies of issue 43, section 3 (ops, syncs, allocations, wall ms).

On this CPU a tiny model is dispatch-bound as a GPU is launch-bound, so what the loop dispatches around the
verifier's own forward predicts its GPU host overhead. For each drafter kind, model and batch size this runs
one greedy call of a fixed length twice:

- **counted** under :class:`specdec.host_trace.HostTrace`: syncs per pass (mean and max over steady passes, with
  their sites), aten ops per pass split into the drafter's ``propose`` (``draft``), the verifier model's forward
  (``verifier``: ``CausalLMRunner.run`` / ``run_static`` of the runner whose role is ``"verifier"``) and the rest
  (``other``: verification, committing, bookkeeping), and allocations per pass;
- **timed** without the trace (its dispatch mode slows every op): wall ms per pass (``propose`` to ``propose``)
  minus the verifier forward's ms inside that pass, the best of ``--repeats`` calls after a warm-up; the same in
  this thread's CPU time (``cpu_*`` keys), which time spent waiting for a shared core does not inflate;

and beside them a bare verifier forward of the same width ``k + 1`` (plain transformers, its own
``DynamicCache``, no specdec code) over a cache of the call's mean length. Counts are deterministic and are
what to compare; times are trends on a busy 2-core machine.

Per configuration the JSON (``results[model][drafter][batch]``) holds the contract keys ``syncs_per_pass`` (mean
over steady passes; ``syncs_per_pass_max`` beside it), ``ops_per_draft_step`` (ops in ``propose`` per drafter
forward, or per drafted token for drafters without a model), ``ops_per_verifier_step``, ``overhead_ops_per_pass``
(every op of a pass but the verifier's forward, drafting included), ``overhead_ms_per_pass`` and
``verifier_ms_per_step`` (the bare forward), plus allocations per pass, the top sync sites, ops per region, tokens
per pass and a digest of the output (greedy: old and new code must agree on it).

    .venv/bin/python benchmarks/overhead.py --json benchmarks/results/overhead/after.json
    .venv/bin/python benchmarks/overhead.py --models tiny smollm2 --json out.json   # + the embedded model (slow)

Old code, same script: a worktree of the old commit with ``specdec/host_trace.py`` copied in, first on
``PYTHONPATH`` (run from outside /work/main, so that the current directory does not shadow it)::

    git -C /work/main worktree add /tmp/before b72c939 && cp /work/main/specdec/host_trace.py /tmp/before/specdec/
    cd /tmp && PYTHONPATH=/tmp/before /work/main/.venv/bin/python /work/main/benchmarks/overhead.py \\
        --json /work/main/benchmarks/results/overhead/before-b72c939.json

Then ``--compare before.json after.json`` prints the before/after table of BENCHMARKS.md (measuring nothing), and
``--compare before.json`` beside a measurement compares it with the one just made.

The script only uses what both sides have: ``SpeculativeModel``, ``ChainPlan.propose``'s arguments,
``CausalLMRunner.run`` / ``run_static`` and ``role``, a drafter's ``forwards`` counter, and the host trace.
The JSON records which ``specdec`` it measured (``meta.specdec``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

#: the per-drafter keys other tools read (issue 43): never rename them
CONTRACT_KEYS = ("syncs_per_pass", "ops_per_draft_step", "ops_per_verifier_step", "overhead_ops_per_pass",
                 "overhead_ms_per_pass", "verifier_ms_per_step")
DRAFTERS = ("eagle", "self:int8", "prompt-lookup", "composite:int8")
#: more kinds on request: ``eagle-static`` is the head drafting through its fixed-shape region (what
#: ``compile_drafter=True`` captures as one CUDA graph on a GPU), run eagerly so that its ops are counted
EXTRA_DRAFTERS = ("eagle-static",)
MODELS = ("tiny", "smollm2")
#: the runner methods that run a model's forward; with role "verifier" they are the verifier's own forward
RUNNER_METHODS = ("run", "run_static")
TINY_VOCAB = 96
TINY_PROMPTS = {1: (20,), 4: (20, 13, 26, 9)}  # ragged, left-padded at batch 4
CHAT_PROMPTS = (
    "Write a Python function that returns the squares of a list of numbers, then call it on [1, 2, 3].",
    "Explain how a hash table works, in three sentences.",
    "List the planets of the solar system in order.",
    "What is the capital of France? Answer in one sentence.",
)


# ---- models, drafters, prompts ---------------------------------------------------------------------------
def tiny_model(layers: int = 16, hidden: int = 64, vocab: int = TINY_VOCAB, seed: int = 0) -> torch.nn.Module:
    """A random fp32 Llama like tests/tiny_models.py's, ``layers`` deep (16: a verifier as deep as a 1B one)."""
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab, initializer_range=0.3,
                            bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def tiny_head(model: torch.nn.Module, seed: int = 0, draft_vocab: int = 48) -> Any:
    """A random EAGLE-3 head on ``model`` (as tests/test_eagle.py's ``_random_head``): a draft vocabulary of
    ``draft_vocab`` tokens, the verifier's embeddings and LM head attached."""
    from specdec.heads import EagleHead, HeadConfig

    torch.manual_seed(seed)
    config = HeadConfig.for_verifier(model.config, "eagle3", draft_vocab_size=draft_vocab)
    head = EagleHead(config)
    keep = torch.randperm(config.vocab_size, device="cpu")[: config.draft_vocab_size].sort().values
    head.d2t.copy_(keep - torch.arange(len(keep), device="cpu"))
    head.t2d.zero_()
    head.t2d[keep] = True
    head.attach(model.get_input_embeddings(), model.get_output_embeddings())
    return head.eval()


def draft_argument(kind: str, model_name: str, model: torch.nn.Module) -> Any:
    """What ``SpeculativeModel(draft=...)`` gets for ``kind``: the tiny model has no shipped head, so ``eagle``
    is a random head there; everything else is the draft string itself."""
    from specdec.drafters import resolve_drafter
    from specdec.drafters.eagle import EagleDrafter

    if kind.startswith("eagle"):
        drafter = EagleDrafter(tiny_head(model), model) if model_name == "tiny" else resolve_drafter("eagle", model)
        drafter.static_draft = kind == "eagle-static"
        return drafter
    return kind


def load(model_name: str, layers: int) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)``; the tiny model has no tokenizer."""
    if model_name == "tiny":
        return tiny_model(layers=layers), None
    from specdec.models import load_model

    model, tokenizer = load_model(model_name)
    return model.eval(), tokenizer


def prompts(model_name: str, tokenizer: Any, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(input_ids, attention_mask)`` of ``batch`` rows (ragged when ``batch > 1``)."""
    if model_name == "tiny":
        lengths = TINY_PROMPTS.get(batch) or tuple(20 - 3 * (r % 4) for r in range(batch))
        gen = torch.Generator(device="cpu").manual_seed(seed)
        width = max(lengths)
        ids = torch.zeros((len(lengths), width), dtype=torch.long, device="cpu")
        mask = torch.zeros((len(lengths), width), dtype=torch.long, device="cpu")
        for r, n in enumerate(lengths):
            ids[r, width - n:] = torch.randint(3, TINY_VOCAB, (n,), generator=gen, device="cpu")
            mask[r, width - n:] = 1
        return ids, mask
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": CHAT_PROMPTS[r % len(CHAT_PROMPTS)]}],
                                           add_generation_prompt=True, tokenize=False) for r in range(batch)]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


# ---- probes: what each pass did ------------------------------------------------------------------------
@contextmanager
def patched(owner: Any, attr: str, make: Callable[[Callable], Callable]) -> Iterator[None]:
    """``owner.attr`` replaced by ``make(original)`` inside the block (an inherited attribute is shadowed, then
    uncovered again)."""
    own = attr in owner.__dict__
    original = owner.__dict__[attr] if own else getattr(owner, attr)
    setattr(owner, attr, make(original))
    try:
        yield
    finally:
        if own:
            setattr(owner, attr, original)
        else:
            delattr(owner, attr)


class PassProbe:
    """Per pass (one ``ChainPlan.propose`` to the next): its start time, batch, drafter forwards and the seconds of
    the verifier's forwards; with a trace, ``propose`` counts in region ``draft`` and the verifier's forwards in
    ``verifier``. Install with ``with probe.installed(): ...`` (before the trace is opened: its own pass markers
    then wrap ours)."""

    def __init__(self, trace: Any = None) -> None:
        self.trace = trace
        self.starts: list[float] = []  # wall clock (perf_counter)
        self.cpu_starts: list[float] = []  # this thread's CPU time: what contention for the cores does not inflate
        self.batches: list[int] = []
        self.forwards: list[int] = []
        self.widths: list[int] = []  # tokens drafted (read from the proposal: the plan's k, or fewer)
        self.verifier_seconds: list[float] = []
        self.verifier_cpu_seconds: list[float] = []

    def _region(self, name: str) -> Any:
        return self.trace.region(name) if self.trace is not None else nullcontext()

    @contextmanager
    def installed(self) -> Iterator[None]:
        from specdec.chains import ChainPlan
        from specdec.runners.hf import CausalLMRunner

        probe = self

        def propose(original: Callable) -> Callable:
            def wrapper(plan: Any, drafter: Any, rows: Any, *args: Any, **kwargs: Any) -> Any:
                probe.starts.append(time.perf_counter())
                probe.cpu_starts.append(time.thread_time())
                probe.batches.append(len(rows))
                probe.verifier_seconds.append(0.0)
                probe.verifier_cpu_seconds.append(0.0)
                before = drafter.forwards
                with probe._region("draft"):
                    drafts = original(plan, drafter, rows, *args, **kwargs)
                probe.forwards.append(drafter.forwards - before)
                probe.widths.append(int(getattr(drafts, "num_tokens", 0)))
                return drafts
            return wrapper

        def forward(original: Callable) -> Callable:
            def wrapper(runner: Any, *args: Any, **kwargs: Any) -> Any:
                if getattr(runner, "role", None) != "verifier" or not probe.starts:  # a drafter's, or the prefill
                    return original(runner, *args, **kwargs)
                t0, c0 = time.perf_counter(), time.thread_time()
                with probe._region("verifier"):
                    out = original(runner, *args, **kwargs)
                probe.verifier_seconds[-1] += time.perf_counter() - t0
                probe.verifier_cpu_seconds[-1] += time.thread_time() - c0
                return out
            return wrapper

        with ExitStack() as stack:
            stack.enter_context(patched(ChainPlan, "propose", propose))
            for name in RUNNER_METHODS:
                if name in CausalLMRunner.__dict__:
                    stack.enter_context(patched(CausalLMRunner, name, forward))
            yield

    def steady(self) -> list[int]:
        """Indices of the steady passes, as :meth:`HostTrace.steady` picks them: not the last, none after which
        rows left the batch."""
        return [i for i in range(len(self.batches) - 1) if self.batches[i + 1] == self.batches[i]]


def _cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model.forward`` takes its cache by: ``cache`` (transformers 5.x) or ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


# ---- one configuration ----------------------------------------------------------------------------------
def gen_kwargs(tokenizer: Any, mask: torch.Tensor, max_new_tokens: int) -> dict:
    """Greedy, exactly ``max_new_tokens`` per row (no end-of-sequence stop: every call makes the same passes)."""
    pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    return dict(attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                pad_token_id=0 if pad is None else pad)


def counted(spec: Any, ids: torch.Tensor, kwargs: dict, k: int, top_sites: int = 5) -> dict:
    """One call under the host trace: per steady pass, syncs, ops by region, allocations, drafter forwards."""
    from specdec.host_trace import HostTrace

    trace = HostTrace()
    probe = PassProbe(trace)
    with torch.no_grad(), probe.installed():
        with trace:
            trace.mark_engine()
            sequences = spec.generate(ids, **kwargs)
    steady = trace.steady()
    if not steady:
        raise RuntimeError(f"no steady pass in {len(trace.passes)} passes: raise --max-new-tokens")
    n = len(steady)

    def mean(values: list[float]) -> float:
        return sum(values) / n

    ops = {region: mean([r.ops.get(region, 0) for r in steady]) for region in ("draft", "verifier", "other")}
    steps = [probe.forwards[r.index] or probe.widths[r.index] or k for r in steady]  # forwards, or k without a model
    syncs = [r.sync_count for r in steady]
    allocations = [sum(r.allocations.values()) for r in steady]
    sites = trace.sync_sites(steady).most_common(top_sites)
    stats = spec.last_stats
    return {
        "syncs_per_pass": mean(syncs),
        "syncs_per_pass_max": max(syncs),
        "ops_per_draft_step": sum(r.ops.get("draft", 0) for r in steady) / sum(steps),
        "ops_per_verifier_step": ops["verifier"],
        "overhead_ops_per_pass": ops["draft"] + ops["other"],
        "ops_per_pass": ops,
        "allocations_per_pass": mean(allocations),
        "overhead_allocations_per_pass": mean([a - r.allocations.get("verifier", 0)
                                               for a, r in zip(allocations, steady)]),
        "uploads_per_pass": mean([r.uploads for r in steady]),
        "setup_syncs": trace.records[0].sync_count,
        "draft_steps_per_pass": sum(steps) / n,
        "sync_sites": [f"{c / n:.2f}/pass {what} @ {site}" for (what, site), c in sites],
        "passes": len(trace.passes),
        "steady_passes": n,
        "tokens_per_pass": stats.new_tokens / max(1, sum(probe.batches)),
        # greedy: old and new code must produce the same tokens, hence the same passes (compare the digests)
        "output_digest": hashlib.sha1(str(sequences.tolist()).encode()).hexdigest()[:12],
    }


def timed(spec: Any, ids: torch.Tensor, kwargs: dict, repeats: int) -> dict:
    """Ms per steady pass and of the verifier forward inside it, without the trace, in wall time and in this
    thread's CPU time (one torch thread: the ops run on it; descheduled time on the shared cores is not counted):
    a warm-up call, then for each clock the best (least disturbed) of ``repeats`` calls by overhead."""
    best: dict[str, dict] = {}
    with torch.no_grad():
        for attempt in range(repeats + 1):
            probe = PassProbe()
            with probe.installed():
                spec.generate(ids, **kwargs)
            if attempt == 0:
                continue  # warm-up: first-call allocations, lazy imports
            steady = probe.steady()
            if not steady:
                raise RuntimeError("no steady pass: raise --max-new-tokens")
            for clock, starts, inside in (("wall", probe.starts, probe.verifier_seconds),
                                          ("cpu", probe.cpu_starts, probe.verifier_cpu_seconds)):
                pass_ms = 1000 * statistics.fmean(starts[i + 1] - starts[i] for i in steady)
                verifier_ms = 1000 * statistics.fmean(inside[i] for i in steady)
                row = {"pass_ms": pass_ms, "verifier_ms_in_pass": verifier_ms,
                       "overhead_ms_per_pass": pass_ms - verifier_ms}
                if clock not in best or row["overhead_ms_per_pass"] < best[clock]["overhead_ms_per_pass"]:
                    best[clock] = row
    out = dict(best["wall"])
    out.update({f"cpu_{key}": value for key, value in best["cpu"].items()})
    return out


def bare_verifier_ms(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, width: int, context: int,
                     repeats: int = 20) -> tuple[float, float]:
    """Median ``(wall ms, CPU ms)`` of a plain transformers forward of ``width`` tokens per row over a
    ``DynamicCache`` of ``context`` slots (the prompt plus random continuation), rolled back after each: the
    verifier's own step."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    vocab = model.get_input_embeddings().weight.shape[0]
    batch, extra = ids.shape[0], max(0, context - ids.shape[1])
    device = model.device
    tail = torch.randint(3, vocab, (batch, extra), generator=gen, device="cpu")
    full = torch.cat([ids.to("cpu"), tail], dim=1).to(device)
    full_mask = torch.cat([mask.to("cpu"), torch.ones((batch, extra), dtype=mask.dtype, device="cpu")], dim=1)
    block = torch.randint(3, vocab, (batch, width), generator=gen, device="cpu").to(device)
    step_mask = torch.cat([full_mask, torch.ones((batch, width), dtype=mask.dtype, device="cpu")], dim=1).to(device)
    name = _cache_keyword(model)
    with torch.no_grad():
        out = model(input_ids=full, attention_mask=full_mask.to(device), use_cache=True)
        cache = out["cache"] if "cache" in out else out["past_key_values"]  # renamed in transformers 5.x
        times, cpu_times = [], []
        for i in range(repeats + 3):
            t0, c0 = time.perf_counter(), time.thread_time()
            model(input_ids=block, attention_mask=step_mask, use_cache=True, **{name: cache})
            elapsed, cpu = time.perf_counter() - t0, time.thread_time() - c0
            cache.crop(-width)  # back to the context (a negative crop removes tokens in old and new transformers)
            if i >= 3:  # the first ones warm the allocator
                times.append(elapsed)
                cpu_times.append(cpu)
    return 1000 * statistics.median(times), 1000 * statistics.median(cpu_times)


def measure(model_name: str, model: torch.nn.Module, tokenizer: Any, kind: str, batch: int,
            args: argparse.Namespace, log: Callable[[str], None] = print) -> dict:
    """Every figure of one (model, drafter, batch): counted, timed, and the bare verifier forward."""
    import specdec

    ids, mask = prompts(model_name, tokenizer, batch)
    ids, mask = ids.to(model.device), mask.to(model.device)
    spec = specdec.SpeculativeModel(model, draft_argument(kind, model_name, model), num_draft_tokens=args.k,
                                    tokenizer=tokenizer)
    kwargs = gen_kwargs(tokenizer, mask, args.max_new_tokens)
    t0 = time.perf_counter()
    row = counted(spec, ids, kwargs, args.k)
    row.update(timed(spec, ids, kwargs, args.repeats))
    context = ids.shape[1] + args.max_new_tokens // 2  # the call's mean cache length
    wall, cpu = bare_verifier_ms(model, ids, mask, args.k + 1, context)
    row["verifier_ms_per_step"], row["cpu_verifier_ms_per_step"] = wall, cpu
    row["wall_s"] = time.perf_counter() - t0
    log(f"  {model_name} {kind} batch {batch}: {row['syncs_per_pass']:.1f} syncs/pass, "
        f"{row['overhead_ops_per_pass']:.0f} overhead ops/pass, {row['overhead_ms_per_pass']:.2f} overhead ms/pass "
        f"({row['wall_s']:.0f} s)")
    return row


# ---- report --------------------------------------------------------------------------------------------
def iter_rows(report: dict) -> Iterator[tuple[str, str, int, dict]]:
    """``(model, drafter, batch, row)`` of every measured configuration of a report."""
    for model_name, drafters in report["results"].items():
        for kind, batches in drafters.items():
            for batch, row in batches.items():
                yield model_name, kind, int(batch), row


def markdown(report: dict) -> str:
    """The report as a markdown table (counts first: they are what to compare), then the top sync sites."""
    lines = ["| model | drafter | batch | syncs/pass (max) | ops/draft step | ops/verifier step | overhead ops/pass | "
             "allocs/pass | overhead ms/pass, wall (CPU) | verifier ms/step, wall (CPU) | tokens/pass |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for model_name, kind, batch, r in iter_rows(report):
        lines.append(f"| {model_name} | {kind} | {batch} | {r['syncs_per_pass']:.1f} ({r['syncs_per_pass_max']}) | "
                     f"{_count(r['ops_per_draft_step'])} | {r['ops_per_verifier_step']:.0f} | "
                     f"{r['overhead_ops_per_pass']:.0f} | {r['allocations_per_pass']:.0f} | "
                     f"{r['overhead_ms_per_pass']:.2f} ({r['cpu_overhead_ms_per_pass']:.2f}) | "
                     f"{r['verifier_ms_per_step']:.2f} ({r['cpu_verifier_ms_per_step']:.2f}) | "
                     f"{r['tokens_per_pass']:.2f} |")
    lines.append("")
    for model_name, kind, batch, r in iter_rows(report):
        lines.append(f"- {model_name} {kind} batch {batch}: " + ("; ".join(r["sync_sites"]) or "no syncs"))
    return "\n".join(lines)


def _count(value: float) -> str:
    """A count for a table: whole above 10, two significant digits below (a lookup's 0.26 ops a draft step)."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


#: the before/after table's columns: (heading, key, format; None: :func:`_count`)
COMPARED: tuple[tuple[str, str, str | None], ...] = (
    ("syncs/pass", "syncs_per_pass", "{:.1f}"), ("overhead ops/pass", "overhead_ops_per_pass", "{:.0f}"),
    ("ops/draft step", "ops_per_draft_step", None), ("allocs/pass", "allocations_per_pass", "{:.0f}"),
    ("overhead CPU ms/pass", "cpu_overhead_ms_per_pass", "{:.2f}"))


def compare(before: dict, after: dict | None) -> str:
    """A before/after markdown table of the counts that issue 43's targets name (and CPU ms as a trend); without
    ``after``, its cells read ``pending``. Rows of ``before`` only; ``*`` marks outputs that differ (greedy: they
    must not)."""
    heading = " | ".join(f"{h} before | after" for h, _, _ in COMPARED)
    lines = [f"| model | drafter | batch | {heading} |", "|---|---|---:|" + "---:|" * (2 * len(COMPARED))]
    for model_name, kind, batch, old in iter_rows(before):
        new = ((after or {}).get("results", {}).get(model_name, {}).get(kind, {}).get(str(batch)))
        cells = []
        for _, key, fmt in COMPARED:
            show = _count if fmt is None else fmt.format
            cells += [show(old[key]), "pending" if new is None else show(new[key])]
        flag = " *" if new is not None and new.get("output_digest") != old.get("output_digest") else ""
        lines.append(f"| {model_name} | {kind}{flag} | {batch} | " + " | ".join(cells) + " |")
    settings = ("k", "max_new_tokens", "tiny_layers")  # what must match for the rows to be comparable
    differ = [key for key in settings if after is not None and before["meta"].get(key) != after["meta"].get(key)]
    if differ:
        lines.append(f"\nNot comparable: the reports differ in {', '.join(differ)}.")
    return "\n".join(lines)


def _commit(path: Path) -> str | None:
    """The checkout's short commit, ``+dirty`` when tracked files differ from it (read-only git calls)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    try:
        return git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "--untracked-files=no")
                                                      else "")
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv: list[str] | None = None, log: Callable[[str], None] = print) -> dict:
    """Measure every requested configuration; write ``--json`` and print the table. Returns the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["tiny"], choices=MODELS)
    ap.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS + EXTRA_DRAFTERS)
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 4])
    ap.add_argument("-k", type=int, default=4, help="draft tokens per pass (fixed)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--layers", type=int, default=16, help="layers of the tiny model")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per configuration (after one warm-up)")
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--compare", type=Path, nargs="+", default=None, metavar=("BEFORE", "AFTER"),
                    help="print a before/after table against the report BEFORE (with AFTER too: of those two "
                         "reports, measuring nothing)")
    args = ap.parse_args(argv)
    if args.compare is not None and len(args.compare) > 2:
        ap.error("--compare takes BEFORE [AFTER]")
    if args.compare is not None and len(args.compare) == 2:
        before, after = (json.loads(path.read_text()) for path in args.compare)
        log(compare(before, after))
        return after

    import transformers

    import specdec

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: stable timings, and per-op dispatch is what we measure
    source = Path(specdec.__file__).resolve().parent.parent
    report: dict = {
        "meta": {"specdec": str(source), "commit": _commit(source), "torch": torch.__version__,
                 "transformers": transformers.__version__, "k": args.k,
                 "max_new_tokens": args.max_new_tokens, "tiny_layers": args.layers, "repeats": args.repeats,
                 "threads": 1, "greedy": True, "argv": sys.argv[1:] if argv is None else list(argv)},
        "results": {},
    }
    log(f"specdec from {source} ({report['meta']['commit']})")
    try:
        for model_name in args.models:
            model, tokenizer = load(model_name, args.layers)
            per_model = report["results"].setdefault(model_name, {})
            for kind in args.drafters:
                for batch in args.batches:
                    row = measure(model_name, model, tokenizer, kind, batch, args, log)
                    per_model.setdefault(kind, {})[str(batch)] = row
                    if args.json is not None:  # rewritten after each row: a long run keeps what it measured
                        args.json.parent.mkdir(parents=True, exist_ok=True)
                        args.json.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        torch.set_num_threads(threads)
    log(markdown(report))
    if args.compare is not None:
        log("\n" + compare(json.loads(args.compare[0].read_text()), report))
    return report


if __name__ == "__main__":
    main()
