"""Export of a trained head to other layouts: speculators' ``eagle3`` (what vLLM serves as a speculators
model). The public EAGLE-3 layout specdec saves already serves in vLLM and SGLang as it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from specdec.errors import SpecdecError
from specdec.heads import speculators
from specdec.heads.checkpoint import load_head, read_config


class HeadExportError(SpecdecError, ValueError):
    """A head that loads but that speculators' eagle3 layout cannot hold (an EAGLE-1/2 head, repeated layer ids)."""


def export_speculators(head_dir: str | Path, out_dir: str | Path, verifier: Any, *,
                       verifier_name_or_path: str | None = None, speculative_tokens: int = 3,
                       dtype: torch.dtype | None = None) -> Path:
    """Write the EAGLE-3 head in ``head_dir`` (any layout :func:`~specdec.heads.load_head` reads) to ``out_dir`` in
    the speculators layout, for ``speculators`` and vLLM.

    The head is loaded (and so checked) against ``verifier`` first; its token embedding is saved with it (the
    verifier's unless the head has its own), as speculators saves its heads. ``verifier_name_or_path`` is recorded
    for speculators, whose loader reads the verifier's config and weights from there (give a hub id or a local
    checkpoint directory). ``dtype``: the
    weights' (default: the dtype ``head_dir``'s config.json names, else bfloat16). Files are written under
    temporary names and renamed, so an interrupted export leaves no half-written file.
    """
    head_dir, out_dir = Path(head_dir), Path(out_dir)
    head = load_head(head_dir, verifier)  # every refusal of a broken head happens here, before anything is written
    if head.config.kind != "eagle3":
        raise HeadExportError(f"draft head {head_dir}: speculators' eagle3 layout holds EAGLE-3 heads; this is an "
                         "EAGLE-1/2 head")
    aux = head.config.aux_layers
    if len(set(aux)) != len(aux):
        raise HeadExportError(f"draft head {head_dir}: it reads verifier layers {list(aux)}; speculators' layout needs "
                         "distinct layer ids (a verifier this shallow cannot be exported)")
    if dtype is None:
        named = read_config(head_dir / "config.json").get("torch_dtype") or "bfloat16"
        dtype = getattr(torch, str(named), None)
        dtype = dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.bfloat16
    state = {}
    for key, value in head.state_dict().items():
        if key.startswith("rotary_emb."):
            continue
        value = value.detach().to("cpu")
        key = "layers.0." + key.removeprefix("midlayer.") if key.startswith("midlayer.") else key
        state[key] = (value if key in ("d2t", "t2d") else value.to(dtype)).contiguous()
    if "embed_tokens.weight" not in state:
        state["embed_tokens.weight"] = head.embed(torch.arange(head.config.vocab_size, device=head.fc.weight.device)
                                                  ).detach().to("cpu", dtype).contiguous()
    if head.config.draft_vocab_size == head.config.vocab_size:  # no draft vocabulary: speculators keeps no maps
        state.pop("d2t", None)
        state.pop("t2d", None)
    name = verifier_name_or_path or getattr(verifier.config, "_name_or_path", None) or None
    archs = list(getattr(verifier.config, "architectures", None) or [type(verifier).__name__])
    spec = speculators.speculators_config(head.config, dtype=str(dtype).removeprefix("torch."),
                                          verifier_name_or_path=name, verifier_architectures=archs,
                                          speculative_tokens=speculative_tokens)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(out_dir / "model.safetensors")
    tmp = out_dir / "config.json.tmp"
    tmp.write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out_dir / "config.json")
    return out_dir
