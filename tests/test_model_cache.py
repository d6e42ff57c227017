"""The converted copy of a GGUF model (specdec.model_cache): keyed by content and dtype, written atomically,
read instead of the GGUF file, and equal to what the GGUF load builds."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec import model_cache


def _tiny_model_and_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(62)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(cfg).eval(), tok


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(model_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(model_cache.SWITCH_ENV, raising=False)
    return tmp_path / "cache"


def test_the_key_follows_content_and_dtype_not_the_name(tmp_path, cache_dir):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    a.write_bytes(b"same bytes")
    b.write_bytes(b"same bytes")
    c.write_bytes(b"other bytes")
    key = lambda p, dt: model_cache.copy_dir(p, dt).name.split("-", 1)[1]  # noqa: E731  (the part after the stem)
    assert key(a, torch.float32) == key(b, torch.float32)
    assert key(a, torch.float32) != key(c, torch.float32)
    assert key(a, torch.float32) != key(a, torch.bfloat16)
    assert model_cache.copy_dir(a, torch.float32).parent == cache_dir / "models"


def test_cache_location_and_switch(monkeypatch, tmp_path):
    monkeypatch.delenv(model_cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert model_cache.cache_root() == tmp_path / "xdg" / "specdec"
    monkeypatch.setenv(model_cache.CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert model_cache.cache_root() == tmp_path / "mine"
    for off in ("0", "off", "False"):
        monkeypatch.setenv(model_cache.SWITCH_ENV, off)
        assert not model_cache.enabled()
    monkeypatch.setenv(model_cache.SWITCH_ENV, "1")
    assert model_cache.enabled()


def test_a_copy_is_complete_only_once_fully_written(cache_dir):
    model, tok = _tiny_model_and_tokenizer()
    target = cache_dir / "models" / "tiny"
    notes: list[str] = []
    assert not model_cache.is_complete(target)
    assert model_cache.write_copy(target, model, tok, "tiny.gguf", notes.append)
    assert model_cache.is_complete(target) and notes == []
    # nothing temporary is left beside it, and writing it again (another process finishing first) is harmless
    assert model_cache.write_copy(target, model, tok, "tiny.gguf", notes.append)
    assert sorted(p.name for p in target.parent.iterdir()) == ["tiny"]
    reloaded = LlamaForCausalLM.from_pretrained(target)
    for (name, p), (_, q) in zip(model.state_dict().items(), reloaded.state_dict().items()):
        assert torch.equal(p, q), name


def test_a_copy_that_cannot_be_written_leaves_nothing_and_says_so(cache_dir, monkeypatch):
    model, tok = _tiny_model_and_tokenizer()
    target = cache_dir / "models" / "tiny"

    def no_space(model, path, **kwargs):
        open(path, "wb").close()  # a partial write
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_model", no_space)
    notes: list[str] = []
    assert not model_cache.write_copy(target, model, tok, "tiny.gguf", notes.append)
    assert not model_cache.is_complete(target) and not target.exists()
    assert list(target.parent.iterdir()) == []  # the partial temporary directory is gone
    assert len(notes) == 1 and "No space left" in notes[0] and "converts again" in notes[0]


def test_the_embedded_model_loads_from_its_copy_exactly(cache_dir):
    """The first load converts the GGUF and keeps a copy; the second reads the copy and builds the same model,
    tokenizer (chat template, eos / pad) and greedy output."""
    from specdec.models import load_model

    notes: list[str] = []
    model_a, tok_a = load_model("smollm2", note=notes.append)
    assert len(notes) == 1 and "first load" in notes[0], notes
    copies = list((cache_dir / "models").iterdir())
    assert len(copies) == 1 and model_cache.is_complete(copies[0])

    model_b, tok_b = load_model("smollm2", note=notes.append)
    assert len(notes) == 1, notes  # nothing to say the second time
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    config_a = model_a.config.to_dict()
    assert config_a.pop("quantization_config")["quant_method"] == "gguf"  # the GGUF load's mark; the copy is plain
    assert config_a == model_b.config.to_dict()
    assert model_a.name_or_path == model_b.name_or_path == tok_a.name_or_path == tok_b.name_or_path
    assert model_a.generation_config.to_dict() == model_b.generation_config.to_dict()
    assert (tok_a.eos_token_id, tok_a.pad_token_id) == (tok_b.eos_token_id, tok_b.pad_token_id)
    chat = [{"role": "user", "content": "Explain what a hash table is, with an example in Python."}]
    ids_a = tok_a.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids_b = tok_b.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert torch.equal(ids_a["input_ids"], ids_b["input_ids"])
    text = "naïve café — 東京 🙂 def f(x):\n\treturn x**2"
    assert tok_a(text)["input_ids"] == tok_b(text)["input_ids"]
    assert tok_a.decode(tok_a(text)["input_ids"]) == tok_b.decode(tok_b(text)["input_ids"])
    out_a = model_a.generate(**ids_a, max_new_tokens=8, do_sample=False)
    out_b = model_b.generate(**ids_b, max_new_tokens=8, do_sample=False)
    assert torch.equal(out_a, out_b)
