"""The model card written beside a trained head: data and licenses, recipe, time, measured acceptance."""

from __future__ import annotations

import json
from typing import Any

from specdec.heads.config import HeadConfig


def model_card(record: dict[str, Any], config: HeadConfig) -> str:
    """Markdown for ``README.md`` of a head directory, from ``train-head``'s ``training.json`` record."""
    sources = "\n".join(f"| {s['source']} | {s['license']} | {s['samples']} |" for s in record["sources"])
    stages = record["stage_seconds"]
    t = record["train_config"]
    return f"""# Draft head for {record.get('model') or 'its verifier'} ({config.kind.upper()} layout)

Trained by `specdec train-head` by self-distillation: the verifier wrote every response this head learned
from, and the head reads the verifier's own hidden states (layers {list(config.aux_layers) or 'final'}).
Load it with `SpeculativeModel(model, draft="eagle:DIR")`; the files follow the public
{'EAGLE-3' if config.kind == 'eagle3' else 'EAGLE'} layout (`config.json`, `model.safetensors`).

## Measured
- Held-out acceptance (greedy, k={record['eval_k']}, {record['heldout_samples']} held-out samples, at most
  {record['pipeline']['eval_prompts']} prompts run): **{record['heldout_acceptance']:.3f}**, mean accepted length
  **{record['mean_accepted_length']:.2f}** tokens per verifier pass (bonus token included).
- Final training metrics (mean of the last 20 steps): `{json.dumps({k: round(v, 4) for k, v in record['final_train_metrics'].items()})}`

## Data ({record['samples']} samples, {record['tokens']} response tokens)
| source | license | training samples |
|---|---|---|
{sources}

Never trained on Spec-Bench or any evaluation set.

## Recipe
- Head: {config.kind}, hidden {config.hidden_size}, draft vocabulary {config.draft_vocab_size} of {config.vocab_size}
  (the most frequent greedy targets of the training responses).
- Training: `{json.dumps(t)}`
- Pipeline: `{json.dumps(record['pipeline'])}`
- Steps: {record['steps']}.

## Reproduce
`{record.get('command') or 'specdec train-head --model MODEL --data PROMPTS --out DIR'}`

## Time on the machine that trained it
Summed over the runs into the same output directory (a rerun resumes): data {stages['data']:.0f} s,
features {stages['features']:.0f} s, training {stages['training']:.0f} s, held-out evaluation
{stages['heldout_eval']:.0f} s; total {sum(stages.values()):.0f} s. Training counts every run, killed ones
too (its checkpoints carry the clock); the other stages count the runs that finished them.
"""


def dflash_card(record: dict[str, Any]) -> str:
    """Markdown for ``README.md`` of a DFlash drafter trained by ``train-head --kind dflash``."""
    sources = "\n".join(f"| {s['source']} | {s['license']} | {s['samples']} |" for s in record["sources"])
    stages, recipe, validation = record["stage_seconds"], record["recipe"], record["validation"]
    by_position = ", ".join(f"{j + 1}: {a:.3f}" for j, a in enumerate(validation["accuracy_by_position"]) if a is not None)
    return f"""# DFlash block drafter for {record.get('model') or 'its verifier'}

Trained by `specdec train-head --kind dflash` by self-distillation: the verifier wrote every response, and the
drafter reads the verifier's own hidden states. It drafts a block of {recipe['block_size'] - 1} tokens in one forward
of {recipe['layers']} decoder layer(s); the verifier's embedding and LM head are shared. Load it with
`SpeculativeModel(model, draft="dflash:DIR")`; the files follow z-lab's DFlash layout (`config.json` with
`dflash_config`, `model.safetensors`).

## Measured
- Held-out acceptance (greedy, k={record['eval_k']}, through the speculative loop): **{record['heldout_acceptance']:.3f}**,
  mean accepted length **{record['mean_accepted_length']:.2f}** tokens per verifier pass (bonus token included).
- Teacher-forced greedy accuracy by block position on held-out samples: {by_position}; loss {validation['loss']}.
- Training loss: first step {record['first_loss']}, mean of the last 20 steps {record['final_loss']}.

## Data ({record['samples']} samples, {record['tokens']} response tokens)
| source | license | training samples |
|---|---|---|
{sources}

Never trained on Spec-Bench or any evaluation set.

## Recipe
- Recipe: `{json.dumps(recipe)}`; training: `{json.dumps(record['train_config'])}`; steps {record['steps']}.
- Reproduce: `{record.get('command') or 'specdec train-head --kind dflash --model MODEL --data PROMPTS --out DIR'}`

## Time on the machine that trained it
Data {stages.get('data', 0):.0f} s, features {stages.get('features', 0):.0f} s, training {stages['training']:.0f} s
({stages['training'] / 3600:.2f} hours), held-out evaluation {stages['heldout_eval']:.0f} s.
"""
