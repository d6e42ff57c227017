"""``specdec head-report``: a head's teacher-forced accuracy against what it does in the real loop.

Teacher forcing is what training measures: the verifier's true features of a response, and at step ``s``
(training-time test) the head's own outputs for the ``s`` drafts before. Online is the speculative loop.
Under greedy decoding the first draft of every verify pass sees exactly what step 0 sees (the committed
tokens' true features plus the newest token), so the two must agree position by position;
:func:`first_draft_agreement` checks that on the loop's own output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from specdec import metrics
from specdec.drafters.eagle import EagleDrafter
from specdec.heads.modules import EagleHead
from specdec.protocol import DraftContext, DraftChain, Rows
from specdec.training.features import verifier_features
from specdec.training.train import head_loss, teacher_forced_summary, ttt_outputs

#: a teacher-forced logit this close to the best counts as a float near-tie, not a disagreement
NEAR_TIE = 1e-3


def verifier_batch(verifier: Any, layers: Sequence[int], prompt_ids: Sequence[int], response_ids: Sequence[int]
                   ) -> dict[str, torch.Tensor]:
    """One response as a training batch (:func:`~specdec.training.train.collate`'s keys), its features from the
    verifier now (in its own dtype, not the bf16 a feature cache stores)."""
    device = next(verifier.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=device)
    hidden, final, top = verifier_features(verifier, ids, None, tuple(layers))
    return {"input_ids": ids, "hidden": hidden, "final": final, "top": top,
            "lengths": torch.tensor([ids.shape[1]], dtype=torch.long, device=device),
            "prompt_lengths": torch.tensor([len(prompt_ids)], dtype=torch.long, device=device)}


@torch.no_grad()
def step0_logits(head: EagleHead, verifier: Any, layers: Sequence[int], ids: Sequence[int]) -> torch.Tensor:
    """The head's teacher-forced step-0 logits ``[n, V_draft]`` over slots ``0..n-1`` of ``ids`` (slot ``i``: feature
    ``i`` and token ``i + 1``; it predicts token ``i + 2``), as training computes them."""
    batch = verifier_batch(verifier, layers, ids[:1], ids[1:])
    dtype = next(head.parameters()).dtype
    embeds = head.embed(batch["input_ids"][:, 1:]).to(dtype)
    out = next(ttt_outputs(head, embeds, batch["hidden"][:, :-1].to(dtype), 1))
    return head.logits(out)[0].float()


@dataclass
class FirstDrafts:
    """The first draft of every verify pass: ``(row owner, real tokens committed, draft)`` per row per pass."""

    passes: list[tuple[int, int, int]] = field(default_factory=list)


class RecordingEagle(EagleDrafter):
    """An :class:`EagleDrafter` that records each pass's first draft (chains) or best depth-1 node (trees)."""

    def __init__(self, head: EagleHead, verifier: Any, record: FirstDrafts) -> None:
        super().__init__(head, verifier)
        self.record = record

    def _note(self, rows: Rows, first: list[int]) -> None:
        for b, token in enumerate(first):
            self.record.passes.append((rows.owners[b], rows.length(b) - rows.pads[b], token))

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        proposal = super().propose(rows, k, ctx)
        if proposal.num_tokens:
            self._note(rows, proposal.tokens[:, 0].tolist())
        return proposal

    def propose_tree(self, rows: Rows, shape: Any, ctx: DraftContext):
        tree = super().propose_tree(rows, shape, ctx)
        depth = torch.tensor(tree.depths(), device=tree.tokens.device)
        _, valid = tree.host()
        first = []
        for b in range(len(rows)):  # a depth-1 node of highest value: the head's top-1 first draft
            cand = [j for j in range(tree.tokens.shape[1]) if valid[b][j] and int(depth[b, j]) == 1]
            best = max(cand, key=lambda j: float(tree.values[b, j]))
            first.append(int(tree.tokens[b, best]))
        self._note(rows, first)
        return tree


def online_run(verifier: Any, head: EagleHead, prompts: list[list[int]], *, new_tokens: int | list[int] = 48,
               k: int = 4, tree: Any = None, batch: bool = False, pad_token_id: int = 0) -> dict[str, Any]:
    """The greedy speculative loop with ``head`` over ``prompts`` (one call each, or one left-padded batch with
    ``new_tokens`` an int): ``outputs`` (prompt + generated ids per prompt), ``first`` (per pass: prompt index,
    real tokens committed, first draft), ``stats`` (each call's :class:`~specdec.stats.SpecStats`), ``drafter``."""
    from specdec.api import SpeculativeModel  # training sits above the API: a report is an application of it

    record = FirstDrafts()
    drafter = RecordingEagle(head, verifier, record)
    spec = SpeculativeModel(verifier, draft=drafter, num_draft_tokens=k, tree=tree)
    device = next(verifier.parameters()).device
    lengths = new_tokens if isinstance(new_tokens, list) else [new_tokens] * len(prompts)
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=pad_token_id)
    outputs, first, stats = [], [], []
    if batch:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long, device=device)
            mask[r, width - len(p):] = 1
        out = spec.generate(ids, attention_mask=mask, max_new_tokens=max(lengths), **kwargs)
        outputs = [p + out[r, width:].tolist() for r, p in enumerate(prompts)]
        first, stats = list(record.passes), [spec.last_stats]
    else:
        for r, (p, n) in enumerate(zip(prompts, lengths)):
            record.passes.clear()
            ids = torch.tensor([p], dtype=torch.long, device=device)
            # an explicit mask: without one, generate would mask prompt tokens equal to the pad token
            out = spec.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, **kwargs)
            outputs.append(out[0].tolist())
            first += [(r, committed, token) for _, committed, token in record.passes]
            stats.append(spec.last_stats)
    return {"outputs": outputs, "prompt_lengths": [len(p) for p in prompts], "first": first, "stats": stats,
            "drafter": drafter}


def compare_first_drafts(verifier: Any, head: EagleHead, run: dict[str, Any]) -> dict[str, Any]:
    """Each pass's first draft of :func:`online_run` against the teacher-forced step-0 prediction at the same
    position of the same output: ``passes``, ``equal``, ``near_ties`` (differing drafts whose teacher-forced
    logits tie within :data:`NEAR_TIE`), ``mismatches`` (``(prompt, position, online, teacher_forced)``) and
    ``correct_at_pass_starts`` (share of passes whose teacher-forced draft is the verifier's token there:
    online first-draft acceptance), against ``correct_everywhere`` (the same over every generated position)."""
    drafter = run["drafter"]
    forced = [step0_logits(head, verifier, drafter.hidden_layers, seq) for seq in run["outputs"]]
    best = [head.to_target(logits.argmax(-1)) for logits in forced]
    equal = near = correct = 0
    mismatches = []
    for r, committed, token in run["first"]:
        slot = committed - 2  # slot i (feature i, token i + 1) predicts position i + 2
        guess = int(best[r][slot])
        correct += guess == run["outputs"][r][committed]
        if guess == token:
            equal += 1
            continue
        logits, local = forced[r][slot], _draft_index(drafter, token)
        if local is not None and float(logits.max() - logits[local]) <= NEAR_TIE * max(1.0, float(logits.abs().max())):
            near += 1
        else:
            mismatches.append((r, committed, token, guess))
    hits = total = 0
    for r, (seq, prompt) in enumerate(zip(run["outputs"], run["prompt_lengths"])):
        for t in range(prompt + 1, len(seq)):  # every position a pass could start at
            hits, total = hits + int(int(best[r][t - 2]) == seq[t]), total + 1
    passes = len(run["first"])
    return {"passes": passes, "equal": equal, "near_ties": near, "mismatches": mismatches,
            "correct_at_pass_starts": correct / max(passes, 1), "correct_everywhere": hits / max(total, 1)}


def first_draft_agreement(verifier: Any, head: EagleHead, prompts: list[list[int]], **options: Any) -> dict[str, Any]:
    """:func:`online_run` then :func:`compare_first_drafts`."""
    return compare_first_drafts(verifier, head, online_run(verifier, head, prompts, **options))


def _draft_index(drafter: EagleDrafter, token: int) -> int | None:
    """The head's own vocabulary index of verifier token ``token`` (None if it cannot draft it)."""
    if drafter._draft_ids is None:
        return token
    hit = (drafter._draft_ids == token).nonzero()
    return int(hit[0, 0]) if len(hit) else None


def head_report(verifier: Any, head: EagleHead, samples: list[dict[str, Any]], *, steps: int = 3, k: int = 5,
                tree: Any = None) -> dict[str, Any]:
    """Teacher-forced and online numbers of ``head`` on verifier responses (``prompt_ids``, ``response_ids``).

    Keys: ``teacher_forced`` (top-1 per training-time step over every response target), ``teacher_forced_in_vocab``
    (the same over targets the draft vocabulary holds, as training logs it), ``coverage`` (share of the verifier's
    greedy targets in the draft vocabulary), ``online_by_position`` (draft ``i`` accepted when drafts ``< i`` were:
    comparable with ``teacher_forced[i]``), ``online_acceptance_by_position`` (accepted over proposed at each position),
    ``mean_accepted_length`` (tokens per verify pass), ``first_draft`` (:func:`compare_first_drafts`, mismatches counted).
    """
    layers = RecordingEagle(head, verifier, FirstDrafts()).hidden_layers
    target_head = verifier.get_output_embeddings()
    with torch.no_grad():  # embedded as drafting embeds (the head's own table when it has one)
        forced = teacher_forced_summary(
            head_loss(head, verifier_batch(verifier, layers, s["prompt_ids"], s["response_ids"]), head.embed, target_head,
                      steps)[1] for s in samples)
    run = online_run(verifier, head, [list(s["prompt_ids"]) for s in samples], k=k, tree=tree,
                     new_tokens=[max(2, len(s["response_ids"])) for s in samples])
    accepted, proposed = metrics.pool_positions([s.accepted_per_position for s in run["stats"]],
                                                 [s.proposed_per_position for s in run["stats"]])
    committed = [n for stats in run["stats"] for n in stats.committed_per_step]
    reached = [proposed[0] if proposed else 0] + accepted[:-1]
    first = compare_first_drafts(verifier, head, run)
    ratio = lambda a, b: round(metrics.ratio(a, b), 4)  # noqa: E731
    return {
        "teacher_forced": forced["top1"], "teacher_forced_in_vocab": forced["top1_in_vocab"],
        "coverage": forced["coverage"],
        "online_by_position": [ratio(a, r) for a, r in zip(accepted, reached)],
        "online_acceptance_by_position": [round(x, 4) for x in metrics.acceptance_by_position(accepted, proposed)],
        "mean_accepted_length": round(metrics.mean_accepted_length(committed, len(committed)), 4),
        "first_draft": {"passes": first["passes"], "equal_to_teacher_forced": first["equal"],
                        "near_ties": first["near_ties"], "mismatches": len(first["mismatches"]),
                        "accepted_at_pass_starts": round(first["correct_at_pass_starts"], 4),
                        "teacher_forced_everywhere": round(first["correct_everywhere"], 4)},
        "samples": len(samples), "response_tokens": sum(len(s["response_ids"]) for s in samples), "k": k,
        "tree": tree if tree is None or isinstance(tree, str) else str(tree),
    }
