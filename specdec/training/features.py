"""Verifier features for head training, cached to disk in shards (safetensors), resumable shard by shard.

A shard holds consecutive samples, concatenated: ``input_ids [T]``, ``offsets [n + 1]``,
``prompt_lengths [n]``, ``hidden [T, len(layers) * H]`` (the hidden states the head reads, bf16),
``final [T, H]`` (the verifier's final normed state, whose ``lm_head`` gives the training targets, bf16)
and ``top [T]`` (the verifier's greedy token at each position).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from specdec.training.prompts import TrainHeadError, write_atomic

FEATURE_DTYPE = torch.bfloat16  # range of fp32 (hidden states have outliers), half the bytes


def _shard_path(directory: Path, index: int) -> Path:
    return directory / f"features-{index:05d}.safetensors"


@torch.inference_mode()
def verifier_features(model: Any, ids: torch.Tensor, mask: torch.Tensor | None, layers: tuple[int, ...]
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a head learns from, for right-padded ``ids [B, T]``: the hidden states it reads (``layers`` of
    ``output_hidden_states``, concatenated), the final normed state (its targets go through ``lm_head``) and
    the verifier's greedy token at each position."""
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    final = out.hidden_states[model.config.get_text_config().num_hidden_layers]
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1), final, out.logits.argmax(-1)


def extract_features(model: Any | Callable[[], Any], samples: list[dict[str, Any]], directory: Path, layers: tuple[int, ...], *,
                     shard_samples: int = 256, batch_size: int = 8, progress: bool = True) -> list[Path]:
    """Run the verifier over prompt + response of every sample and write the features it reads.

    Existing shards are kept (resume), provided ``index.json`` says they were made from the same samples
    and layers; otherwise a one-line :class:`~specdec.training.prompts.TrainHeadError`. An index that cannot be
    read says nothing about its shards: they are computed again. ``model`` may be a zero-argument callable that
    makes the model: it is called only if a shard is missing (a resume with every shard made builds no copy).
    """
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    index = {"layers": list(layers), "shard_samples": shard_samples, "samples": [s["id"] for s in samples]}
    index_path = directory / "index.json"
    if index_path.is_file():
        try:
            recorded = json.loads(index_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            recorded = None
            for stale in directory.glob("features-*.safetensors"):
                stale.unlink()
        if recorded is not None and recorded != index:
            what = "layers" if recorded.get("layers") != index["layers"] else "samples"
            raise TrainHeadError(f"{directory} holds features of other {what}; use --overwrite to start afresh")
    write_atomic(index_path, json.dumps(index))
    shards = [samples[i:i + shard_samples] for i in range(0, len(samples), shard_samples)]
    paths = []
    with tqdm(total=len(samples), desc="verifier features", disable=not progress) as bar:
        for number, shard in enumerate(shards):
            path = _shard_path(directory, number)
            paths.append(path)
            if path.is_file():
                bar.update(len(shard))
                continue
            if not isinstance(model, torch.nn.Module):
                model = model()
            device = model.device
            keys = ("input_ids", "hidden", "final", "top")
            done: list[dict[str, torch.Tensor] | None] = [None] * len(shard)
            # batches of similar lengths (padding is compute thrown away); the shard keeps the samples' order
            order = sorted(range(len(shard)), key=lambda j: len(shard[j]["prompt_ids"]) + len(shard[j]["response_ids"]))
            for start in range(0, len(order), batch_size):
                batch = order[start:start + batch_size]
                rows = [shard[j]["prompt_ids"] + shard[j]["response_ids"] for j in batch]
                width = max(len(r) for r in rows)
                ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
                mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
                for b, r in enumerate(rows):  # right padding: causal attention leaves real positions exact
                    ids[b, :len(r)] = torch.tensor(r, dtype=torch.long, device=device)
                    mask[b, :len(r)] = 1
                hidden, final, top = verifier_features(model, ids, mask, layers)
                for b, (j, r) in enumerate(zip(batch, rows)):
                    n = len(r)
                    done[j] = {"input_ids": ids[b, :n].cpu(), "hidden": hidden[b, :n].to("cpu", FEATURE_DTYPE),
                               "final": final[b, :n].to("cpu", FEATURE_DTYPE), "top": top[b, :n].cpu()}
                bar.update(len(batch))
            parts = {k: [d[k] for d in done] for k in keys}
            lengths = torch.tensor([len(t) for t in parts["input_ids"]], dtype=torch.long, device="cpu")
            tensors = {k: torch.cat(v).contiguous() for k, v in parts.items()}
            tensors["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long, device="cpu"), lengths.cumsum(0)])
            tensors["prompt_lengths"] = torch.tensor([len(s["prompt_ids"]) for s in shard], dtype=torch.long, device="cpu")
            tmp = path.with_name(f".{path.name}.tmp")
            save_file(tensors, str(tmp))
            tmp.replace(path)  # a shard is either complete or absent
    return paths


class FeatureSet:
    """The samples of a feature directory: ``len()``, and ``[i]`` gives one sample's tensors.

    Shards are memory-mapped, not loaded: a sample's slices are read when asked for (the operating system
    keeps what is used in its page cache), so millions of training tokens (several GB of features) need no
    more memory than the batches being trained on. ``input_ids``, ``top`` and the prompt lengths (small)
    are held in memory.
    """

    def __init__(self, paths: list[Path]) -> None:
        from safetensors import safe_open

        self._shards = [safe_open(str(path), framework="pt", device="cpu") for path in paths]
        self._index: list[tuple[int, int, int]] = []  # per sample: shard, start, end
        self._small: list[dict[str, Any]] = []
        for number, shard in enumerate(self._shards):
            offsets = shard.get_tensor("offsets").tolist()
            ids, top = shard.get_tensor("input_ids"), shard.get_tensor("top")
            for i, p in enumerate(shard.get_tensor("prompt_lengths").tolist()):
                a, b = offsets[i], offsets[i + 1]
                self._index.append((number, a, b))
                self._small.append({"input_ids": ids[a:b], "top": top[a:b], "prompt_length": p})

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        number, a, b = self._index[i]
        shard = self._shards[number]
        return {**self._small[i], "hidden": shard.get_slice("hidden")[a:b], "final": shard.get_slice("final")[a:b]}

    def small(self, i: int) -> dict[str, Any]:
        """Sample ``i``'s token ids, greedy targets and prompt length, without reading its features."""
        return self._small[i]
