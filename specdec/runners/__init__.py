"""Verifiers: the user's model driven over a managed, rollback-able KV cache."""

from specdec.runners.cache import CacheOverflowError, ManagedCache, ManagedLayer
from specdec.runners.hf import CausalLMRunner, UnsupportedModelError, check_supported
from specdec.runners.session import CacheSession, StepOutput

__all__ = ["CacheOverflowError", "CacheSession", "CausalLMRunner", "ManagedCache", "ManagedLayer", "StepOutput", "UnsupportedModelError", "check_supported"]
