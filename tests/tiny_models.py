"""Tiny randomly initialised causal LMs of several architectures, built from configs (never downloaded).

``initializer_range`` is raised from the usual 0.02 so that logits are spread out: with near-uniform
logits almost every greedy step is a near-tie, and a test of token identity would then measure float
rounding rather than the engine.
"""

from __future__ import annotations

import copy
import string
from pathlib import Path

import torch
import transformers as tf

VOCAB = 96
COMMON = dict(vocab_size=VOCAB, initializer_range=0.3, bos_token_id=1, eos_token_id=2, pad_token_id=0)

CONFIGS = {
    "llama": lambda: tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, **COMMON),
    "mistral": lambda: tf.MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=1, sliding_window=16, **COMMON),
    "qwen2": lambda: tf.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, **COMMON),
    "qwen3": lambda: tf.Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=32, **COMMON),
    "gpt2": lambda: tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, **COMMON),
    "gpt_neox": lambda: tf.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                         **COMMON),
    "phi3": lambda: tf.Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, **COMMON),
    "gemma": lambda: tf.GemmaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=1, head_dim=16, **COMMON),
}


def make_model(arch: str, seed: int = 0) -> torch.nn.Module:
    """A tiny fp32 model of ``arch`` with a fixed seed."""
    torch.manual_seed(seed)
    config = CONFIGS[arch]()
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return model


def perturbed_copy(model: torch.nn.Module, noise: float, seed: int = 123) -> torch.nn.Module:
    """A drafter that agrees with ``model`` often but not always: the same weights plus Gaussian noise."""
    draft = copy.deepcopy(model)
    gen = torch.Generator(device="cpu").manual_seed(seed)  # on the CPU, so a CUDA copy gets the same noise
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, device="cpu").to(p.device) * noise
                   * (p.std() if p.numel() > 1 else 1.0))
    return draft


def left_padded(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A ragged batch of random prompts of ``lengths`` tokens, left padded with 0: ``(input_ids, attention_mask)``."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    width = max(lengths)
    ids = torch.zeros((len(lengths), width), dtype=torch.long, device="cpu")
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        ids[r, width - n:] = torch.randint(3, VOCAB, (n,), generator=gen, device="cpu")
        mask[r, width - n:] = 1
    return ids, mask


def char_tokenizer():
    """A character-level fast tokenizer within the tiny vocabulary (for CLI and pipeline tests that need one)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in string.ascii_letters + string.digits + " .,?!'-:;()":
        vocab.setdefault(c, len(vocab))
    assert len(vocab) <= VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def train_inputs(root: Path, prompts: int = 8, models: dict[str, int] | None = None) -> Path:
    """What a ``train-head`` test runs on, under ``root``: tiny Llama verifiers (``{directory name: seed}``, default
    ``{"m": 0}``) saved with the character tokenizer, and ``data.jsonl`` with ``prompts`` prompts."""
    import json

    for name, seed in (models or {"m": 0}).items():
        make_model("llama", seed).save_pretrained(root / name)
        char_tokenizer().save_pretrained(root / name)
    rows = [{"id": f"p{i}", "group": "g", "prompt": f"Tell me about {i} cats."} for i in range(prompts)]
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def tiny_head_features(model: torch.nn.Module, directory: Path, samples: int = 6):
    """Cached verifier features of ``samples`` random sequences (5 prompt + 12 response tokens) for training
    an EAGLE-3 head on ``model``: ``(FeatureSet, HeadConfig)``."""
    from specdec.heads.config import HeadConfig
    from specdec.training.features import FeatureSet, extract_features

    g = torch.Generator().manual_seed(0)
    rows = [{"id": str(i), "prompt_ids": torch.randint(3, 96, (5,), generator=g).tolist(),
             "response_ids": torch.randint(3, 96, (12,), generator=g).tolist()} for i in range(samples)]
    config = HeadConfig.for_verifier(model.config, "eagle3")
    return FeatureSet(extract_features(model, rows, directory, config.aux_layers, progress=False)), config


WINDOW = 8  # the sliding configs' window (and llama4's chunk): far shorter than their tests' prompts plus output
_SLIDING_ATTN = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, **COMMON)

#: sliding-window (and chunked) models, apart from CONFIGS (whose every entry other tests run on every path)
SLIDING_CONFIGS = {
    "mistral": lambda: tf.MistralConfig(num_hidden_layers=2, sliding_window=WINDOW, **_SLIDING_ATTN),
    "qwen2": lambda: tf.Qwen2Config(num_hidden_layers=3, use_sliding_window=True, sliding_window=WINDOW,
                                    max_window_layers=1, **_SLIDING_ATTN),  # layers: full, sliding, sliding
    # gemma: 0.1, since at 0.3 its scaled embeddings decide every argmax alone (the window would change no token)
    "gemma2": lambda: tf.Gemma2Config(num_hidden_layers=2, head_dim=16, sliding_window=WINDOW,
                                      **dict(_SLIDING_ATTN, initializer_range=0.1)),
    "gemma3_text": lambda: tf.Gemma3TextConfig(num_hidden_layers=3, head_dim=16, sliding_window=WINDOW,  # sliding, sliding, full
                                               sliding_window_pattern=3, **dict(_SLIDING_ATTN, initializer_range=0.1)),
    "gpt_oss": lambda: tf.GptOssConfig(num_hidden_layers=2, head_dim=16, sliding_window=WINDOW, num_local_experts=4,
                                       num_experts_per_tok=2, **_SLIDING_ATTN),
    "llama4_text": lambda: tf.Llama4TextConfig(num_hidden_layers=2, head_dim=16, attention_chunk_size=WINDOW,
                                               intermediate_size_mlp=128, num_local_experts=2, **_SLIDING_ATTN),
}


def make_sliding_model(arch: str, seed: int = 0, attn: str | None = None) -> torch.nn.Module:
    """A tiny fp32 model of ``SLIDING_CONFIGS[arch]`` with a fixed seed (``attn``: its attention implementation)."""
    torch.manual_seed(seed)
    config = SLIDING_CONFIGS[arch]()
    extra = {} if attn is None else {"attn_implementation": attn}
    return tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32, **extra).eval()
