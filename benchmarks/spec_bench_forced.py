"""Teacher-forced top-1 of draft heads on Spec-Bench, per group (issue 24: where training's data differs from it).

    python benchmarks/spec_bench_forced.py --heads eagle runs/recipe/200000/base/checkpoints/best \\
        --responses runs/spec_bench_responses.jsonl --out benchmarks/results/heads/forced.json

The verifier's greedy responses to Spec-Bench's prompts (``--per-group`` per task group, the first of each, as
``specdec eval --per-group N`` picks them; ``--max-new-tokens`` each) are written once to ``--responses`` and read
from there afterwards, so every head is scored on the same targets. Each head is then teacher-forced over them
(``specdec.training.head_loss``: ``--steps`` training-time steps) and reported per group and in all. Online, a
greedy chain's first draft of every pass equals this teacher-forced step-0 prediction (``specdec head-report``,
BENCHMARKS.md section 13), so step-0 top-1 here is the first-draft acceptance a head would show on Spec-Bench,
measured in a minute rather than an eval. Evaluation only: nothing here trains on Spec-Bench.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from specdec.drafters.composite import LOOKUP_NGRAMS as COMPOSITE_NGRAMS
from specdec.training.lookup_targets import lookup_drafts


def spec_bench_responses(model: Any, tokenizer: Any, path: Path, per_group: int, new_tokens: int) -> list[dict[str, Any]]:
    """The cached responses at ``path``, or the verifier's greedy responses written there now."""
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if rows and all(r.get("per_group") == per_group and r.get("max_new_tokens") == new_tokens for r in rows):
            return rows
        raise SystemExit(f"{path} holds responses made with other settings; remove it or pick another --responses")
    from specdec.prompts import default_dataset, encode_prompt, load_prompts, select_per_group

    prompts = select_per_group(load_prompts(default_dataset()), per_group)
    rows = []
    for p in prompts:
        ids = encode_prompt(tokenizer, p.text).to(model.device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
        rows.append({"id": p.id, "group": p.group, "prompt_ids": ids[0].tolist(),
                     "response_ids": out[0, ids.shape[1]:].tolist(), "per_group": per_group, "max_new_tokens": new_tokens})
        print(f"response {len(rows)} of {len(prompts)} ({p.group})", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
    return rows


def copy_targets(prompt: list[int], sequence: list[int]) -> list[bool]:
    """Per response position of ``sequence`` (prompt + response): does the bigram (previous token, this token)
    occur in ``prompt``? Such a token continues a copy from the prompt (what prompt lookup would draft)."""
    bigrams = set(zip(prompt, prompt[1:]))
    return [(sequence[t - 1], sequence[t]) in bigrams for t in range(len(prompt), len(sequence))]


def forced(model: Any, head: Any, rows: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Teacher-forced numbers of ``head`` per group of ``rows`` and over all of them; ``copy`` splits step 0's
    top-1 by whether the target continues a copy from the prompt (:func:`copy_targets`); ``with_lookup`` sets it
    beside prompt lookup's first draft at each position (composite's n-grams): how often the lookup drafts, how
    often it is right then, the lookup's draft else the head's (a composite chain's first draft), and either
    right (a first depth holding both)."""
    from specdec.drafters.eagle import EagleDrafter
    from specdec.training.report import verifier_batch
    from specdec.training.train import head_loss, teacher_forced_summary, ttt_outputs

    layers = EagleDrafter(head, model).hidden_layers
    target_head = model.get_output_embeddings()
    stats: dict[str, list[dict[str, float]]] = {}
    copies: dict[str, list[int]] = {}  # group -> [copy hits, copy targets, other hits, other targets]
    # group -> [targets, lookup drafts, lookup right, lookup-else-head right, head or lookup right]
    combined: dict[str, list[int]] = {}
    with torch.no_grad():
        for r in rows:
            batch = verifier_batch(model, layers, r["prompt_ids"], r["response_ids"])
            stats.setdefault(r["group"], []).append(head_loss(head, batch, head.embed, target_head, steps)[1])
            dtype = next(head.parameters()).dtype
            out = next(ttt_outputs(head, head.embed(batch["input_ids"][:, 1:]).to(dtype),
                                   batch["hidden"][:, :-1].to(dtype), 1))
            p = len(r["prompt_ids"])
            # slot i predicts position i + 2; the target there is the verifier's greedy token at i + 1
            guess = head.to_target(head.logits(out[0, p - 2: -1]).argmax(-1)).tolist()
            target = batch["top"][0, p - 1: -1].tolist()
            sequence = r["prompt_ids"] + r["response_ids"]
            copy = copy_targets(r["prompt_ids"], sequence)
            tally = copies.setdefault(r["group"], [0, 0, 0, 0])
            both = combined.setdefault(r["group"], [0, 0, 0, 0, 0])
            # what composite's lookup drafts at each response position, the whole sequence searched
            drafts = lookup_drafts(sequence, *COMPOSITE_NGRAMS, window=len(sequence))[p:]
            for i, (g, t, c) in enumerate(zip(guess, target, copy)):
                tally[0 if c else 2] += int(g == t)
                tally[1 if c else 3] += 1
                found = drafts[i]  # -1: the lookup drafts nothing here
                both[0] += 1
                both[1] += found >= 0
                both[2] += found == t
                both[3] += (found == t) if found >= 0 else (g == t)
                both[4] += g == t or found == t
    out = {g: teacher_forced_summary(s) for g, s in stats.items()}
    out["all"] = teacher_forced_summary(x for s in stats.values() for x in s)
    copies["all"] = [sum(t[i] for t in copies.values()) for i in range(4)]
    combined["all"] = [sum(t[i] for t in combined.values()) for i in range(5)]
    for g, (ch, cn, oh, on) in copies.items():
        out[g]["copy"] = {"share": round(cn / max(cn + on, 1), 4), "top1_copy": round(ch / max(cn, 1), 4),
                          "top1_other": round(oh / max(on, 1), 4)}
        n, drafted, right, first, either = combined[g]
        out[g]["with_lookup"] = {"lookup_drafts": round(drafted / max(n, 1), 4),
                                 "lookup_right_when_drafting": round(right / max(drafted, 1), 4),
                                 "lookup_else_head": round(first / max(n, 1), 4), "head_or_lookup": round(either / max(n, 1), 4)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", nargs="+", required=True, help="'eagle' (the shipped head) or head directories")
    p.add_argument("--responses", type=Path, required=True,
                   help="JSON lines cache of the verifier's Spec-Bench responses (written when missing)")
    p.add_argument("--samples", type=Path, default=None,
                   help="score these verifier responses instead (train-head's samples rows: prompt_ids, response_ids, "
                        "group), e.g. a run's held-out split, to compare the head's training distribution")
    p.add_argument("--per-group", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=5, help="training-time steps to teacher-force")
    p.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    args = p.parse_args()
    from specdec.heads.checkpoint import load_head
    from specdec.heads.shipped import shipped_head
    from specdec.models import load_model

    model, tokenizer = load_model("smollm2")
    if args.samples:
        rows = [json.loads(line) for line in args.samples.read_text(encoding="utf-8").splitlines() if line.strip()]
    else:
        rows = spec_bench_responses(model, tokenizer, args.responses, args.per_group, args.max_new_tokens)
    results = {}
    for name in args.heads:
        head = load_head(shipped_head(model) if name == "eagle" else Path(name), model)
        head.attach(model.get_input_embeddings(), model.get_output_embeddings())
        steps = min(args.steps, 1) if head.config.kind == "eagle" else args.steps
        results[name] = forced(model, head, rows, steps)
        a = results[name]["all"]
        groups = ", ".join(f"{g} {v['top1'][0]:.3f}" for g, v in results[name].items() if g != "all")
        print(f"{name}: top-1 per step {a['top1']}, coverage {a['coverage']:.3f}; step 0 by group: {groups}; "
              f"copy targets {a['copy']['share']:.3f} of all, top-1 on them {a['copy']['top1_copy']:.3f}, on the "
              f"others {a['copy']['top1_other']:.3f}; with prompt lookup {a['with_lookup']}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": "python benchmarks/spec_bench_forced.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()
            if v is not None), "samples": len(rows), "heads": results}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
