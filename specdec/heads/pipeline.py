"""``train-head``: from prompts to a saved, evaluated draft head, every stage resumable.

Stages, each kept under ``OUT/work``: the verifier writes extra prompts (``self_prompts.jsonl``) and the
responses (``samples.jsonl``); its features are cached (``features/``); the head trains
(``checkpoints/``). The head is saved in ``OUT`` (EAGLE-3 layout: ``config.json``, ``model.safetensors``),
with a model card (``README.md``) and ``training.json``; its acceptance on held-out prompts is measured
with the real speculative loop.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specdec.heads.card import model_card
from specdec.heads.checkpoint import save_head
from specdec.heads.config import HeadConfig
from specdec.heads.distill import distill, write_self_prompts
from specdec.heads.features import FeatureSet, extract_features
from specdec.heads.prompts import balance, read_train_prompts
from specdec.heads.shipped import fingerprint
from specdec.heads.train import TrainConfig, train_head


@dataclass
class PipelineConfig:
    """What ``train-head`` does besides training (see :class:`~specdec.heads.train.TrainConfig`)."""

    per_group: int | None = 350  # prompts per group of the data (balance)
    self_prompts: int = 250  # prompts the verifier writes itself
    max_new_tokens: int = 160
    gen_batch: int = 48
    heldout: float = 0.03  # share of samples held out from training
    eval_prompts: int = 12  # held-out prompts run through the speculative loop at the end
    eval_new_tokens: int = 96
    eval_k: int = 5
    train: TrainConfig = field(default_factory=TrainConfig)


def _log(message: str) -> None:
    print(message, flush=True)


def run_pipeline(model: Any, tokenizer: Any, data: str | Path, out: str | Path, config: PipelineConfig, *,
                 model_name: str = "", command: str = "", progress: bool = True, log: Any = _log) -> dict[str, Any]:
    """Build a draft head for ``model`` from the prompts in ``data``; returns the contract summary
    (``out``, ``samples``, ``tokens``, ``steps``, ``seconds``, ``heldout_acceptance``, ``mean_accepted_length``)."""
    from accelerate import PartialState

    out = Path(out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    state = PartialState()
    # under `accelerate launch`, the main process writes the data and features; the others then find them done
    with state.main_process_first():
        prompts = balance(read_train_prompts(data), config.per_group, seed=config.train.seed)
        if config.self_prompts:
            prompts += write_self_prompts(model, tokenizer, config.self_prompts, work / "self_prompts.jsonl",
                                          seed=config.train.seed, batch_size=config.gen_batch, progress=progress)
        samples = distill(model, tokenizer, prompts, work / "samples.jsonl", batch_size=config.gen_batch,
                          max_new_tokens=config.max_new_tokens, progress=progress)
        if len(samples) < 2:
            raise ValueError(f"only {len(samples)} usable samples in {data}: a head needs more training data")
        generated = time.perf_counter()
        head_config = HeadConfig.for_verifier(model.config, config.train.kind, draft_vocab_size=None)
        layers = head_config.aux_layers if head_config.kind == "eagle3" else (model.config.get_text_config().num_hidden_layers,)
        paths = extract_features(model, samples, work / "features", layers, progress=progress)
    features = FeatureSet(paths)
    featured = time.perf_counter()
    order = list(range(len(samples)))
    random.Random(config.train.seed).shuffle(order)
    n_held = max(1, round(len(order) * config.heldout))
    held, train_idx = sorted(order[:n_held]), sorted(order[n_held:])
    head, summary = train_head(model, features, train_idx, out, config.train, head_config, progress=progress, log=log)
    trained = time.perf_counter()
    if not state.is_main_process:
        return {}
    acceptance, accepted_length = heldout_acceptance(model, head, [samples[i] for i in held[:config.eval_prompts]],
                                                     config.eval_k, config.eval_new_tokens)
    tokens = sum(len(s["response_ids"]) for s in samples)
    result = {"out": str(out), "samples": len(samples), "tokens": tokens, "steps": summary["steps"],
              "seconds": round(time.perf_counter() - started, 1), "heldout_acceptance": round(acceptance, 4),
              "mean_accepted_length": round(accepted_length, 3)}
    stages = _add_stage_times(work / "timing.json", {
        "data": generated - started, "features": featured - generated, "training": trained - featured,
        "heldout_eval": time.perf_counter() - trained})
    record = {**result, "stage_seconds": stages, "command": command,
              "training_seconds_total": round(summary["seconds"], 1), "final_train_metrics": summary["final"],
              "train_config": summary["train_config"], "pipeline": {k: v for k, v in vars(config).items() if k != "train"},
              "heldout_samples": len(held), "eval_k": config.eval_k, "model": model_name,
              "sources": _sources(samples, train_idx)}
    extra = {"specdec_verifier": {**fingerprint(model.config), "name": model_name}}
    save_head(head, out, card=model_card(record, head.config), extra_config=extra)
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return result


def _add_stage_times(path: Path, seconds: dict[str, float]) -> dict[str, float]:
    """Seconds per stage summed over every run of this ``OUT`` (a resumed stage adds what it did)."""
    total = json.loads(path.read_text()) if path.is_file() else {}
    for stage, value in seconds.items():
        total[stage] = round(total.get(stage, 0.0) + value, 1)
    path.write_text(json.dumps(total))
    return total


def _sources(samples: list[dict[str, Any]], used: list[int]) -> list[dict[str, Any]]:
    """Per source: its license and how many training samples came from it."""
    counts: dict[tuple[str, str], int] = {}
    for i in used:
        key = (samples[i]["source"], samples[i]["license"])
        counts[key] = counts.get(key, 0) + 1
    return [{"source": s, "license": lic, "samples": n} for (s, lic), n in sorted(counts.items())]


def heldout_acceptance(model: Any, head: Any, samples: list[dict[str, Any]], k: int, new_tokens: int) -> tuple[float, float]:
    """Acceptance rate and mean accepted length (tokens per verifier pass, bonus included) of ``head``
    drafting ``k`` tokens greedily on held-out prompts, through the real speculative loop."""
    from specdec.api import SpeculativeModel
    from specdec.drafters.eagle import EagleDrafter

    spec = SpeculativeModel(model, draft=EagleDrafter(head, model), num_draft_tokens=k)
    proposed = accepted = 0
    committed: list[int] = []
    for s in samples:
        ids = torch.tensor([s["prompt_ids"]], dtype=torch.long, device=model.device)
        spec.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        stats = spec.last_stats
        proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
        committed += stats.committed_per_step
    return accepted / max(proposed, 1), sum(committed) / max(len(committed), 1)
