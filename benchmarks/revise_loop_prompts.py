"""Build the ``revise-loop`` prompt set (specdec/prompts/data/revise_loop.jsonl): 10 tasks x 4 rounds.

Round 1 asks for a first answer; round r > 1 asks the model to improve its previous answer, which the prompt quotes.
The previous answer is the embedded model's own greedy answer to round r - 1 (with the chat template and the same
``--max-new-tokens`` as ``specdec eval``'s default), generated here, so that ``specdec eval --dataset revise-loop``
on that model replays exactly the loop an agent would run: each round's output largely repeats the previous one,
which the prompt holds (prompt lookup sees it) and which an earlier call produced (suffix decoding's cache saw it).
On another model the quoted answers are SmolLM2's: still a revision task, no longer the model's own loop.

    python benchmarks/revise_loop_prompts.py [--model smollm2-135m] [--max-new-tokens 64] [--out PATH]

Rows: ``id`` (``<task>-r<round>``), ``category`` (``revise``), ``task``, ``round``, ``prompt``; in task order, rounds in
order, so a run in file order feeds each round from the previous one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TASKS = {
    "email": "Write a short email asking a colleague to move Friday's meeting to Monday at 10am.",
    "function": "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "summary": "Summarize in three sentences why regular exercise is good for health.",
    "recipe": "List the steps to make a simple tomato pasta sauce.",
    "sql": "Write an SQL query that returns the ten customers with the highest total order value.",
    "bio": "Write a two-sentence biography for a fictional astronomer named Lena Ortiz.",
    "plan": "Make a five-item plan for learning basic Spanish in a month.",
    "regex": "Write a regular expression that matches dates like 2024-03-15 and explain it briefly.",
    "haiku": "Write a haiku about autumn rain in a city.",
    "json": "Give a JSON object describing a book with title, author, year and genres.",
}
ROUNDS = 4
REVISE = ("Here is your previous answer to the task below. Improve it: keep what is right, fix mistakes and make it "
          "clearer. Reply with the full improved answer only.\n\nTask: {task}\n\nPrevious answer:\n{answer}")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "specdec" / "prompts" / "data" / "revise_loop.jsonl"


def build(model_name: str, max_new_tokens: int) -> list[dict]:
    """Generate the rounds with the model (greedy, specdec with prompt lookup: the same tokens as ``generate``)."""
    import specdec
    from specdec.models import load_model
    from specdec.prompts import encode_batch

    model, tok = load_model(model_name)
    fast = specdec.SpeculativeModel(model, "prompt-lookup", tokenizer=tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = []
    for name, task in TASKS.items():
        prompt = task
        for r in range(1, ROUNDS + 1):
            rows.append({"id": f"{name}-r{r}", "category": "revise", "task": name, "round": r, "prompt": prompt})
            if r == ROUNDS:
                break
            ids, mask = encode_batch(tok, [prompt], True, model.device)
            out = fast.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=pad)
            answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
            print(f"{name} round {r}: {out.shape[1] - ids.shape[1]} tokens", file=sys.stderr, flush=True)
            prompt = REVISE.format(task=task, answer=answer)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    rows = build(args.model, args.max_new_tokens)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} prompts to {args.out}")


if __name__ == "__main__":
    main()
