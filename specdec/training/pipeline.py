"""``train-head``: from prompts to a saved, evaluated draft head, every stage resumable.

Stages, each kept under ``OUT/work``: the verifier writes extra prompts (``self_prompts.jsonl``) and the
responses (``samples.jsonl``); its features are cached (``features/``); the head trains
(``checkpoints/``). The head is saved in ``OUT`` (EAGLE-3 layout: ``config.json``, ``model.safetensors``),
with a model card (``README.md``) and ``training.json``; its acceptance on held-out prompts is measured
with the real speculative loop.

A rerun resumes every stage, and only a rerun that would make the same artifacts: each stage records the
settings it was made with (``work/settings.json``: the verifier's identity, the data, lengths, kind, draft
vocabulary, ...) when it starts, and a run with other settings is refused in one line naming the
difference (``overwrite=True`` starts afresh). One run at a time: ``OUT/.train-head.lock`` is held while a
run works (``flock``, by the main process under ``accelerate launch``). Every file is written whole or not
at all (a temporary name, then a rename), so an interrupted run never leaves half a file a rerun trusts.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from specdec import metrics
from specdec.errors import ResumeError  # one class with eval's (an output made with other settings)
from specdec.heads.checkpoint import save_head
from specdec.heads.config import HeadConfig
from specdec.heads.shipped import fingerprint
from specdec.training.card import dflash_card, model_card
from specdec.training.dflash import DFlashRecipe, target_layers, train_dflash, write_dflash
from specdec.training.distill import distill, write_self_prompts
from specdec.training.features import FeatureSet, extract_features
from specdec.training.prompts import (TrainHeadError, TrainPrompt, balance, heldout_split, read_train_prompts,
                                      write_atomic)
from specdec.training.train import TrainConfig, train_head

__all__ = ["LOCK_FILE", "SETTINGS_FILE", "PipelineConfig", "ResumeError", "OutLockedError", "TrainHeadError",
           "check_settings", "clear_out", "heldout_acceptance", "lock_out", "run_pipeline", "stage_settings",
           "verifier_identity"]

#: held (``flock``) by the run working in ``OUT``; never deleted (deleting a lock file races)
LOCK_FILE = ".train-head.lock"
#: ``OUT/work/settings.json``: per stage, the settings its artifacts were made with
SETTINGS_FILE = "settings.json"
#: the head files ``train-head`` writes in ``OUT`` (``training.json`` last: a head with it is whole)
HEAD_FILES = ("model.safetensors", "config.json", "README.md", "training.json")
#: how the verifier writes its own prompts (fixed; recorded so that a change in a later version is seen)
SELF_PROMPT_SAMPLING = {"do_sample": True, "temperature": 0.8, "max_new_tokens": 160, "tasks": "self_instruct v2"}


class OutLockedError(TrainHeadError):
    """Another ``train-head`` run is working in ``OUT``."""


@dataclass
class PipelineConfig:
    """What ``train-head`` does besides training (see :class:`~specdec.training.train.TrainConfig`)."""

    per_group: int | None = 350  # prompts per group of the data (balance)
    self_prompts: int = 250  # prompts the verifier writes itself
    max_new_tokens: int = 160
    gen_batch: int = 48
    heldout: float = 0.03  # share of prompts held out from training (their every response: heldout_split)
    eval_prompts: int = 12  # held-out prompts run through the speculative loop at the end
    eval_new_tokens: int = 96
    eval_k: int = 5
    gen_dtype: str | None = None  # the verifier writes its data in this dtype (a copy), e.g. "bfloat16"; None: as loaded
    feature_dtype: str | None = None  # the features and targets come from a copy in this dtype; None: as loaded
    sampled: float = 0.0  # share of prompts that also get a sampled response (T 0.7 / 0.85 / 1.0)
    stop_after: str | None = None  # "data" or "features": make the stages up to it, then stop (no head)
    train: TrainConfig = field(default_factory=TrainConfig)


def _log(message: str) -> None:
    print(message, flush=True)


# --- one run at a time --------------------------------------------------------------------------------

_HELD: dict[str, list[int]] = {}  # resolved OUT -> [lock fd, depth]: this process may take its own lock again


@contextmanager
def lock_out(out: str | Path, *, enabled: bool = True) -> Iterator[None]:
    """Hold ``OUT/.train-head.lock`` (creating ``OUT``) for the block, or raise :class:`OutLockedError` at once
    when another run holds it. Re-entrant within a process (the CLI takes it before the model loads, the
    pipeline again). ``enabled=False`` (the other processes of an ``accelerate launch``) takes nothing."""
    if not enabled:
        yield
        return
    try:
        import fcntl
    except ImportError:  # no flock on this platform: nothing to take
        yield
        return
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    key = str(out.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise OutLockedError(f"--out {out} is in use by another train-head run (it holds {out / LOCK_FILE}); "
                             "wait for it to finish, or use another --out") from None
    _HELD[key] = [fd, 1]
    try:
        yield
    finally:
        del _HELD[key]
        os.close(fd)  # closing releases the lock


# --- what each stage was made with ----------------------------------------------------------------------

def verifier_identity(model: Any, tokenizer: Any) -> str:
    """A fingerprint of the verifier (16 hex digits): its config, the shapes and dtypes of its weights, a
    sample of the weights themselves (so two models of the same shapes differ) and its tokenizer."""
    h = hashlib.sha256()
    skip = {"transformers_version", "use_cache", "output_hidden_states", "output_attentions", "return_dict", "dtype",
            "torch_dtype", "architectures"}
    config = {k: v for k, v in model.config.to_dict().items() if not k.startswith("_") and k not in skip}
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    params = list(model.named_parameters())
    for name, p in params:
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
    for name, p in {id(p): (n, p) for n, p in (params[:1] + params[len(params) // 2:][:1] + params[-1:])}.values():
        sample = p.detach().reshape(-1)[:1 << 16].to("cpu").contiguous()
        h.update(sample.view(torch.uint8).numpy().tobytes())
    vocab = sorted(tokenizer.get_vocab().items()) if hasattr(tokenizer, "get_vocab") else []
    h.update(json.dumps([vocab, getattr(tokenizer, "chat_template", None), tokenizer.eos_token_id,
                         tokenizer.pad_token_id], default=str).encode())
    return h.hexdigest()[:16]


def data_fingerprint(prompts: list[TrainPrompt]) -> str:
    """What the samples are made from (ids, groups, text, given responses, sources, licenses): 16 hex digits."""
    rows = [[p.id, p.group, p.prompt, p.response, p.source, p.license] for p in prompts]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def stage_settings(config: PipelineConfig, data: list[TrainPrompt], model_name: str,
                   identity: str | None = None) -> dict[str, dict[str, Any]]:
    """Per stage, every setting that changes what it writes (values as the command line spells them).
    ``identity`` (:func:`verifier_identity`) is None before the model loads: then the verifier is not compared."""
    t = config.train
    model = {"name": model_name, "identity": identity}
    stages: dict[str, dict[str, Any]] = {}
    if config.self_prompts:
        stages["self_prompts"] = {"model": model, "seed": t.seed, "self_prompt_sampling": SELF_PROMPT_SAMPLING}
    stages["samples"] = {"model": model, "max_new_tokens": config.max_new_tokens, "decoding": "greedy",
                         "gen_dtype": config.gen_dtype or "as loaded", "sampled": config.sampled}
    stages["features"] = {**stages["samples"], "data": data_fingerprint(data), "per_group": config.per_group or 0,
                          "self_prompts": config.self_prompts, "seed": t.seed, "kind": t.kind,
                          "feature_dtype": config.feature_dtype or "as loaded"}
    training = {"heldout": config.heldout, "epochs": t.epochs, "batch_tokens": t.batch_tokens, "lr": t.lr,
                "warmup": t.warmup, "grad_clip": t.grad_clip, "mixed_precision": t.mixed_precision, "noise": t.noise,
                "patience": t.patience, "prompt_weight": t.prompt_weight,
                "lookup_weight": t.lookup_weight}
    if t.kind == "eagle3":  # an EAGLE head has neither
        training.update(draft_vocab=t.draft_vocab or 0, ttt_steps=t.ttt_steps)
    if t.kind == "dflash":
        training.update(block_size=t.block_size, dflash_layers=t.dflash_layers)
    stages["training"] = {**stages["features"], **training}
    return stages


#: settings recorded since a later version, with the value a record made before them stands for
_ADDED_LATER = {"prompt_weight": 0.0, "lookup_weight": 1.0, "feature_dtype": "as loaded"}
_FLAGS = {"self_prompt_sampling": "the self-prompt sampling", "decoding": "decoding", "warmup": "warmup",
          "grad_clip": "gradient clipping"}


def _difference(key: str, then: Any, now: Any) -> str | None:
    """How a recorded setting differs from this run's, as the command line would say it; None: no difference."""
    if key == "model":
        if not isinstance(then, dict) or not isinstance(now, dict):
            return None
        if then.get("identity") is None or now.get("identity") is None or then["identity"] == now["identity"]:
            return None
        if then.get("name") != now.get("name"):
            return f"--model {then.get('name')}, not {now.get('name')}"
        return f"--model {then.get('name')} as it was then (its weights, config or tokenizer have changed since)"
    if then == now:
        return None
    if key == "data":
        return "other --data prompts (the data files changed since)"
    flag = _FLAGS.get(key, "--" + key.replace("_", "-"))
    return f"{flag} {then}, not {now}"


def _read_settings(out: Path) -> dict[str, dict[str, Any]] | None:
    path = out / "work" / SETTINGS_FILE
    if not path.is_file():
        return None
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ResumeError(f"{path} cannot be read: cannot tell what --out {out} was made with; "
                          "use --overwrite to start afresh") from None
    return recorded.get("stages", {}) if isinstance(recorded, dict) else {}


def _has_artifacts(out: Path) -> bool:
    work = out / "work"
    return any((work / n).exists() for n in ("samples.jsonl", "self_prompts.jsonl", "features")) or \
        (out / "checkpoints").is_dir()


def check_settings(out: str | Path, stages: dict[str, dict[str, Any]]) -> None:
    """Raise :class:`ResumeError` (one line naming every difference) unless each stage ``OUT`` holds was made
    with the settings this run would make it with. Stages this run does not use are not compared."""
    out = Path(out)
    recorded = _read_settings(out) or {}
    differ: list[str] = []
    for stage, now in stages.items():
        for key, value in now.items():
            then = recorded.get(stage, {})
            if key in then or (stage in recorded and key in _ADDED_LATER):
                d = _difference(key, then.get(key, _ADDED_LATER.get(key)), value)
                if d is not None and d not in differ:
                    differ.append(d)
    if differ:
        raise ResumeError(f"--out {out} was made with {'; with '.join(differ)}; use --overwrite to start afresh")


def _record_stage(out: Path, stage: str, settings: dict[str, Any]) -> None:
    """Record a stage's settings before it writes anything (so its partial artifacts are described too)."""
    recorded = _read_settings(out) or {}
    recorded[stage] = settings
    write_atomic(out / "work" / SETTINGS_FILE, json.dumps({"stages": recorded}, indent=1) + "\n")


def clear_out(out: str | Path) -> None:
    """Remove what ``train-head`` wrote in ``OUT`` (its own files only; the lock file stays), the settings
    record last: an interrupted clear leaves artifacts still described by it, never unlabelled ones."""
    out, work = Path(out), Path(out) / "work"
    for name in HEAD_FILES[::-1]:
        (out / name).unlink(missing_ok=True)
    for tree in (out / "checkpoints", work / "features", out / ".head-tmp"):
        shutil.rmtree(tree, ignore_errors=True)
    for name in ("samples.jsonl", "self_prompts.jsonl", "timing.json"):
        (work / name).unlink(missing_ok=True)
    for stale in work.glob(".*.tmp"):
        stale.unlink(missing_ok=True)
    (work / SETTINGS_FILE).unlink(missing_ok=True)


def _save_head_whole(write: Callable[[Path], None], out: Path, record: dict[str, Any]) -> None:
    """The head files (``write(tmp)`` makes them) replaced each at once, ``training.json`` (the mark of a whole
    head) removed first and written last: an interrupted save leaves the earlier head whole, or no
    ``training.json``."""
    tmp = out / ".head-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    write_atomic(tmp / "training.json", json.dumps(record, indent=2) + "\n")
    (out / "training.json").unlink(missing_ok=True)
    for name in HEAD_FILES:
        if (tmp / name).is_file():
            os.replace(tmp / name, out / name)
    shutil.rmtree(tmp, ignore_errors=True)


# --- the pipeline -------------------------------------------------------------------------------------

def run_pipeline(model: Any, tokenizer: Any, data: str | Path, out: str | Path, config: PipelineConfig, *,
                 model_name: str = "", command: str = "", progress: bool = True, log: Any = _log,
                 overwrite: bool = False) -> dict[str, Any]:
    """Build a draft head for ``model`` from the prompts in ``data``; returns the contract summary
    (``out``, ``samples``, ``tokens``, ``steps``, ``seconds``, ``heldout_acceptance``, ``mean_accepted_length``).

    Resumes what ``out`` holds when it was made with the same settings, else raises :class:`ResumeError`
    (``overwrite``: start afresh); :class:`OutLockedError` when another run works in ``out``."""
    from accelerate import PartialState

    state = PartialState()
    with lock_out(out, enabled=state.is_main_process):
        return _run(model, tokenizer, data, Path(out), config, state, model_name=model_name, command=command,
                    progress=progress, log=log, overwrite=overwrite)


def _run(model: Any, tokenizer: Any, data: str | Path, out: Path, config: PipelineConfig, state: Any, *,
         model_name: str, command: str, progress: bool, log: Any, overwrite: bool) -> dict[str, Any]:
    work = out / "work"
    started = time.perf_counter()
    data_prompts = read_train_prompts(data)
    settings = stage_settings(config, data_prompts, model_name, verifier_identity(model, tokenizer))
    if overwrite and state.is_main_process:
        clear_out(out)
    state.wait_for_everyone()
    check_settings(out, settings)
    work.mkdir(parents=True, exist_ok=True)
    if state.is_main_process and _read_settings(out) is None and _has_artifacts(out):
        log(f"notice: {out} has no record of the settings it was made with (an older specdec); "
            "resuming it as made with this run's")

    def record_stage(stage: str) -> None:
        if state.is_main_process:
            _record_stage(out, stage, settings[stage])

    def add_times(seconds: dict[str, float]) -> dict[str, float]:
        return _add_stage_times(work / "timing.json", seconds) if state.is_main_process else {}

    # under `accelerate launch`, the main process writes the data and features; the others then find them done
    with state.main_process_first():
        prompts = balance(data_prompts, config.per_group, seed=config.train.seed)
        writer = data_writer(model, config.gen_dtype)
        if config.self_prompts:
            record_stage("self_prompts")
            prompts += write_self_prompts(writer, tokenizer, config.self_prompts, work / "self_prompts.jsonl",
                                          seed=config.train.seed, batch_size=config.gen_batch,
                                          max_new_tokens=SELF_PROMPT_SAMPLING["max_new_tokens"],
                                          avoid=[p.prompt for p in data_prompts], progress=progress)
        record_stage("samples")
        samples = distill(writer, tokenizer, prompts, work / "samples.jsonl", batch_size=config.gen_batch,
                          max_new_tokens=config.max_new_tokens, sampled=config.sampled, seed=config.train.seed,
                          progress=progress)
        del writer
        if len(samples) < 2:
            raise TrainHeadError(f"only {len(samples)} usable sample(s) from {data}: a head needs at least 2 "
                                 "(one is held out to measure it); add prompts or --self-prompts")
        generated = time.perf_counter()
        # each stage's time is recorded as it ends: a later stage killed with its session loses only its own
        add_times({"data": generated - started})
        if config.stop_after == "data":
            return _stopped(out, samples, started, "data")
        if config.train.kind == "dflash":  # the layers' outputs: hidden_states[i + 1]
            layers = tuple(i + 1 for i in target_layers(model.config))
        else:
            head_config = HeadConfig.for_verifier(model.config, config.train.kind, draft_vocab_size=None)
            layers = head_config.aux_layers if head_config.kind == "eagle3" else \
                (model.config.get_text_config().num_hidden_layers,)
        record_stage("features")
        # a copy in --feature-dtype computes them (bf16: ~3x faster with AMX); the head still trains against
        # the verifier's own embedding and lm_head, as it drafts; made only if a shard is missing
        paths = extract_features(lambda: data_writer(model, config.feature_dtype), samples, work / "features", layers,
                                 progress=progress)
        featured = time.perf_counter()
        add_times({"features": featured - generated})
        if config.stop_after == "features":
            return _stopped(out, samples, started, "features")
        record_stage("training")
    features = FeatureSet(paths)
    held, train_idx = heldout_split([s["id"] for s in samples], config.heldout)
    if config.train.kind == "dflash":
        return _train_dflash(model, tokenizer, features, samples, held, train_idx, out, config, state, started,
                             model_name=model_name, command=command, log=log, add_times=add_times)
    head, summary = train_head(model, features, train_idx, out, config.train, head_config, val_idx=held,
                               progress=progress, log=log)
    trained = time.perf_counter()
    if not state.is_main_process:
        return {}
    acceptance, accepted_length = heldout_acceptance(model, head, [samples[i] for i in held[:config.eval_prompts]],
                                                     config.eval_k, config.eval_new_tokens)
    tokens = sum(len(s["response_ids"]) for s in samples)
    result = {"out": str(out), "samples": len(samples), "tokens": tokens, "steps": summary["steps"],
              "seconds": round(time.perf_counter() - started, 1), "heldout_acceptance": round(acceptance, 4),
              "mean_accepted_length": round(accepted_length, 3)}
    # training's clock is the checkpoints': it counts every resumed run, killed ones too
    training_seconds = round(summary["seconds"], 1)
    stages = {**add_times({"heldout_eval": time.perf_counter() - trained}), "training": training_seconds}
    record = {**result, "stage_seconds": stages, "command": command,
              "training_seconds_total": training_seconds, "final_train_metrics": summary["final"],
              "validation": summary["validation"], "best_validation": summary["best"],
              "stopped_early": summary["stopped_early"],
              "train_config": summary["train_config"], "pipeline": {k: v for k, v in vars(config).items() if k != "train"},
              "heldout_samples": len(held), "eval_k": config.eval_k, "model": model_name,
              "sources": _sources(samples, train_idx)}
    extra = {"specdec_verifier": {**fingerprint(model.config), "name": model_name}}
    _save_head_whole(lambda tmp: save_head(head, tmp, card=model_card(record, head.config), extra_config=extra), out,
                     record)
    return result


def _train_dflash(model: Any, tokenizer: Any, features: FeatureSet, samples: list[dict[str, Any]], held: list[int],
                  train_idx: list[int], out: Path, config: PipelineConfig, state: Any, started: float, *,
                  model_name: str, command: str, log: Any, add_times: Any) -> dict[str, Any]:
    """``--kind dflash``: train the block drafter on the features, measure it on held-out prompts, save it whole."""
    from specdec.drafters.dflash import DFlashDrafter

    t = config.train
    recipe = DFlashRecipe(block_size=t.block_size, layers=t.dflash_layers)
    mask = min(max(tokenizer.get_vocab().values()), model.get_input_embeddings().weight.shape[0] - 1)
    dflash, summary = train_dflash(model, features, train_idx, held[:config.eval_prompts * 4], out, recipe,
                                   epochs=t.epochs, lr=t.lr, warmup=t.warmup, grad_clip=t.grad_clip, seed=t.seed,
                                   save_every=t.save_every, mask_token_id=mask, log=log)
    trained = time.perf_counter()
    if not state.is_main_process:
        return {}
    dtype = next(model.parameters()).dtype
    drafter = DFlashDrafter(dflash.to(dtype), model)
    eval_k = min(config.eval_k, recipe.block_size - 1)  # a block drafts at most block_size - 1
    acceptance, accepted_length = heldout_acceptance(model, drafter, [samples[i] for i in held[:config.eval_prompts]],
                                                     eval_k, config.eval_new_tokens)
    result = {"out": str(out), "samples": len(samples), "tokens": sum(len(s["response_ids"]) for s in samples),
              "steps": summary["steps"], "seconds": round(time.perf_counter() - started, 1),
              "heldout_acceptance": round(acceptance, 4), "mean_accepted_length": round(accepted_length, 3)}
    stages = {**add_times({"heldout_eval": time.perf_counter() - trained}), "training": round(summary["seconds"], 1)}
    record = {**result, "kind": "dflash", "stage_seconds": stages, "command": command, "model": model_name,
              "recipe": vars(recipe), "train_config": vars(t), "first_loss": summary["first_loss"],
              "final_loss": summary["final_loss"], "validation": summary["validation"], "heldout_samples": len(held),
              "eval_k": eval_k, "sources": _sources(samples, train_idx)}
    _save_head_whole(lambda tmp: write_dflash(dflash, tmp, dflash_card(record), dtype), out, record)
    return result


def data_writer(model: Any, gen_dtype: str | None) -> Any:
    """The model that writes the data (or computes the features): ``model`` itself, or a copy in ``gen_dtype``
    (bf16 writes twice as fast on a CPU with AMX, and computes features ~3x as fast)."""
    if gen_dtype is None or getattr(torch, gen_dtype) == next(model.parameters()).dtype:
        return model
    return copy.deepcopy(model).to(getattr(torch, gen_dtype))


def _stopped(out: Path, samples: list[dict[str, Any]], started: float, stage: str) -> dict[str, Any]:
    """The summary of a run told to stop after ``stage`` (no head: steps 0, no acceptance)."""
    return {"out": str(out), "samples": len(samples), "tokens": sum(len(s["response_ids"]) for s in samples),
            "steps": 0, "seconds": round(time.perf_counter() - started, 1), "heldout_acceptance": None,
            "mean_accepted_length": None, "stopped_after": stage}


def _add_stage_times(path: Path, seconds: dict[str, float]) -> dict[str, float]:
    """Seconds per stage summed over every run of this ``OUT`` (a resumed stage adds what it did); a file
    an older run left unreadable starts the sums again."""
    try:
        total = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        total = {}
    total = total if isinstance(total, dict) else {}
    for stage, value in seconds.items():
        total[stage] = round(float(total.get(stage, 0.0)) + value, 1)
    write_atomic(path, json.dumps(total))
    return total


def _sources(samples: list[dict[str, Any]], used: list[int]) -> list[dict[str, Any]]:
    """Per source: its license and how many training samples came from it."""
    counts: dict[tuple[str, str], int] = {}
    for i in used:
        key = (samples[i]["source"], samples[i]["license"])
        counts[key] = counts.get(key, 0) + 1
    return [{"source": s, "license": lic, "samples": n} for (s, lic), n in sorted(counts.items())]


def heldout_acceptance(model: Any, head: Any, samples: list[dict[str, Any]], k: int, new_tokens: int) -> tuple[float, float]:
    """Acceptance rate and mean accepted length (tokens per verifier pass, bonus included) of ``head`` (or a
    drafter) drafting ``k`` tokens greedily on held-out prompts, through the real speculative loop."""
    from specdec.api import SpeculativeModel
    from specdec.drafters.base import Drafter
    from specdec.drafters.eagle import EagleDrafter

    drafter = head if isinstance(head, Drafter) else EagleDrafter(head, model)
    spec = SpeculativeModel(model, draft=drafter, num_draft_tokens=k)
    proposed = accepted = 0
    committed: list[int] = []
    for s in samples:
        ids = torch.tensor([s["prompt_ids"]], dtype=torch.long, device=model.device)
        spec.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        stats = spec.last_stats
        proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
        committed += stats.committed_per_step
    return metrics.acceptance_rate(accepted, proposed), metrics.mean_accepted_length(committed, len(committed))
