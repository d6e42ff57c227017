"""The evaluation loop: every prompt through every method back to back, one JSON line per (prompt, method).

:func:`run_eval` plans the methods (:mod:`specdec.eval.methods`), checks the output directory and what
it already holds (:mod:`specdec.eval.records`), measures the pending (prompt, method) pairs
(:mod:`specdec.eval.measure`) and writes the summary, report and plots (:mod:`specdec.eval.report`).

For ``self:SCHEME`` the quantized copy is built once and the same module drafts for specdec and for HF
assisted generation. Methods run in an order rotated per prompt, after one warm-up each, with the same
chat template (:func:`specdec.prompts.encode_batch`) and generation arguments. Under ``accelerate
launch`` the prompts are split between the processes and the main process gathers the report.

A method that raises on a prompt does not stop the run: its pair gets an error record (one line), and the report
counts it. With ``json_schema`` each call generates under its prompts' JSON schemas (:mod:`specdec.eval.json_schema`).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from transformers import LogitsProcessorList

from specdec.constraints.adapt import AnyOrder
from specdec.eval.config import EvalConfig
from specdec.eval.json_schema import SchemaConstraints, require_schemas, validity
from specdec.eval.measure import (
    WARMUP_TOKENS,
    build_runners,
    clear_cross_call_caches,
    measure_before_timing,
    prime_drafters,
    prime_verifiers,
    restore_compile_state,
)
from specdec.eval.methods import HF, SPECDEC, MethodSpec, rotate
from specdec.eval.records import (
    CONFIG_FILE,
    check_config,
    check_out_dir,
    check_prompts,
    clear,
    end_partial_line,
    error_message,
    load_records,
    make_error_record,
    make_record,
    shard_path,
)
from specdec.eval.report import EvalReport, build_summary, write_outputs
from specdec.prompts import Prompt, as_prompts, encode_batch, plural


def run_eval(model: Any, tokenizer: Any, prompts: Any, config: EvalConfig) -> EvalReport:
    """Evaluate ``model`` with each method of ``config`` on ``prompts``; write records, ``summary.json``, a
    report and plots into ``config.out_dir``.

    Args:
        model, tokenizer: the verifier (a transformers causal LM) and its tokenizer.
        prompts: :class:`~specdec.prompts.Prompt` objects, strings, dicts with a ``prompt`` (or
            Spec-Bench ``turns``) field, or a dataset path / hub name for :func:`~specdec.prompts.load_prompts`.
        config: the run's settings (:class:`~specdec.eval.EvalConfig`: methods, generation, batching,
            output directory, resume).

    Returns:
        An :class:`~specdec.eval.report.EvalReport` (``to_dict()`` is ``summary.json``); under
        ``accelerate launch`` every process returns the gathered report.

    Raises:
        OutputDirError: ``out_dir`` is a file or cannot be written (before any work).
        ResumeError: ``out_dir`` holds results of other settings or other prompt text (before generating).
        SchemaError: ``config.json_schema`` and a prompt without a valid JSON schema (before any work).
    """
    if not isinstance(config, EvalConfig):
        raise TypeError(f"run_eval takes its settings as an EvalConfig, got {type(config).__name__}: "
                        "run_eval(model, tokenizer, prompts, EvalConfig(out_dir=..., methods=..., ...))")
    out = check_out_dir(config.out_dir)  # before any work: a file or an unwritable place fails now, in one line
    config.check()
    prompts = as_prompts(prompts)
    if config.json_schema:
        require_schemas(prompts)
    methods = config.plan()
    state = _state(model)
    device = torch.device(getattr(model, "device", "cpu"))
    run_config = _run_config(model, tokenizer, config, methods, state, device)

    if state.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        if config.overwrite:
            clear(out)
    state.wait_for_everyone()
    recorded = load_records(out)
    # every process checks, so all of them stop alike
    write_config = check_config(out, run_config)
    check_prompts(out, prompts, recorded)
    state.wait_for_everyone()
    if state.is_main_process:
        (out / CONFIG_FILE).write_text(json.dumps(write_config, indent=2) + "\n")

    done = {(r["prompt_id"], r["method"]): r for r in recorded if r.get("error") is None}  # errors: tried again
    with state.split_between_processes(list(enumerate(prompts))) as mine:
        mine = list(mine)
    size = config.batch_size
    batches = [mine[i : i + size] for i in range(0, len(mine), size)]
    # per batch, the methods with a pair still to record, in the batch's rotation order
    todo = [(batch, [m for m in rotate(methods, batch[0][0] // size)
                     if any((p.id, m.name) not in done for _, p in batch)]) for batch in batches]
    todo = [t for t in todo if t[1]]

    grammar_seconds = None
    if todo:
        with restore_compile_state(model):  # hf-compiled leaves a compiled call on the model: removed after
            grammar_seconds = _evaluate(model, tokenizer, todo, methods, done, config, out, state)
    state.wait_for_everyone()

    summary_config = {**run_config, **dict(config.summary_config or {}), "num_processes": state.num_processes,
                      "device": str(device), "dtype": run_config["dtype"]}
    if config.json_schema:  # untimed: compiled before the first generation (this run's; None when all was resumed)
        summary_config["grammar_compile_seconds"] = None if grammar_seconds is None else round(grammar_seconds, 4)
    if state.is_main_process:  # gather: every process's shard is complete after the barrier above
        records = load_records(out)
        report = EvalReport(build_summary(records, methods, prompts, summary_config), records, out)
        write_outputs(report, out, plots=config.plots)
    state.wait_for_everyone()
    if not state.is_main_process:
        report = EvalReport.load(out)
    return report


def _state(model: Any) -> Any:
    """accelerate's process state; on CPU it must be asked for explicitly, or torchrun workers each see one process."""
    from accelerate import PartialState

    return PartialState(cpu=getattr(model, "device", torch.device("cpu")).type == "cpu")


def _run_config(model: Any, tokenizer: Any, config: EvalConfig, methods: Sequence[MethodSpec], state: Any,
                device: torch.device) -> dict[str, Any]:
    """Every setting that changes a measurement (``eval_config.json``): a resume must match all of them
    (:data:`~specdec.eval.records.RESUME_KEYS`)."""
    sampling = config.do_sample
    return {
        "model": config.model_name or getattr(model, "name_or_path", None) or type(model).__name__,
        "dataset": config.dataset,
        "dtype": str(getattr(model, "dtype", "")).replace("torch.", ""),
        # one process: its device; several: each has its own (cuda:0, cuda:1), so their common type
        "device": str(device) if state.num_processes == 1 else device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "num_processes": state.num_processes,
        "max_new_tokens": config.max_new_tokens, "do_sample": sampling,
        "temperature": config.temperature if sampling else None, "top_p": config.top_p if sampling else None,
        "seed": config.seed if sampling else None,
        "seeding": config.seeding if sampling else None,
        "chat_template": bool(config.chat and getattr(tokenizer, "chat_template", None)),
        "prompt_lookup_num_tokens": (config.prompt_lookup_num_tokens
                                     if _uses(methods, "prompt_lookup_num_tokens") else None),
        "batch_size": config.batch_size,
        "compile_drafter": config.compile_drafter,
        "compile_verifier": config.compile_verifier,
        "json_schema": config.json_schema,
        "warmup": config.warmup,
    }


def _uses(methods: Sequence[MethodSpec], setting: str) -> bool:
    """Whether a baseline among ``methods`` reads ``setting`` (an :class:`EvalConfig` field the others ignore)."""
    return any(m.baseline is not None and setting in m.baseline.settings for m in methods)


def _evaluate(model: Any, tokenizer: Any, todo: list, methods: Sequence[MethodSpec], done: Mapping,
              config: EvalConfig, out: Path, state: Any) -> float | None:
    """Run the pending (prompt, method) pairs of this process, writing each batch's records as it finishes.

    ``todo`` holds batches: ``(prompts [(index, Prompt)], pending methods)``; a batch of one is the
    usual per-prompt run. Every method gets the same left-padded batch. Returns the seconds spent compiling
    JSON-schema grammars (``None`` without ``json_schema``).
    """
    needed = [m for m in methods if any(m in t[1] for t in todo)]
    runners = build_runners(needed, model, tokenizer, config.prompt_lookup_num_tokens, config.compile_drafter,
                            config.seeding, config.load_draft_tokenizer())
    gen_kwargs = config.generate_kwargs(tokenizer)
    device = getattr(model, "device", torch.device("cpu"))
    encoded = [encode_batch(tokenizer, [p.text for _, p in batch], config.chat, device) for batch, _ in todo]
    warm_seed = config.seed if config.do_sample else None
    constrain, grammar_seconds = _constraints(model, tokenizer, todo, config)
    measure_before_timing(runners)  # auto's drafter, tree=auto's cost curve: here, warm-up or not, never timed
    if config.compile_verifier:  # every verify-pass graph compiled now, warm-up or not, never inside a timed call
        prime_verifiers(runners, [(e, pending) for e, (_, pending) in zip(encoded, todo)], config.max_new_tokens,
                        config.progress)

    for m in needed:
        if m.baseline is not None and m.baseline.prepare is not None:
            mine = [e for e, (_, pending) in zip(encoded, todo) if m in pending]
            # prepared now, warm-up or not (hf-compiled compiles): its cost is reported apart, never inside a timed call
            runners[m.name].prepare(mine, gen_kwargs, warm_seed)

    if config.warmup:  # the first calls pay for allocations, kernel selection, lazy imports: not timed
        ids, mask = encoded[0]
        if config.compile_drafter:  # every input shape class compiled now, not inside a timed call
            prime_drafters(runners, config.progress)
        for m in needed:
            if runners[m.name].prepared is None:  # else warmed up by its prepare step above
                warm = _call_kwargs(m, {**gen_kwargs, "max_new_tokens": min(WARMUP_TOKENS, config.max_new_tokens)},
                                    constrain(todo[0][0]))
                try:
                    runners[m.name](ids, warm, warm_seed, mask)
                except Exception as err:  # a method that cannot run gets error records below, prompt by prompt
                    if _stops_run(err):
                        raise
                    warnings.warn(f"{m.name} failed its warm-up: {error_message(err)}", stacklevel=2)
        clear_cross_call_caches(runners)  # a warm cache learns from the timed calls alone, in prompt order

    pairs = sum(1 for batch, pending in todo for _, p in batch for m in pending if (p.id, m.name) not in done)
    bar = _Progress(pairs, methods, config.progress, state.process_index, state.num_processes)
    bar.add([r for batch, _ in todo for _, p in batch for r in (done.get((p.id, m.name)) for m in methods) if r], 0)
    path = shard_path(out, state.process_index, state.num_processes)
    end_partial_line(path)
    try:
        with path.open("a") as sink:
            for number, (batch, pending) in enumerate(todo):
                records = _measure_batch(runners, batch, pending, encoded[number], gen_kwargs, done, config,
                                         tokenizer, state.process_index, constrain)
                # one write per batch: a run cut short loses at most the batch in flight
                sink.write("".join(json.dumps(r) + "\n" for r in records))
                sink.flush()
                bar.add(records, len(records))
    finally:
        bar.close()
    return grammar_seconds


def _constraints(model: Any, tokenizer: Any, todo: list,
                 config: EvalConfig) -> tuple[Callable[[Sequence], dict[str, Any]], float | None]:
    """``(constrain, seconds)``: ``constrain(batch)`` gives a batch's extra ``generate`` arguments (with
    ``json_schema`` a fresh logits processor per call, none without); ``seconds`` is the grammars' compile time,
    spent here, before anything is timed (``None`` without ``json_schema``)."""
    if not config.json_schema:
        return (lambda batch: {}), None
    constraints = SchemaConstraints.for_model(model, tokenizer)
    seconds = constraints.compile_all(p.schema for batch, _ in todo for _, p in batch)
    return (lambda batch: constraints.generate_kwargs([p.schema for _, p in batch])), seconds


def _call_kwargs(m: MethodSpec, gen_kwargs: Mapping[str, Any], constrained: Mapping[str, Any]) -> dict[str, Any]:
    """One call's ``generate`` arguments: the run's, then the batch's constraint (a fresh logits processor per call:
    xgrammar's keeps one generation's state). transformers' assisted generation scores its candidates through the
    processor out of order, as speculation does: its baselines get it wrapped in :class:`AnyOrder`."""
    kwargs = {**gen_kwargs, **constrained}
    if "logits_processor" in constrained and m.baseline is not None and m.baseline.drafts:
        kwargs["logits_processor"] = LogitsProcessorList([AnyOrder(constrained["logits_processor"])])
    return kwargs


def _stops_run(err: BaseException) -> bool:
    """Whether ``err`` says a drafter, head or tree cannot be used with this model at all (the user's choice, not one
    prompt's failure): it stops the run, and ``specdec eval`` prints it in one line, as when a drafter is built. Any
    other error (a custom drafter's bad proposal, a grammar processor without an adapter, a batch that does not fit
    in memory) is that method's failure, recorded prompt by prompt."""
    from specdec.draft_registry import DraftSpecError
    from specdec.drafters.model import VocabularyMismatchError
    from specdec.heads.checkpoint import HeadLoadError
    from specdec.runners.hf import UnsupportedModelError

    return isinstance(err, (DraftSpecError, HeadLoadError, VocabularyMismatchError, UnsupportedModelError))


def _measure_batch(runners: Mapping[str, Any], batch: Sequence[tuple[int, Prompt]], pending: Sequence[MethodSpec],
                   encoded: tuple[torch.Tensor, torch.Tensor], gen_kwargs: Mapping[str, Any], done: Mapping,
                   config: EvalConfig, tokenizer: Any, rank: int,
                   constrain: Callable[[Sequence], dict[str, Any]] = lambda batch: {}) -> list[dict[str, Any]]:
    """Run each pending method on one batch (in rotation order); the records of its unrecorded pairs (an error
    record for each pair of a method that raised: the run goes on)."""
    ids, mask = encoded
    seed = config.seed + batch[0][0] if config.do_sample else None
    measured, failed = {}, {}
    for slot, m in enumerate(pending):
        try:
            measured[m.name] = (slot, runners[m.name](ids, _call_kwargs(m, gen_kwargs, constrain(batch)), seed, mask))
        except Exception as err:
            if _stops_run(err):
                raise
            failed[m.name] = (slot, error_message(err))
            # the same message is shown once: every failed pair is in the records and the report
            warnings.warn(f"{m.name} failed: {failed[m.name][1]}; recorded as an error", stacklevel=2)
    for name, (_, results) in measured.items():
        graphs = results[0].compiled_graphs  # methods prepared before timing (hf-compiled): graphs compiled since
        if graphs:  # recorded too (compiled_graphs); should not happen with one static cache length
            warnings.warn(f"{name} compiled {plural(graphs, 'graph')} inside a timed call (batch of prompt "
                          f"{batch[0][1].id}): its tokens/s include that compile time", stacklevel=2)
    records = []
    for b, (index, prompt) in enumerate(batch):
        ref = measured[HF][1][b].output_ids if HF in measured else (done.get((prompt.id, HF)) or {}).get("output_ids")
        for m in pending:
            if (prompt.id, m.name) in done:
                continue
            if m.name in failed:
                slot, error = failed[m.name]
                records.append(make_error_record(prompt, index, m, slot, int(mask[b].sum()), error, rank))
                continue
            slot, results = measured[m.name]
            result = results[b]
            text = tokenizer.decode(result.output_ids, skip_special_tokens=True)
            rec = make_record(prompt, index, m, slot, result, int(mask[b].sum()), ref, not config.do_sample, text, rank)
            if prompt.schema is not None:  # constrained or not: does the answer follow the prompt's schema?
                rec.update(validity(text, prompt.schema))
            if len(batch) > 1:
                rec.update(batch_size=len(batch), batch_index=batch[0][0],
                           batch_seconds=sum(r.seconds for r in results),
                           batch_new_tokens=sum(len(r.output_ids) for r in results))
            runner = runners[m.name]
            if runner.prepared:  # what its prepare step reported (hf-compiled: compile_seconds, max_cache_len)
                rec.update(runner.prepared)
            elif m.kind == SPECDEC and runner.verifier_compile_seconds is not None:
                rec.update(verifier_compile_seconds=runner.verifier_compile_seconds,
                           verifier_graphs_in_call=result.verifier_graphs_in_call)
            records.append(rec)
    return records


class _Progress:
    """tqdm bar over (prompt, method) pairs with the running speedup over ``hf`` in its postfix."""

    def __init__(self, total: int, methods: Sequence[MethodSpec], enabled: bool, rank: int, world: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="eval" if world == 1 else f"eval rank {rank}", unit="gen",
                        disable=not enabled, file=sys.stderr, position=rank if world > 1 else None, dynamic_ncols=True)
        self.tokens = {m.name: 0 for m in methods}
        self.seconds = {m.name: 0.0 for m in methods}
        multi = len({m.draft for m in methods if m.draft}) > 1
        self.labels = {m.name: self._label(m, multi) for m in methods if m.kind != HF}

    @staticmethod
    def _label(m: MethodSpec, multi: bool) -> str:
        if m.baseline is not None:
            base = m.baseline.label or m.name
        else:
            base = f"k{m.k}{'a' if m.adaptive else ''}{' ' + m.tree if m.tree else ''}{' compiled' if m.compiled else ''}"
        return f"{m.draft} {base}" if multi and m.draft else base

    def add(self, records: Iterable[Mapping[str, Any]], measured: int) -> None:
        for r in records:
            if r["method"] in self.tokens and r.get("error") is None:
                self.tokens[r["method"]] += r["new_tokens"]
                self.seconds[r["method"]] += r["seconds"]
        base = self.tokens[HF] / self.seconds[HF] if self.seconds[HF] else 0.0
        if base:
            self.bar.set_postfix({label: f"{self.tokens[n] / self.seconds[n] / base:.2f}x"
                                  for n, label in self.labels.items() if self.seconds[n]}, refresh=False)
        self.bar.update(measured)

    def close(self) -> None:
        self.bar.close()
