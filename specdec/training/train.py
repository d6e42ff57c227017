"""Training a draft head on cached verifier features (:mod:`specdec.training.features`).

EAGLE-3 heads learn with training-time test: step 0 reads the verifier's features, each later step
reads the head's own previous output (as it will when drafting), attending to the true-feature slots of
its root and to its own chain, with loss weights ``0.8 ** step``. EAGLE-1/2 heads learn EAGLE's losses:
feature regression (smooth L1) plus 0.1 x soft cross-entropy. Targets are the verifier's distributions
over the draft vocabulary; positions whose greedy token is outside it carry no loss (as in EAGLE-3).

Runs under ``accelerate`` (``accelerate launch`` for several processes or GPUs, mixed precision), and the
same code on one CPU. Checkpoints every ``save_every`` steps; a rerun resumes from the newest complete one.
A checkpoint is written under a temporary name and renamed when whole, so an interrupted save leaves no
``step-N`` directory; an incomplete one (from an older specdec) is skipped with a notice.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch import nn
from tqdm.auto import tqdm

from specdec.heads.config import HeadConfig
from specdec.heads.modules import EagleHead, KeyValues
from specdec.training.checkpoints import (PORTABLE_KEY, latest_checkpoint, load_portable, save_best,
                                           save_checkpoint)
from specdec.training.features import FeatureSet
from specdec.training.heap import TRIM_EVERY, release_free_memory
from specdec.training.lookup_targets import lookup_drafts
from specdec.training.soft_ce import soft_cross_entropy
from specdec.training.ttt_attention import flash_ttt_available, ttt_attention


@dataclass
class TrainConfig:
    """Hyper-parameters of one training run (recorded in the model card)."""

    kind: str = "eagle3"
    draft_vocab: int | None = 4096  # EAGLE-3: most frequent target tokens kept; None: the full vocabulary
    epochs: float = 9.0
    batch_tokens: int = 4096  # padded tokens per optimizer step (per process)
    lr: float = 2e-3
    warmup: int = 50
    ttt_steps: int = 3  # EAGLE-3 unrolled steps
    grad_clip: float = 0.5
    seed: int = 0
    save_every: int = 200
    mixed_precision: str = "no"
    noise: float = 0.0  # uniform noise on the verifier features, times their RMS (EAGLE-1 trains with some)
    patience: int = 0  # stop after this many epochs without a better validation score (0: train every epoch)
    prompt_weight: float = 0.0  # prompt slots scored too, at this weight: fixed text with the verifier's soft targets
    lookup_weight: float = 1.0  # weight of response targets prompt lookup drafts right (a head for a composite: < 1)
    block_size: int = 8  # DFlash: the block (the newest token and block_size - 1 masks)
    dflash_layers: int = 1  # DFlash: the drafter's decoder layers


def draft_vocabulary(features: FeatureSet, indices: list[int], size: int, vocab: int) -> tuple[torch.Tensor, float]:
    """The draft vocabulary: the ``size`` most frequent greedy targets of the training responses, sorted by id, and
    their coverage of those targets. When the responses hold fewer distinct tokens than ``size``, the other slots
    go to the tokens of the training prompts (the verifier's greedy tokens there, then the prompt text), by
    frequency: tokens a response may copy from its prompt that training happened not to see (measured on the
    issue-24 data: held-out coverage 0.961 -> 0.968 at 16k slots)."""
    counts = torch.zeros(vocab, dtype=torch.long, device="cpu")
    fill = torch.zeros(vocab, dtype=torch.long, device="cpu")
    for i in indices:
        s = features.small(i)
        p = s["prompt_length"]
        counts += torch.bincount(s["top"][p - 1:], minlength=vocab)[:vocab]
        fill += torch.bincount(s["top"][: p - 1], minlength=vocab)[:vocab] + torch.bincount(s["input_ids"][:p], minlength=vocab)[:vocab]
    size = min(size, vocab)
    # response targets first; prompt tokens only order what the responses left at zero (and ties)
    score = counts.double() + fill.double() / (float(fill.max()) + 1.0)
    keep = score.topk(size).indices.sort().values
    return keep, float(counts[keep].sum() / counts.sum().clamp(min=1))


def init_head(config: HeadConfig, verifier: Any, keep: torch.Tensor | None) -> EagleHead:
    """A fresh head for ``verifier``: its ``lm_head`` and ``norm`` start as the verifier's (draft-vocabulary
    rows), and its fc passes the last feature block through, so its output starts in the verifier's hidden space.
    (That is not a working early exit: the feature at slot ``i`` predicts token ``i + 1``, which the head is given,
    while its target is token ``i + 2``; a fresh head's step-0 top-1 is a few percent.)"""
    head = EagleHead(config)
    h = config.hidden_size
    with torch.no_grad():
        head.fc.weight.zero_()
        block = head.fc.weight[:, -config.target_hidden_size:]
        if block.shape[0] == block.shape[1]:
            block.copy_(torch.eye(h, device=block.device))
        if config.kind == "eagle3":
            target = verifier.get_output_embeddings().weight
            head.lm_head.weight.copy_(target[keep.to(target.device)].to(head.lm_head.weight.dtype))
            norm = getattr(getattr(verifier, "model", None), "norm", None)
            if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == (h,):
                head.norm.weight.copy_(norm.weight)
            head.d2t.copy_(keep.to(head.d2t.device) - torch.arange(len(keep), device=head.d2t.device))
            head.t2d.zero_()
            head.t2d[keep.to(head.t2d.device)] = True
    return head


class TrainingKeyValues(KeyValues):
    """Training-time test attention: at step ``s``, slot ``i`` sees the step-0 slots ``<= i - s`` and its own
    chain, the slot ``i - s + t`` of each step ``1 <= t <= s``."""

    def __init__(self, n: int, device: torch.device, flash: bool | None = None) -> None:
        self.keys: list[list[torch.Tensor]] = [[]]
        self.values: list[list[torch.Tensor]] = [[]]
        self.n, self.device, self.step = n, device, 0
        self.flash = flash_ttt_available(torch.device(device)) if flash is None else flash

    def next_step(self) -> None:
        self.step += 1

    def mask(self) -> torch.Tensor:
        i = torch.arange(self.n, device=self.device).view(-1, 1)
        j = torch.arange(self.n, device=self.device).view(1, -1)
        s = self.step
        blocks = [j <= i - s] + [j == i - s + t for t in range(1, s + 1)]
        return torch.cat(blocks, dim=1).unsqueeze(0)  # [1, n, (s + 1) n]

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        while len(self.keys) <= layer:
            self.keys.append([]), self.values.append([])
        self.keys[layer].append(k)
        self.values[layer].append(v)

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self._store(layer, k, v)
        return torch.cat(self.keys[layer], dim=1), torch.cat(self.values[layer], dim=1), self.mask()

    def attend(self, layer: int, attention: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """On a CPU, flash over the causal block merged with the chain's keys (:mod:`ttt_attention`: exact, a
        third of the masked attention's work over five steps); elsewhere the masked attention."""
        if not self.flash:
            return super().attend(layer, attention, q, k, v)
        self._store(layer, k, v)  # not __call__: the concatenated keys and the mask would go unused
        groups = attention.heads // attention.kv_heads
        heads = lambda ts: [t.transpose(1, 2).repeat_interleave(groups, dim=1) for t in ts]  # noqa: E731
        return attention.output(ttt_attention(q, heads(self.keys[layer]), heads(self.values[layer])))


def _batches(lengths: list[int], budget: int, rng: random.Random) -> list[list[int]]:
    """Samples grouped by similar length into batches of at most ``budget`` padded tokens, in random order."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches, current, width = [], [], 0
    for i in order:
        width_if = max(width, lengths[i])
        if current and width_if * (len(current) + 1) > budget:
            batches.append(current)
            current, width_if = [], lengths[i]
        current.append(i)
        width = width_if
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(features: FeatureSet, batch: list[int], device: torch.device, lookup: bool = False) -> dict[str, torch.Tensor]:
    """Right-padded batch tensors; ``valid[b, i]``: slot ``i`` (feature ``i``, token ``i + 1``) is real. With
    ``lookup``, ``lookup[b, t]`` is the token prompt lookup drafts after the first ``t`` tokens (-1: none)."""
    items = [features[i] for i in batch]
    width = max(len(s["input_ids"]) for s in items)
    out = {"input_ids": torch.zeros(len(items), width, dtype=torch.long, device="cpu"),
           "top": torch.zeros(len(items), width, dtype=torch.long, device="cpu"),
           "hidden": torch.zeros(len(items), width, items[0]["hidden"].shape[-1], dtype=items[0]["hidden"].dtype, device="cpu"),
           "final": torch.zeros(len(items), width, items[0]["final"].shape[-1], dtype=items[0]["final"].dtype, device="cpu"),
           "lengths": torch.tensor([len(s["input_ids"]) for s in items], dtype=torch.long, device="cpu"),
           "prompt_lengths": torch.tensor([s["prompt_length"] for s in items], dtype=torch.long, device="cpu")}
    for b, s in enumerate(items):
        n = len(s["input_ids"])
        for key in ("input_ids", "top", "hidden", "final"):
            out[key][b, :n] = s[key]
    if lookup:
        out["lookup"] = torch.full((len(items), width), -1, dtype=torch.long, device="cpu")
        for b, s in enumerate(items):
            out["lookup"][b, :len(s["input_ids"])] = torch.tensor(lookup_drafts(s["input_ids"].tolist()), dtype=torch.long,
                                                                   device="cpu")
    return {k: v.to(device) for k, v in out.items()}


def head_loss(head: EagleHead, batch: dict[str, torch.Tensor], embed: nn.Module, target_head: nn.Module,
              ttt_steps: int, noise: float = 0.0, prompt_weight: float = 0.0, lookup_weight: float = 1.0
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one batch and per-step accuracies (``acc_s``: share of the slots whose target the draft
    vocabulary holds where the draft is the verifier's greedy token; ``n_s`` those slots, ``all_s`` every
    response slot of step ``s``). ``noise``: uniform noise on the features, times their RMS (training only).

    Draft and target logits are computed at the scored slots only (response slots; prompt and padding slots
    feed the head's attention but score nothing): the draft vocabulary's projection is most of a step.
    ``prompt_weight`` > 0 scores the prompt slots too, at that weight against a response slot's: the prompt is
    fixed text (often human-written) with the verifier's own distributions as soft targets (EAGLE-1's fixed-text
    ablation). ``lookup_weight`` < 1 weighs response targets that prompt lookup drafts right (``batch["lookup"]``,
    :func:`~specdec.training.lookup_targets.lookup_drafts`) that much: a composite drafts those by lookup and asks
    its head only elsewhere. The statistics stay over response slots, so they compare across weights."""
    ids, hidden, final, top = batch["input_ids"], batch["hidden"], batch["final"], batch["top"]
    n = ids.shape[1] - 1  # slots: (feature i, token i + 1), targets from position i + 1
    dtype = head.fc.weight.dtype
    tokens, feats = ids[:, 1:], hidden[:, :-1].to(dtype)
    if noise:  # the head must draft from features a little off the ones it saw (EAGLE-1's augmentation)
        rms = feats.float().pow(2).mean(-1, keepdim=True).sqrt().to(dtype)
        feats = feats + (torch.rand_like(feats) - 0.5) * noise * rms
    slot = torch.arange(n, device=ids.device).view(1, -1)
    real = slot < (batch["lengths"] - 1).view(-1, 1)
    first = (batch["prompt_lengths"] - 1).view(-1, 1)  # the first slot that drafts a response token
    # step 0's response slots (with prompt_weight, every real slot); step s scores a subset of them
    scored = real if prompt_weight else real & (slot >= first)
    target_top, final_scored = top[:, 1:][scored], final[:, 1:][scored]  # [M], [M, H]
    if lookup_weight != 1.0:  # slot i's target is position i + 2's token; lookup drafts it after i + 2 tokens
        drafts = torch.cat([batch["lookup"][:, 2:], batch["lookup"].new_full((ids.shape[0], 1), -1)], dim=1)
        looked_up = drafts == top[:, 1:]
    with torch.no_grad():
        embeds = embed(tokens).to(dtype)
        if head.config.kind == "eagle3":
            ids_t = torch.arange(head.config.draft_vocab_size, device=ids.device) + head.d2t
            target_logits = nn.functional.linear(final_scored.to(dtype), target_head.weight[ids_t].to(dtype))
            in_vocab = head.t2d[target_top]
        else:
            target_logits = target_head(final_scored.to(dtype))
            in_vocab = torch.ones_like(target_top, dtype=torch.bool)
        target_p = torch.softmax(target_logits.float(), dim=-1)
        draft_ids = ids_t if head.config.kind == "eagle3" else None
    steps = ttt_steps if head.config.kind == "eagle3" else 1
    total, stats = 0.0, {}
    for s, out in enumerate(ttt_outputs(head, embeds, feats, steps)):
        # step s scores the response slots from s after each row's first; its first s are a few rows too many
        # for the projection, masked out rather than gathered away (gathering the targets costs more)
        response = (real & (slot - s >= first))[scored]
        out_s = out[scored]
        ce, guess = soft_cross_entropy(head.logits(out_s), target_p)  # fused: a plain one was ~40% of a CPU step
        mask = response & in_vocab
        count = mask.sum().clamp(min=1)
        stats[f"n_{s}"], stats[f"all_{s}"] = float(mask.sum()), float(response.sum())
        weight = mask.float()
        if lookup_weight != 1.0:
            weight = weight * (1.0 - (1.0 - lookup_weight) * looked_up[scored].float())
        if prompt_weight:  # a prompt slot's step-s chain starts at slot - s, which must be real
            context = (real & (slot - s >= 0) & (slot - s < first))[scored] & in_vocab
            weight = weight + prompt_weight * context.float()
        total_weight = weight.sum().clamp(min=1)
        loss = (ce * weight).sum() / total_weight
        if head.config.kind == "eagle":
            regression = nn.functional.smooth_l1_loss(out_s.float(), final_scored.float(), reduction="none").mean(-1)
            loss = (regression * weight).sum() / total_weight + 0.1 * loss
        total = total + (0.8 ** s) * loss
        guess = draft_ids[guess] if draft_ids is not None else guess
        stats[f"acc_{s}"] = float(((guess == target_top) & mask).sum() / count)
        stats[f"loss_{s}"] = float(loss.detach())
    return total, stats


def ttt_outputs(head: EagleHead, embeds: torch.Tensor, feats: torch.Tensor, steps: int) -> Iterator[torch.Tensor]:
    """The head's outputs ``[B, n, H]`` at each training-time step over ``n`` slots (slot ``i``: ``feats[:, i]``
    and the token embedded in ``embeds[:, i]``): step 0 reads the verifier's features, step ``s`` the head's own
    output of step ``s - 1`` at the previous slot (as drafting does), attending as :class:`TrainingKeyValues` says."""
    n = embeds.shape[1]
    positions = torch.arange(n, device=embeds.device).view(1, -1).expand(embeds.shape[0], -1)
    kv = TrainingKeyValues(n, embeds.device)
    state = head.input_hidden(embeds, feats)
    for s in range(steps):
        out = head(embeds, state, positions, kv)
        yield out
        if s + 1 < steps:  # the next step reads this step's output at the previous slot
            state = torch.cat([out[:, :1] * 0, out[:, :-1]], dim=1)
            kv.next_step()


class _WithLoss(nn.Module):
    """The head with its loss as ``forward``, so a DDP wrapper (``accelerate launch``) sees the whole step."""

    def __init__(self, head: EagleHead, ttt_steps: int, noise: float = 0.0, prompt_weight: float = 0.0,
                 lookup_weight: float = 1.0) -> None:
        super().__init__()
        self.head, self.ttt_steps, self.noise = head, ttt_steps, noise
        self.prompt_weight, self.lookup_weight = prompt_weight, lookup_weight

    def forward(self, batch: dict[str, torch.Tensor], embed: nn.Module, target_head: nn.Module):
        if not self.training:
            return head_loss(self.head, batch, embed, target_head, self.ttt_steps)
        return head_loss(self.head, batch, embed, target_head, self.ttt_steps, self.noise, self.prompt_weight,
                         self.lookup_weight)


@torch.no_grad()
def validate(head: EagleHead, features: FeatureSet, indices: list[int], embed: nn.Module, target_head: nn.Module,
             ttt_steps: int, batch_tokens: int, device: torch.device) -> dict[str, Any]:
    """Teacher-forced numbers of ``head`` on ``features[indices]`` (samples it never trains on): ``top1`` per
    training-time step over every response target, ``top1_in_vocab`` over those the draft vocabulary holds,
    ``coverage`` (step 0's targets in the draft vocabulary) and ``tokens_per_pass``, ``1 + sum_s prod_{j<=s}
    top1_j``: what a chain of ``ttt_steps`` drafts would commit per verify pass if drafts failed independently."""
    batches = _batches([len(features.small(i)["input_ids"]) for i in indices], batch_tokens, random.Random(0))
    return teacher_forced_summary(head_loss(head, collate(features, [indices[i] for i in batch], device), embed,
                                            target_head, ttt_steps)[1] for batch in batches)


def teacher_forced_summary(batch_stats: Iterable[dict[str, float]]) -> dict[str, Any]:
    """:func:`validate`'s numbers from the :func:`head_loss` statistics of several batches (counts summed, so
    every target weighs the same whatever its batch)."""
    hits, inside, every = {}, {}, {}
    for stats in batch_stats:
        for key in stats:
            if key.startswith("acc_"):
                s = key[4:]
                hits[s] = hits.get(s, 0.0) + stats[key] * stats[f"n_{s}"]
                inside[s] = inside.get(s, 0.0) + stats[f"n_{s}"]
                every[s] = every.get(s, 0.0) + stats[f"all_{s}"]
    steps = sorted(hits, key=int)
    top1 = [hits[s] / max(every[s], 1.0) for s in steps]
    chain, expected = 1.0, 1.0
    for p in top1:
        chain *= p
        expected += chain
    return {"top1": [round(x, 4) for x in top1],
            "top1_in_vocab": [round(hits[s] / max(inside[s], 1.0), 4) for s in steps],
            "coverage": round(inside["0"] / max(every["0"], 1.0), 4) if steps else 0.0,
            "tokens_per_pass": round(expected, 4)}


def train_head(verifier: Any, features: FeatureSet, train_idx: list[int], out: Path, config: TrainConfig,
               head_config: HeadConfig, *, val_idx: list[int] | None = None, progress: bool = True,
               log: Any = print) -> tuple[EagleHead, dict[str, Any]]:
    """Train a head on ``features[train_idx]``; checkpoints in ``out / "checkpoints"``, resumed when present.

    With ``val_idx`` (samples it never trains on), every epoch ends with :func:`validate`; the head with the
    best ``tokens_per_pass`` so far is kept (``checkpoints/best``) and returned, and ``config.patience`` epochs
    without a better one stop the run. Returns the head (unwrapped, on the verifier's device) and a summary
    (steps, seconds, losses, ``validation`` per epoch, ``best``).
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator(mixed_precision=config.mixed_precision, cpu=verifier.device.type == "cpu")
    set_seed(config.seed)
    keep = None
    if head_config.kind == "eagle3":
        size = config.draft_vocab or head_config.vocab_size
        keep, coverage = draft_vocabulary(features, train_idx, size, head_config.vocab_size)
        head_config.draft_vocab_size = len(keep)
        log(f"draft vocabulary: {len(keep)} tokens cover {coverage:.1%} of the training targets")
    head = _WithLoss(init_head(head_config, verifier, keep), config.ttt_steps, config.noise, config.prompt_weight,
                     config.lookup_weight).to(accelerator.device)
    embed, target_head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    lengths = [len(features.small(i)["input_ids"]) for i in train_idx]
    per_epoch = len(_batches(lengths, config.batch_tokens, random.Random(0)))
    total_steps = max(1, math.ceil(per_epoch * config.epochs / accelerator.num_processes))
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rewarm_at: int | None = None  # resumed without optimizer moments (a portable checkpoint): warm up again

    def lr_factor(s: int) -> float:
        again = 1.0 if rewarm_at is None else min(1.0, (s - rewarm_at + 1) / config.warmup)
        return min(1.0, (s + 1) / config.warmup) * again * 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    head, optimizer, schedule = accelerator.prepare(head, optimizer, schedule)
    checkpoints = out / "checkpoints"
    step, seconds, resumed_from, earlier = 0, 0.0, None, []
    main = accelerator.is_main_process
    found = latest_checkpoint(checkpoints, log if main else (lambda m: None), remove=main)
    latest, state = found if found is not None else (None, {})
    if latest is not None:
        step, seconds = state["step"], state.get("seconds", 0.0)
        resumed_from, earlier = step, state.get("history_first", [])
        if PORTABLE_KEY in state:  # weights only: fresh moments, the schedule at `step`, a second warm-up
            load_portable(accelerator.unwrap_model(head), latest)
            rewarm_at = step
            inner = getattr(schedule, "scheduler", schedule)
            inner.last_epoch = step
            for group, base in zip(optimizer.param_groups, inner.base_lrs):
                group["lr"] = base * lr_factor(step)
            log(f"resuming from {latest} (step {step} of {total_steps}; portable: fresh optimizer moments, "
                f"{config.warmup} steps of warm-up again)")
        else:
            accelerator.load_state(str(latest))
            log(f"resuming from {latest} (step {step} of {total_steps})")
    best, val_history, stopped = state.get("best"), state.get("val_history", []), bool(state.get("stopped"))
    if stopped:
        log(f"the run in {checkpoints} stopped early at step {step}: nothing left to train")
    history: list[dict[str, float]] = []
    bar = tqdm(total=total_steps, initial=step, desc="training head", disable=not progress or not accelerator.is_main_process)
    epoch_batches: dict[int, list[list[int]]] = {}
    started = time.perf_counter() - seconds
    mark = (step, time.perf_counter())  # the step and time of the last progress line
    head.train()
    while step < total_steps and not stopped:
        global_index = step * accelerator.num_processes + accelerator.process_index
        epoch, within = divmod(global_index, per_epoch)
        if epoch not in epoch_batches:  # the same order on every process and after a resume
            epoch_batches = {epoch: _batches(lengths, config.batch_tokens, random.Random(config.seed * 1000 + epoch))}
        batch = collate(features, [train_idx[i] for i in epoch_batches[epoch][within]], accelerator.device,
                        lookup=config.lookup_weight != 1.0)
        with accelerator.autocast():
            loss, stats = head(batch, embed, target_head)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(head.parameters(), config.grad_clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        step += 1
        if accelerator.device.type == "cpu" and step % TRIM_EVERY == 0:  # the heap grows 3-4x otherwise (heap.py)
            release_free_memory()
        history.append({"step": step, "loss": float(loss.detach()),
                        **{k: v for k, v in stats.items() if k.startswith(("acc_", "loss_"))}})
        bar.update(1)
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc0=f"{stats.get('acc_0', 0):.2f}")
        # an epoch ends where process 0's next batch is in the next epoch: the same step on every process
        epoch_done = step == total_steps or (step * accelerator.num_processes) // per_epoch != epoch
        if val_idx and epoch_done:
            trained = accelerator.unwrap_model(head).head
            metrics = {"epoch": (step * accelerator.num_processes - 1) // per_epoch + 1, "step": step,
                       **validate(trained, features, val_idx, embed, target_head, config.ttt_steps,
                                  config.batch_tokens, accelerator.device)}
            val_history.append(metrics)
            better = best is None or metrics["tokens_per_pass"] > best["tokens_per_pass"]
            if better:
                best = metrics
                if main:
                    save_best(trained, checkpoints / "best")
            log(f"epoch {metrics['epoch']}: validation top-1 per step {metrics['top1']}, coverage "
                f"{metrics['coverage']:.3f}, ~{metrics['tokens_per_pass']:.2f} tokens per pass{' (best)' if better else ''}")
            stopped = bool(config.patience) and metrics["epoch"] - best["epoch"] >= config.patience and step < total_steps
            if stopped:
                log(f"stopping early: no better validation score for {config.patience} epoch(s)")
        if step % config.save_every == 0 or step == total_steps or (val_idx and epoch_done):
            if main and not progress:  # no bar (a background run's log): a line per checkpoint instead
                recent = history[-config.save_every:]
                log(f"step {step} of {total_steps}: loss {sum(h['loss'] for h in recent) / len(recent):.3f}, "
                    f"training top-1 {sum(h.get('acc_0', 0.0) for h in recent) / len(recent):.3f}, "
                    f"{(time.perf_counter() - mark[1]) / max(1, step - mark[0]):.2f} s a step")
                mark = (step, time.perf_counter())
            save_checkpoint(accelerator, checkpoints, step, {
                "step": step, "seconds": time.perf_counter() - started, "best": best, "val_history": val_history,
                "stopped": stopped, "history_first": (earlier + history)[:20], "history_last": history[-20:]})
    bar.close()
    head.eval()
    model = accelerator.unwrap_model(head).head.to(verifier.device)
    if best is not None and (checkpoints / "best").is_dir():  # the best validated head, not the last
        from specdec.heads.checkpoint import load_head

        model = load_head(checkpoints / "best", verifier)
    model.attach(embed, target_head)
    if not history and latest is not None:  # nothing left to train: report what the last run saw
        history = state.get("history_last", [])
    tail, head_of = history[-20:] or [{}], (earlier + history)[:20] or [{}]
    mean = lambda rows: {k: sum(h.get(k, 0.0) for h in rows) / len(rows) for k in rows[0]}  # noqa: E731
    summary = {"resumed_from": resumed_from, "history_first": mean(head_of), "steps": step, "seconds": time.perf_counter() - started, "total_steps": total_steps,
               "final": mean(tail), "validation": val_history, "best": best, "stopped_early": stopped,
               "train_config": asdict(config)}
    return model, summary
