"""The support matrix's model families: a tiny random config for each architecture of the installed transformers
that specdec claims (or refuses), and one function that runs a matrix cell.

A cell is a family under one mode (how a user would call specdec on it). Its outcome is ``exact`` (token-identical
to ``model.generate``, or for ``sampling`` distributed as it), ``refused`` (an :class:`UnsupportedModelError` whose
one-line message names the feature and the reason), ``differs`` (a bug), or ``hf-cannot`` (transformers' own
``generate`` fails on the config: not counted). ``tests/test_model_families.py`` asserts the outcomes;
``benchmarks/model_matrix.py`` runs that test and writes ``docs/models.md`` from what it recorded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Callable

import torch
import transformers as tf

VOCAB = 96
_COMMON = dict(vocab_size=VOCAB, initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_ATTN = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_LINEAR = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)
WINDOW = 8  # sliding windows far shorter than the cells' prompts plus output: the window really cuts


@dataclass(frozen=True)
class Family:
    """One architecture: its ``model_type``, config keywords and what kind of model it is (for the table)."""

    model_type: str
    kind: str  # "dense", "moe", "mla", "sliding", "hybrid", "recurrent"
    config: dict
    attention: str | None = None  # None: transformers' default kernel for the model (sdpa where it has one)

    def build(self, seed: int = 0) -> torch.nn.Module:
        """The tiny fp32 model, seeded."""
        torch.manual_seed(seed)
        config = tf.AutoConfig.for_model(self.model_type, **self.config, **_COMMON)
        extra = {} if self.attention is None else {"attn_implementation": self.attention}
        return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32, **extra).eval()


def _family(model_type: str, kind: str, **config) -> Family:
    return Family(model_type, kind, config)


FAMILIES: dict[str, Family] = {f.model_type: f for f in [
    _family("llama", "dense", **_ATTN),
    _family("mistral", "sliding", **dict(_ATTN, num_key_value_heads=1), sliding_window=WINDOW),
    _family("qwen2", "dense", **_ATTN),
    _family("qwen3", "dense", **_ATTN, head_dim=16),
    _family("gpt2", "dense", n_embd=64, n_layer=2, n_head=4),
    _family("gpt_neox", "dense", **{k: v for k, v in _ATTN.items() if k != "num_key_value_heads"}),
    _family("phi3", "dense", **_ATTN),
    _family("gemma", "dense", **dict(_ATTN, num_key_value_heads=1), head_dim=16),
    _family("olmo2", "dense", **_ATTN),
    _family("granite", "dense", **_ATTN),
    _family("smollm3", "dense", **_ATTN),
    _family("ernie4_5", "dense", **_ATTN, head_dim=16),
    _family("hunyuan_v1_dense", "dense", **_ATTN, head_dim=16),
    _family("seed_oss", "dense", **_ATTN, head_dim=16),
    _family("qwen3_moe", "moe", **_ATTN, head_dim=16, **_MOE, decoder_sparse_step=1),
    _family("mixtral", "moe", **_ATTN, num_local_experts=4, num_experts_per_tok=2),
    _family("ernie4_5_moe", "moe", **_ATTN, moe_num_experts=4, moe_k=2, moe_intermediate_size=32),
    _family("glm4_moe", "moe", **_ATTN, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            first_k_dense_replace=1, n_group=1, topk_group=1),
    _family("deepseek_v3", "mla", **dict(_ATTN, num_key_value_heads=4), moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1),
    _family("gemma2", "sliding", **_ATTN, head_dim=16, sliding_window=WINDOW),
    _family("gemma3_text", "sliding", **dict(_ATTN, num_hidden_layers=3), head_dim=16, sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
    _family("gpt_oss", "sliding", **_ATTN, head_dim=16, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2),
    _family("cohere2", "sliding", **dict(_ATTN, num_hidden_layers=4), head_dim=16, sliding_window=WINDOW),
    _family("exaone4", "sliding", **_ATTN, head_dim=16, sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"]),
    _family("qwen3_5_text", "hybrid", **dict(_ATTN, num_hidden_layers=4), head_dim=16, **_LINEAR),
    _family("qwen3_5_moe_text", "hybrid", **dict(_ATTN, num_hidden_layers=4), head_dim=16, **_LINEAR, **_MOE,
            shared_expert_intermediate_size=32),
    _family("qwen3_next", "hybrid", **dict(_ATTN, num_hidden_layers=4), head_dim=16, **_LINEAR, **_MOE,
            shared_expert_intermediate_size=32),
    _family("nemotron_h", "hybrid", **dict(_ATTN, num_hidden_layers=4), head_dim=16, mamba_num_heads=4, mamba_head_dim=16,
            ssm_state_size=16, n_groups=1),
    _family("falcon_h1", "hybrid", **_ATTN, head_dim=16, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
            mamba_d_state=16, mamba_n_groups=1),
    _family("granitemoehybrid", "hybrid", **_ATTN, layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_head=16,
            mamba_d_state=16, mamba_n_groups=1, mamba_expand=2, num_local_experts=4, num_experts_per_tok=2),
    _family("lfm2", "hybrid", **dict(_ATTN, num_hidden_layers=4),
            layer_types=["conv", "full_attention", "conv", "full_attention"]),
    _family("jamba", "hybrid", **_ATTN, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
            expert_layer_offset=1, num_experts=2, mamba_d_state=8, mamba_dt_rank=8),
    _family("mamba", "recurrent", hidden_size=64, num_hidden_layers=2, state_size=8),
    _family("falcon_mamba", "recurrent", hidden_size=64, num_hidden_layers=2, state_size=8),
]}


@dataclass(frozen=True)
class Mode:
    """One column of the matrix: how specdec is called, and whether the cell is slow (behind ``-m slow``)."""

    name: str
    help: str
    run: Callable[[torch.nn.Module], tuple[torch.Tensor, torch.Tensor]]  # (specdec's output, generate's output)
    slow: bool = False


def _prompt(length: int = 14, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A prompt that repeats itself (prompt lookup finds drafts) and is longer than :data:`WINDOW`."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    base = torch.randint(3, VOCAB, (batch, 5), generator=gen, device="cpu")
    return base.repeat(1, length // 5 + 1)[:, :length]


def _ragged(lengths: tuple[int, ...] = (14, 9, 11)) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long, device="cpu")
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = _prompt(n, seed=row)[0]
        mask[row, width - n:] = 1
    return ids, mask


def _greedy(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None = None, new: int = 12,
            pads: bool = False, **spec) -> tuple[torch.Tensor, torch.Tensor]:
    import specdec

    extra = {} if mask is None else {"attention_mask": mask}
    expected = model.generate(ids, max_new_tokens=new, do_sample=False, min_new_tokens=new, **extra)
    fast = specdec.SpeculativeModel(model, **spec)
    if pads:  # the CUDA-graph layout (passes padded to fixed widths), which CPU inductor does not need
        fast.verifier.static.pads = True
    got = fast.generate(ids, max_new_tokens=new, do_sample=False, min_new_tokens=new, **extra)
    if spec.get("compile_verifier") and (fast.verifier.static.failed is not None or not fast.verifier.static.passes):
        raise AssertionError(f"the compiled verifier did not run: {fast.verifier.static.failed}")
    return got, expected


MODES: dict[str, Mode] = {m.name: m for m in [
    Mode("chain", "greedy, prompt lookup, k=3, batch 1",
         lambda model: _greedy(model, _prompt(), draft="prompt-lookup", num_draft_tokens=3)),
    Mode("self-copy", "greedy, the model's own bf16 copy as drafter, k=3, batch 1",
         lambda model: _greedy(model, _prompt(), draft="self:bf16", num_draft_tokens=3)),
    Mode("ragged", "greedy, bf16 self-copy, left-padded batch of 3",
         lambda model: _greedy(model, *_ragged(), draft="self:bf16", num_draft_tokens=3)),
    Mode("tree", 'greedy, bf16 self-copy, tree="static"',
         lambda model: _greedy(model, _prompt(), draft="self:bf16", tree="static")),
    Mode("compiled", "greedy, prompt lookup, left-padded batch of 3, compile_verifier with dynamo's eager backend "
         "(the static passes inductor would get) padded to one width as for CUDA graphs",
         lambda model: _greedy(model, *_ragged(), draft="prompt-lookup", num_draft_tokens=3, pads=True,
                               compile_verifier={"backend": "eager"})),
    Mode("inductor", "greedy, prompt lookup, batch 1, compile_verifier=True (inductor on a CPU)",
         lambda model: _greedy(model, _prompt(), new=6, draft="prompt-lookup", num_draft_tokens=3,
                               compile_verifier=True), slow=True),
]}
SAMPLING = "sampling"  # the law's column: a chi-square against the verifier's own distribution (test_model_families)


def record(family: str, mode: str, outcome: str, detail: str = "") -> None:
    """Append one cell's outcome to ``$SPECDEC_MATRIX_JSON`` (the matrix script's run) when it is set."""
    path = os.environ.get("SPECDEC_MATRIX_JSON")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"family": family, "kind": FAMILIES[family].kind, "mode": mode, "outcome": outcome,
                                  "detail": detail}) + "\n")
