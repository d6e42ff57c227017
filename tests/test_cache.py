"""Managed cache invariants: after any accept/reject history it equals a fresh prefill of the kept tokens."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.runners import CacheOverflowError, CausalLMRunner, ManagedCache
from tiny_models import VOCAB, make_model

MODELS = {arch: make_model(arch) for arch in ("llama", "mistral", "gpt2")}


def _fresh(model, tokens: torch.Tensor) -> ManagedCache:
    runner, _ = CausalLMRunner(model).prefill(tokens, None, 128)
    return runner.cache


steps = st.lists(st.tuples(st.integers(1, 9), st.integers(0, 9)), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arch=st.sampled_from(sorted(MODELS)), prompt_len=st.integers(1, 12), history=steps, seed=st.integers(0, 10_000))
def test_rollback_equals_fresh_prefill(arch, prompt_len, history, seed):
    model = MODELS[arch]
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (1, prompt_len), generator=gen)
    runner, _ = CausalLMRunner(model).prefill(tokens, None, 128)
    for write, reject in history:  # write `write` tokens (a verify pass), then reject up to `reject` of them
        new = torch.randint(0, VOCAB, (1, write), generator=gen)
        runner.forward(new)
        keep = runner.length - min(reject, write)
        runner.rollback(keep)
        tokens = torch.cat([tokens, new], dim=1)[:, :keep]
    assert runner.length == tokens.shape[1]
    fresh = _fresh(model, tokens)
    for mine, ref in zip(runner.cache.layers, fresh.layers):
        n = tokens.shape[1]
        torch.testing.assert_close(mine.keys[:, :, :n], ref.keys[:, :, :n], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(mine.values[:, :, :n], ref.values[:, :, :n], rtol=1e-4, atol=1e-5)


def test_stale_slots_are_never_read():
    """Garbage written past the pointer (the rejected tail) does not change the next forward."""
    model = MODELS["llama"]
    tokens = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(0))
    runner, _ = CausalLMRunner(model).prefill(tokens, None, 64)
    clean = runner.forward(torch.tensor([[5, 6]])).logits
    runner.rollback(10)
    with torch.inference_mode():  # the buffers are inference tensors
        for layer in runner.cache.layers:
            layer.keys[:, :, 10:].fill_(1e4)
            layer.values[:, :, 10:].normal_()
    again = runner.forward(torch.tensor([[5, 6]])).logits
    torch.testing.assert_close(clean, again)


def test_buffers_are_allocated_once_and_rollback_copies_nothing():
    model = MODELS["gpt2"]
    runner, _ = CausalLMRunner(model).prefill(torch.tensor([[1, 2, 3]]), None, 32)
    pointers = [layer.keys.data_ptr() for layer in runner.cache.layers]
    nbytes = runner.cache.nbytes
    for _ in range(5):
        runner.forward(torch.tensor([[4, 5, 6]]))
        runner.rollback(runner.length - 2)
    assert [layer.keys.data_ptr() for layer in runner.cache.layers] == pointers
    assert runner.cache.nbytes == nbytes == 2 * 2 * 1 * 4 * 32 * 16 * 4  # K+V x layers x batch x heads x len x dim x fp32


def test_overflow_is_an_error_not_a_silent_grow():
    runner, _ = CausalLMRunner(MODELS["llama"]).prefill(torch.tensor([[1, 2, 3]]), None, 5)
    with pytest.raises(CacheOverflowError, match="preallocated for 5 tokens"):
        runner.forward(torch.tensor([[4, 5, 6]]))


def test_rollback_forward_only():
    cache = ManagedCache(2, 8)
    with pytest.raises(ValueError, match="cannot roll back"):
        cache.rollback(3)
    with pytest.raises(ValueError, match="positive"):
        ManagedCache(2, 0)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_passes_hand_the_cache_by_the_models_own_keyword(arch, recwarn):
    """Prefill and verify passes give the cache by the keyword the model's forward declares (``cache`` since
    transformers renamed it; the old ``past_key_values`` warns and goes in 5.40), so no deprecation warning."""
    import inspect
    import warnings

    from specdec.runners.cache import cache_argument

    model = MODELS[arch]
    assert cache_argument(model) in inspect.signature(model.forward).parameters
    warnings.simplefilter("always")
    runner, _ = CausalLMRunner(model).prefill(torch.tensor([[1, 2, 3]]), None, 32)
    runner.forward(torch.tensor([[4, 5]]))
    stale = [str(w.message) for w in recwarn if "past_key_values" in str(w.message)]
    assert not stale, stale


def test_cache_keyword_of_an_older_forward():
    """A forward that only knows ``past_key_values`` (older transformers, remote code) is given that; one that
    names neither (a ``**kwargs`` wrapper) gets the installed transformers' name, which its models declare."""
    import inspect

    from specdec.runners.cache import cache_argument

    class Old(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return input_ids

    class New(torch.nn.Module):
        def forward(self, input_ids=None, cache=None, use_cache=None):
            return input_ids

    class Wrapper(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return args

    assert cache_argument(Old()) == "past_key_values" and cache_argument(New()) == "cache"
    assert cache_argument(Wrapper()) in inspect.signature(type(MODELS["llama"]).forward).parameters
