"""Verifiers: the user's model driven over a managed, rollback-able KV cache."""

from specdec.verifiers.cache import CacheOverflowError, ManagedCache, ManagedLayer
from specdec.verifiers.hf import CausalLMRunner, UnsupportedModelError, check_supported

__all__ = ["CacheOverflowError", "CausalLMRunner", "ManagedCache", "ManagedLayer", "UnsupportedModelError", "check_supported"]
