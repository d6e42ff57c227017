"""Qwen3.5 / Qwen3.6 / Qwen3-Next multi-token-prediction layers, read from the checkpoint's ``mtp.*`` tensors.

transformers 5.24 drops these weights when it loads the model (``_keys_to_ignore_on_load_unexpected = ["^mtp.*"]``)
and its generic ``MtpModel`` expects DeepSeek's layout, so specdec reads them itself (docs/mtp.md). The layout, as
the checkpoints ship it and vLLM / SGLang read it:

- ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``: RMSNorms (the model's own ``(1 + w)`` kind);
- ``mtp.fc`` ``[H, 2H]``: the input ``fc(cat[norm_e(embed(x_{t+1})), norm_h(h_t)])``, ``h_t`` the model's final
  normed hidden state (or, recursively, this module's previous output);
- ``mtp.layers.{i}.*``: a full-attention decoder layer of the model's own class (gated ``q_proj``, ``q_norm`` /
  ``k_norm``; dense or MoE), with its own KV cache;
- ``mtp.norm``: the output norm; the logits are the model's ``lm_head`` of the normed output, which is also what a
  recursive step reads as its hidden state. The embedding and ``lm_head`` are the model's.

:class:`QwenMtp` exposes the members :class:`~specdec.drafters.mtp.MtpDrafter` reads of transformers' ``MtpModel``
(``layers``, ``embed_tokens``, ``rotary_emb``, ``_project_to_logits``...), so the drafter (chains of any k, ragged
batches, trees, sampling) is the same for both layouts.
"""

from __future__ import annotations

import copy
import json
import os
import re
from typing import Any

import torch

# model types whose checkpoints carry Qwen-style ``mtp.*`` layers
QWEN_MTP_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"})
_PREFIX = "mtp."


def is_qwen_mtp(config: Any) -> bool:
    """Whether ``config``'s model keeps Qwen-style MTP layers (``mtp.*``) in its checkpoint."""
    return getattr(config, "model_type", None) in QWEN_MTP_TYPES or \
        getattr(_text(config), "model_type", None) in QWEN_MTP_TYPES


def qwen_mtp_layer_count(config: Any) -> int:
    """``mtp_num_hidden_layers`` of ``config``'s text config (0 when it declares none)."""
    return int(getattr(_text(config), "mtp_num_hidden_layers", 0) or 0)


def _text(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def checkpoint_tensors(source: str, prefix: str = _PREFIX) -> dict[str, torch.Tensor]:
    """The tensors named ``prefix*`` in the safetensors files of checkpoint ``source`` (a local directory, or a model
    id already in the Hugging Face cache: nothing is downloaded); empty if it holds none."""
    from safetensors import safe_open

    directory = source if os.path.isdir(source) else _cached_snapshot(source)
    if directory is None:
        return {}
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = sorted({file for key, file in weight_map.items() if key.startswith(prefix)})
    else:
        files = sorted(name for name in os.listdir(directory) if name.endswith(".safetensors"))
    out: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(os.path.join(directory, name), framework="pt") as f:
            for key in f.keys():
                if key.startswith(prefix):
                    out[key] = f.get_tensor(key)
    return out


def _cached_snapshot(model_id: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model_id, local_files_only=True, allow_patterns=["*.safetensors", "*.json"])
    except Exception:  # not a hub id, or not in the cache: there is nothing to read
        return None


class _Step(torch.nn.Module):
    """MTP step ``i``: the shared input projection and norms around decoder block ``i`` (what ``MtpModel.layers[i]``
    is called as: ``(embeds, prev, position_embeddings=, attention_mask=, position_ids=, cache=)``)."""

    def __init__(self, owner: QwenMtp, block: torch.nn.Module) -> None:
        super().__init__()
        self.fc, self.pre_fc_norm_embedding, self.pre_fc_norm_hidden, self.norm = \
            owner.fc, owner.pre_fc_norm_embedding, owner.pre_fc_norm_hidden, owner.norm
        self.block = block

    def forward(self, embeds: torch.Tensor, prev: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        hidden = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(prev)], dim=-1))
        out = self.block(hidden, **kwargs)
        return self.norm(out[0] if isinstance(out, tuple) else out)


class QwenMtp(torch.nn.Module):
    """A Qwen3.5 / Qwen3-Next model's MTP layers (``mtp.*``), sharing its embedding, rotary embedding and LM head."""

    use_shared_post_norm = False  # every step ends in ``mtp.norm`` itself
    has_per_layer_rope = False

    def __init__(self, model: Any, count: int) -> None:
        super().__init__()
        decoder = model.get_decoder()
        text = _text(model.config)
        hidden = text.hidden_size
        norm_cls, eps = type(decoder.norm), text.rms_norm_eps
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden, self.norm = (norm_cls(hidden, eps=eps) for _ in range(3))
        layer_config = copy.deepcopy(text)
        layer_config.layer_types, layer_config.num_hidden_layers = ["full_attention"], 1
        block_cls = type(next(layer for layer in decoder.layers if hasattr(layer, "self_attn")))
        self.blocks = torch.nn.ModuleList(block_cls(layer_config, 0) for _ in range(count))
        self.layers = torch.nn.ModuleList(_Step(self, block) for block in self.blocks)
        self.config = copy.copy(text)
        self.config.layer_types = ["full_attention"] * count
        # the model's own modules, not registered here (not ours to save or move)
        self.__dict__["embed_tokens"] = model.get_input_embeddings()
        self.__dict__["rotary_emb"] = decoder.rotary_emb
        self.__dict__["lm_head"] = model.get_output_embeddings()

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def _project_to_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_checkpoint(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load ``mtp.*`` tensors (per-expert MoE weights fused into transformers' layout); strict: a tensor missing,
        left over or of another shape raises ``RuntimeError``."""
        own = {name: p for name, p in self.state_dict().items() if not name.startswith("layers.")}  # steps share them
        state = {re.sub(r"^layers\.", "blocks.", key[len(_PREFIX):]): value for key, value in tensors.items()}
        state = _fuse_experts(state, set(own))
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        if missing or unexpected:
            raise RuntimeError(f"the mtp.* tensors do not fit the model's layer: missing {missing[:4]}, "
                               f"unexpected {unexpected[:4]}")
        with torch.no_grad():
            for name, value in state.items():
                own[name].copy_(value.to(own[name].dtype))


def _fuse_experts(state: dict[str, torch.Tensor], wanted: set[str]) -> dict[str, torch.Tensor]:
    """Per-expert ``...experts.{e}.{gate,up,down}_proj.weight`` (Qwen3-Next's checkpoints) as transformers' fused
    ``...experts.gate_up_proj [E, 2I, H]`` and ``...experts.down_proj [E, H, I]``, where the module wants those."""
    experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out = {}
    for key, value in state.items():
        match = re.match(r"(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$", key)
        if match and f"{match[1]}.gate_up_proj" in wanted:
            experts.setdefault(match[1], {}).setdefault(int(match[2]), {})[match[3]] = value
        else:
            out[key] = value
    for base, by_expert in experts.items():
        order = [by_expert[e] for e in sorted(by_expert)]
        out[f"{base}.gate_up_proj"] = torch.stack([torch.cat([e["gate_proj"], e["up_proj"]]) for e in order])
        out[f"{base}.down_proj"] = torch.stack([e["down_proj"] for e in order])
    return out


def load_qwen_mtp(model: Any) -> QwenMtp:
    """``model``'s MTP layers from its checkpoint (``config.name_or_path``), on the device and in the dtype of its
    last decoder layer. Raises ``LookupError`` (with the reason) where the config declares none or the checkpoint
    holds none, ``RuntimeError`` where they do not fit the model's own layer."""
    source = getattr(model.config, "name_or_path", "") or ""
    tensors = checkpoint_tensors(source) if source else {}
    if not tensors:
        raise LookupError("its checkpoint holds no mtp.* tensors" if source else
                          "it was not loaded from a checkpoint (config.name_or_path is empty)")
    indices = {int(m[1]) for key in tensors if (m := re.match(r"mtp\.layers\.(\d+)\.", key))}
    count = qwen_mtp_layer_count(model.config) or len(indices)
    if indices != set(range(count)):
        raise LookupError(f"its checkpoint holds mtp.layers {sorted(indices)}, the config declares {count}")
    last = model.get_decoder().layers[-1]
    weight = next(last.parameters())
    mtp = QwenMtp(model, count).to(device=weight.device, dtype=weight.dtype)
    mtp.load_checkpoint(tensors)
    return mtp.eval()
