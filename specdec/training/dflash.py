"""``specdec train-head --kind dflash``: a DFlash block drafter (:mod:`specdec.heads.dflash`) trained on the head
pipeline's verifier features (the named layers' outputs and the verifier's greedy token at each position).

Each step takes a few training sequences; in each, up to ``anchors`` response positions are drawn. The block at
anchor ``a`` is ``[token a, mask x (B - 1)]`` at positions ``a .. a + B - 1``: it sees the projected features of
tokens ``0 .. a - 1`` (what the drafter's cache holds when it drafts after committing token ``a``, whose own features
the verifier has not computed yet) and itself, without a causal mask, as :meth:`DFlashModel.draft` does. Position
``j`` learns the verifier's greedy token at ``a + j`` (``top[a + j - 1]``), weighted ``exp(-(j - 1) / gamma)``
(DFlash's decay: a block is accepted only up to its first miss, so early positions weigh most). The verifier's
embedding and LM head are shared and stay frozen. The run is resumable from its last checkpoint.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config

from specdec.heads.dflash import DFlashModel, DFlashSettings
from specdec.training.checkpoints import write_directory
from specdec.training.features import FeatureSet


@dataclass
class DFlashRecipe:
    """What a DFlash run adds to :class:`~specdec.training.train.TrainConfig`."""

    block_size: int = 8
    layers: int = 1
    anchors: int = 16  # blocks drawn per sequence
    sequences: int = 4  # sequences per optimizer step
    gamma: float = 4.0  # position weights exp(-(j - 1) / gamma)


def target_layers(verifier_config: Any) -> list[int]:
    """The verifier layers (0-indexed) whose outputs the drafter reads: low, middle and high, as z-lab's spread."""
    n = verifier_config.get_text_config().num_hidden_layers
    return sorted({min(1, n - 1), n // 2, max(0, n - 3)})


def new_dflash(verifier: Any, recipe: DFlashRecipe, mask_token_id: int, seed: int = 0) -> DFlashModel:
    """A freshly initialised DFlash drafter in the verifier's hidden size, on its device (fp32 for training)."""
    c = verifier.config.get_text_config()
    heads = c.num_attention_heads
    rope = dict(getattr(c, "rope_parameters", None) or {})
    config = Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=recipe.layers, num_attention_heads=heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads, rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
        max_position_embeddings=c.max_position_embeddings,
        rope_theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))))
    config.dflash_config = {"target_layer_ids": target_layers(verifier.config), "block_size": recipe.block_size,
                            "mask_token_id": int(mask_token_id)}
    torch.manual_seed(seed)
    model = DFlashModel(config, DFlashSettings.of(config))
    return model.to(device=verifier.device, dtype=torch.float32)


def block_hidden(model: DFlashModel, features: torch.Tensor, block: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """Final hidden states ``[m, B, H]`` of ``m`` blocks (embeddings ``block [m, B, H]``) at ``anchors [m]`` over
    one sequence's features ``[T, F]``: block ``i`` sees context positions ``< anchors[i]`` and itself."""
    m, width = block.shape[:2]
    device = block.device
    ctx = model.hidden_norm(model.fc(features.to(block.dtype)))[None]  # [1, T, H]
    total = ctx.shape[1]
    cos_c, sin_c = model.rotary_emb(ctx, torch.arange(total, device=device)[None])
    cos_b, sin_b = model.rotary_emb(block, anchors[:, None] + torch.arange(width, device=device))
    seen = torch.arange(total, device=device)[None, :] < anchors[:, None]  # [m, T]

    def context(i: int, layer: Any) -> tuple[torch.Tensor, torch.Tensor]:  # one sequence's, for all its blocks
        k_ctx, v_ctx = layer.self_attn.key_values(ctx, cos_c, sin_c)
        return k_ctx.expand(m, -1, -1, -1), v_ctx.expand(m, -1, -1, -1)

    return model.blocks(block, cos_b, sin_b, seen, context)


def block_loss(model: DFlashModel, sample: dict[str, Any], anchors: list[int], embed: torch.nn.Module,
               lm_head: torch.nn.Module, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weighted cross-entropy of one sequence's blocks at ``anchors``, and per block position ``1 .. B - 1`` the
    number of targets and of greedy hits (teacher-forced)."""
    s = model.settings
    device = next(model.parameters()).device
    ids, top = sample["input_ids"].to(device), sample["top"].to(device)
    n, width = len(ids), s.block_size
    at = torch.tensor(anchors, dtype=torch.long, device=device)
    tokens = torch.full((len(anchors), width), s.mask_token_id, dtype=torch.long, device=device)
    tokens[:, 0] = ids[at]
    hidden = block_hidden(model, sample["hidden"][: max(anchors)].to(device), embed(tokens).float(), at)
    logits = model.logits(hidden[:, 1:], lm_head).float()  # position j predicts the token at a + j
    source = at[:, None] + torch.arange(width - 1, device=device)  # top[a + j - 1]
    valid = source < n - 1  # the last token's prediction lies past the sequence's text
    targets = top[source.clamp(max=n - 1)]
    weights = torch.exp(-torch.arange(width - 1, device=device, dtype=torch.float32) / gamma)[None].expand_as(source)
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    w = weights * valid
    loss = (ce * w).sum() / w.sum().clamp(min=1e-6)
    hits = ((logits.argmax(-1) == targets) & valid).sum(0)
    return loss, valid.sum(0), hits


def _anchors(sample: dict[str, Any], count: int, rng: random.Random) -> list[int]:
    """Up to ``count`` distinct response positions (at least one token of context before each)."""
    start, end = max(1, int(sample["prompt_length"])), len(sample["input_ids"]) - 1
    if end <= start:
        return []
    return sorted(rng.sample(range(start, end), min(count, end - start)))


def evaluate(model: DFlashModel, features: FeatureSet, indices: list[int], embed: Any, lm_head: Any,
             recipe: DFlashRecipe) -> dict[str, Any]:
    """Teacher-forced greedy accuracy per block position on ``indices`` (fixed anchors), and the loss."""
    rng = random.Random(12345)
    totals = torch.zeros(recipe.block_size - 1, device="cpu")
    hits = torch.zeros(recipe.block_size - 1, device="cpu")
    losses = []
    with torch.no_grad():
        for i in indices:
            sample = features[i]
            anchors = _anchors(sample, recipe.anchors, rng)
            if anchors:
                loss, n, h = block_loss(model, sample, anchors, embed, lm_head, recipe.gamma)
                losses.append(float(loss))
                totals, hits = totals + n.cpu(), hits + h.cpu()
    return {"loss": round(sum(losses) / max(1, len(losses)), 4),
            "accuracy_by_position": [round(float(h / t), 4) if t else None for h, t in zip(hits, totals)]}


def train_dflash(verifier: Any, features: FeatureSet, train_idx: list[int], val_idx: list[int], out: Path,
                 recipe: DFlashRecipe, *, epochs: float, lr: float, warmup: int, grad_clip: float, seed: int,
                 save_every: int, mask_token_id: int, log: Any = print) -> tuple[DFlashModel, dict[str, Any]]:
    """Train (or resume) a DFlash drafter; checkpoints go to ``out/work/dflash-checkpoint`` (whole or absent)."""
    embed, lm_head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    for p in (*embed.parameters(), *lm_head.parameters()):
        p.requires_grad_(False)
    model = new_dflash(verifier, recipe, mask_token_id, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    steps = max(1, math.ceil(epochs * len(train_idx) / recipe.sequences))
    checkpoint = out / "work" / "dflash-checkpoint"
    state = {"step": 0, "seconds": 0.0, "losses": []}
    if (checkpoint / "state.json").is_file():
        state = json.loads((checkpoint / "state.json").read_text())
        saved = torch.load(checkpoint / "trainer.pt", weights_only=True, map_location=verifier.device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        log(f"resuming DFlash training at step {state['step']} of {steps}")
    order = list(train_idx)
    started = time.perf_counter() - state["seconds"]
    model.train()
    while state["step"] < steps:
        step = state["step"]
        rng = random.Random(seed * 1_000_003 + step)  # the same draws on a resumed run
        factor = min(1.0, (step + 1) / max(1, warmup)) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in optimizer.param_groups:
            group["lr"] = lr * factor
        optimizer.zero_grad()
        total = 0.0
        for n in range(recipe.sequences):
            sample = features[order[(step * recipe.sequences + n) % len(order)]]
            anchors = _anchors(sample, recipe.anchors, rng)
            if anchors:
                loss = block_loss(model, sample, anchors, embed, lm_head, recipe.gamma)[0] / recipe.sequences
                loss.backward()
                total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        state["step"], state["seconds"] = step + 1, time.perf_counter() - started
        state["losses"].append(round(total, 4))
        if state["step"] % save_every == 0 or state["step"] == steps:
            _save_checkpoint(checkpoint, model, optimizer, state)
            log(f"step {state['step']}/{steps} loss {total:.4f} ({state['seconds']:.0f} s)")
    model.eval()
    summary = {"steps": state["step"], "seconds": state["seconds"], "first_loss": state["losses"][0],
               "final_loss": round(sum(state["losses"][-20:]) / len(state["losses"][-20:]), 4),
               "validation": evaluate(model, features, val_idx, embed, lm_head, recipe)}
    return model, summary


def _save_checkpoint(directory: Path, model: DFlashModel, optimizer: Any, state: dict[str, Any]) -> None:
    def write(tmp: Path) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp / "trainer.pt")
        (tmp / "state.json").write_text(json.dumps(state))

    write_directory(directory, write)


def write_dflash(model: DFlashModel, directory: Path, card: str, dtype: torch.dtype) -> None:
    """Write the drafter into ``directory`` in z-lab's layout (``config.json`` with ``dflash_config``,
    ``model.safetensors``) with its card (the pipeline moves the files into place whole)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.update(architectures=["DFlashDraftModel"], dflash_config=model.config.dflash_config)
    (directory / "config.json").write_text(json.dumps(config, indent=1, default=str))
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()
             if not k.startswith("rotary_emb")}
    save_file(state, str(directory / "model.safetensors"))
    (directory / "README.md").write_text(card)
