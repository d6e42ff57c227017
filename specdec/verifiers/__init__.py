"""Verifiers: the user's model driven over a managed, rollback-able KV cache."""

from specdec.verifiers.cache import CacheOverflowError, ManagedCache, ManagedLayer
from specdec.verifiers.hf import CausalLMRunner, UnsupportedModelError, check_supported
from specdec.verifiers.session import CacheSession, StepOutput

__all__ = ["CacheOverflowError", "CacheSession", "CausalLMRunner", "ManagedCache", "ManagedLayer", "StepOutput", "UnsupportedModelError", "check_supported"]
