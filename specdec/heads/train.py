"""Training a draft head on cached verifier features (:mod:`specdec.heads.features`).

EAGLE-3 heads learn with training-time test: step 0 reads the verifier's features, each later step
reads the head's own previous output (as it will when drafting), attending to the true-feature slots of
its root and to its own chain, with loss weights ``0.8 ** step``. EAGLE-1/2 heads learn EAGLE's losses:
feature regression (smooth L1) plus 0.1 x soft cross-entropy. Targets are the verifier's distributions
over the draft vocabulary; positions whose greedy token is outside it carry no loss (as in EAGLE-3).

Runs under ``accelerate`` (``accelerate launch`` for several processes or GPUs, mixed precision), and the
same code on one CPU. Checkpoints every ``save_every`` steps; a rerun resumes from the newest.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from specdec.heads.config import HeadConfig
from specdec.heads.features import FeatureSet
from specdec.heads.modules import EagleHead, KeyValues


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


def draft_vocabulary(features: FeatureSet, indices: list[int], size: int, vocab: int) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent greedy targets of the training responses, sorted by id, and their coverage."""
    counts = torch.zeros(vocab, dtype=torch.long, device="cpu")
    for i in indices:
        s = features[i]
        counts += torch.bincount(s["top"][s["prompt_length"] - 1:], minlength=vocab)[:vocab]
    size = min(size, vocab)
    keep = counts.topk(size).indices.sort().values
    return keep, float(counts[keep].sum() / counts.sum().clamp(min=1))


def init_head(config: HeadConfig, verifier: Any, keep: torch.Tensor | None) -> EagleHead:
    """A fresh head for ``verifier``: its ``lm_head`` and ``norm`` start as the verifier's (draft-vocabulary
    rows), and its fc passes the last feature block through, so step 0 starts as an early exit."""
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

    def __init__(self, n: int, device: torch.device) -> None:
        self.keys: list[list[torch.Tensor]] = [[]]
        self.values: list[list[torch.Tensor]] = [[]]
        self.n, self.device, self.step = n, device, 0

    def next_step(self) -> None:
        self.step += 1

    def mask(self) -> torch.Tensor:
        i = torch.arange(self.n, device=self.device).view(-1, 1)
        j = torch.arange(self.n, device=self.device).view(1, -1)
        s = self.step
        blocks = [j <= i - s] + [j == i - s + t for t in range(1, s + 1)]
        return torch.cat(blocks, dim=1).unsqueeze(0)  # [1, n, (s + 1) n]

    def __call__(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        while len(self.keys) <= layer:
            self.keys.append([]), self.values.append([])
        self.keys[layer].append(k)
        self.values[layer].append(v)
        return torch.cat(self.keys[layer], dim=1), torch.cat(self.values[layer], dim=1), self.mask()


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


def collate(features: FeatureSet, batch: list[int], device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded batch tensors; ``valid[b, i]``: slot ``i`` (feature ``i``, token ``i + 1``) is real."""
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
    return {k: v.to(device) for k, v in out.items()}


def head_loss(head: EagleHead, batch: dict[str, torch.Tensor], embed: nn.Module, target_head: nn.Module,
              ttt_steps: int) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one batch and per-step accuracies (``acc_s``: share of slots whose draft is the verifier's
    greedy token)."""
    ids, hidden, final, top = batch["input_ids"], batch["hidden"], batch["final"], batch["top"]
    n = ids.shape[1] - 1  # slots: (feature i, token i + 1), targets from position i + 1
    dtype = head.fc.weight.dtype
    tokens, feats = ids[:, 1:], hidden[:, :-1].to(dtype)
    slot = torch.arange(n, device=ids.device).view(1, -1)
    real = slot < (batch["lengths"] - 1).view(-1, 1)
    first = (batch["prompt_lengths"] - 1).view(-1, 1)  # the first slot that drafts a response token
    target_top = top[:, 1:]
    with torch.no_grad():
        embeds = embed(tokens).to(dtype)
        if head.config.kind == "eagle3":
            ids_t = torch.arange(head.config.draft_vocab_size, device=ids.device) + head.d2t
            target_logits = nn.functional.linear(final[:, 1:].to(dtype), target_head.weight[ids_t].to(dtype))
            in_vocab = head.t2d[target_top]
        else:
            target_logits = target_head(final[:, 1:].to(dtype))
            in_vocab = torch.ones_like(target_top, dtype=torch.bool)
        target_p = torch.softmax(target_logits.float(), dim=-1)
        draft_ids = ids_t if head.config.kind == "eagle3" else None
    positions = slot.expand(ids.shape[0], -1)
    kv = TrainingKeyValues(n, ids.device)
    steps = ttt_steps if head.config.kind == "eagle3" else 1
    total, stats, state = 0.0, {}, head.input_hidden(embeds, feats)
    for s in range(steps):
        out = head(embeds, state, positions, kv)
        logits = head.logits(out).float()
        mask = real & (slot - s >= first) & in_vocab
        count = mask.sum().clamp(min=1)
        ce = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)
        loss = (ce * mask).sum() / count
        if head.config.kind == "eagle":
            regression = nn.functional.smooth_l1_loss(out.float(), final[:, 1:].float(), reduction="none").mean(-1)
            loss = (regression * mask).sum() / count + 0.1 * loss
        total = total + (0.8 ** s) * loss
        guess = logits.argmax(-1)
        guess = draft_ids[guess] if draft_ids is not None else guess
        stats[f"acc_{s}"] = float(((guess == target_top) & mask).sum() / count)
        stats[f"loss_{s}"] = float(loss.detach())
        if s + 1 < steps:  # the next step reads this step's output at the previous slot
            state = torch.cat([out[:, :1] * 0, out[:, :-1]], dim=1)
            kv.next_step()
    return total, stats


class _WithLoss(nn.Module):
    """The head with its loss as ``forward``, so a DDP wrapper (``accelerate launch``) sees the whole step."""

    def __init__(self, head: EagleHead, ttt_steps: int) -> None:
        super().__init__()
        self.head, self.ttt_steps = head, ttt_steps

    def forward(self, batch: dict[str, torch.Tensor], embed: nn.Module, target_head: nn.Module):
        return head_loss(self.head, batch, embed, target_head, self.ttt_steps)


def _latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(directory.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None


def train_head(verifier: Any, features: FeatureSet, train_idx: list[int], out: Path, config: TrainConfig,
               head_config: HeadConfig, *, progress: bool = True, log: Any = print) -> tuple[EagleHead, dict[str, Any]]:
    """Train a head on ``features[train_idx]``; checkpoints in ``out / "checkpoints"``, resumed when present.

    Returns the trained head (unwrapped, on the verifier's device) and a summary (steps, seconds, losses).
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
    head = _WithLoss(init_head(head_config, verifier, keep), config.ttt_steps).to(accelerator.device)
    embed, target_head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    lengths = [len(features[i]["input_ids"]) for i in train_idx]
    per_epoch = len(_batches(lengths, config.batch_tokens, random.Random(0)))
    total_steps = max(1, math.ceil(per_epoch * config.epochs / accelerator.num_processes))
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / config.warmup) * 0.5 *
                                                  (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    head, optimizer, schedule = accelerator.prepare(head, optimizer, schedule)
    checkpoints = out / "checkpoints"
    step, seconds, resumed_from, earlier = 0, 0.0, None, []
    latest = _latest_checkpoint(checkpoints)
    if latest is not None:
        accelerator.load_state(str(latest))
        state = json.loads((latest / "trainer.json").read_text())
        step, seconds = state["step"], state["seconds"]
        resumed_from, earlier = step, state.get("history_first", [])
        log(f"resuming from {latest} (step {step} of {total_steps})")
    history: list[dict[str, float]] = []
    bar = tqdm(total=total_steps, initial=step, desc="training head", disable=not progress or not accelerator.is_main_process)
    epoch_batches: dict[int, list[list[int]]] = {}
    started = time.perf_counter() - seconds
    head.train()
    while step < total_steps:
        global_index = step * accelerator.num_processes + accelerator.process_index
        epoch, within = divmod(global_index, per_epoch)
        if epoch not in epoch_batches:  # the same order on every process and after a resume
            epoch_batches = {epoch: _batches(lengths, config.batch_tokens, random.Random(config.seed * 1000 + epoch))}
        batch = collate(features, [train_idx[i] for i in epoch_batches[epoch][within]], accelerator.device)
        with accelerator.autocast():
            loss, stats = head(batch, embed, target_head)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(head.parameters(), config.grad_clip)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        step += 1
        history.append({"step": step, "loss": float(loss.detach()), **stats})
        bar.update(1)
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc0=f"{stats.get('acc_0', 0):.2f}")
        if step % config.save_every == 0 or step == total_steps:
            path = checkpoints / f"step-{step}"
            accelerator.save_state(str(path))
            if accelerator.is_main_process:
                (path / "trainer.json").write_text(json.dumps({
                    "step": step, "seconds": time.perf_counter() - started,
                    "history_first": (earlier + history)[:20], "history_last": history[-20:]}))
                for old in sorted(checkpoints.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[:-2]:
                    shutil.rmtree(old, ignore_errors=True)
    bar.close()
    head.eval()
    model = accelerator.unwrap_model(head).head.to(verifier.device)
    model.attach(embed, target_head)
    if not history and latest is not None:  # nothing left to train: report what the last run saw
        history = json.loads((latest / "trainer.json").read_text()).get("history_last", [])
    tail, head_of = history[-20:] or [{}], (earlier + history)[:20] or [{}]
    mean = lambda rows: {k: sum(h.get(k, 0.0) for h in rows) / len(rows) for k in rows[0]}  # noqa: E731
    summary = {"resumed_from": resumed_from, "history_first": mean(head_of), "steps": step, "seconds": time.perf_counter() - started, "total_steps": total_steps,
               "final": mean(tail),
               "train_config": asdict(config)}
    return model, summary
