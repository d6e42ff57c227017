"""The tree rules on the same passes: how many drafts each keeps when both judge the very same trees.

A sampled eval run's methods generate different texts, so comparing rules across methods reads the spread of those
texts too. This records every sampled tree pass of a real run (the tree with its nodes' laws, and the verifier's
processed distributions), then runs each tree rule (``specdec.verification.TREE_RULES``) ``--tries`` times on every
recorded pass and reports the mean drafts kept, and the share of passes keeping at least one and two.

``python benchmarks/tree_rules_same_passes.py --draft eagle --per-group 1 --max-new-tokens 64``
(Spec-Bench prompts, the first of each group; SmolLM2 at T=0.7, the default static tree).
"""

from __future__ import annotations

import argparse
import copy
import statistics

import torch

import specdec
from specdec import verification
from specdec.models import load_model
from specdec.prompts.sets import load_prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--draft", default="eagle")
    p.add_argument("--tree", default="static")
    p.add_argument("--per-group", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--tries", type=int, default=60)
    args = p.parse_args()
    model, tokenizer = load_model(args.model)
    passes, token_rule = [], verification.TREE_RULES["token"]

    def recording(tree, probs, generator=None):
        passes.append((copy.copy(tree), probs.clone()))
        return token_rule(tree, probs, generator)

    verification.TREE_RULES["token"] = recording
    try:
        spec = specdec.SpeculativeModel(model, args.draft, tree=args.tree, tokenizer=tokenizer)
        for i, prompt in enumerate(load_prompts(per_group=args.per_group)):
            if tokenizer.chat_template:
                ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}],
                                                    add_generation_prompt=True, return_tensors="pt",
                                                    return_dict=True)["input_ids"]
            else:  # a base model (Gemma 3 270M): the text as it is
                ids = tokenizer(prompt.text, return_tensors="pt").input_ids
            spec.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=True, temperature=args.temperature,
                          generator=torch.Generator().manual_seed(i))
    finally:
        verification.TREE_RULES["token"] = token_rule
    print(f"{len(passes)} sampled tree passes ({args.draft}, tree={args.tree}, T={args.temperature}), "
          f"{args.tries} tries of each rule on each")
    for name, rule in verification.TREE_RULES.items():
        gen, kept = torch.Generator().manual_seed(1), []
        for tree, probs in passes:
            kept += [int(rule(tree, probs, gen)[0].sum()) for _ in range(args.tries)]
        print(f"{name:9s} drafts kept {statistics.mean(kept):.4f}  at least one {statistics.mean(k >= 1 for k in kept):.4f}"
              f"  at least two {statistics.mean(k >= 2 for k in kept):.4f}")


if __name__ == "__main__":
    main()
