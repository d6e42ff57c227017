"""specdec: lossless speculative decoding for Hugging Face causal language models.

>>> import specdec
>>> fast = specdec.SpeculativeModel(model, draft="self:int8", tokenizer=tokenizer)
>>> fast.generate(**inputs, max_new_tokens=64)          # same as model.generate, faster
"""

from specdec.acceptance import greedy_accept, rejection_accept
from specdec.api import DEFAULT_NUM_DRAFT_TOKENS, SpeculativeModel, SpeculativeOutput, generate, patch, unpatch
from specdec.drafters import Drafter, ModelDrafter, Proposal, VocabularyMismatchError
from specdec.stats import SpecStats
from specdec.verifiers.cache import CacheOverflowError, ManagedCache
from specdec.verifiers.hf import UnsupportedModelError

__version__ = "0.1.0"

__all__ = [
    "CacheOverflowError",
    "DEFAULT_NUM_DRAFT_TOKENS",
    "Drafter",
    "ManagedCache",
    "ModelDrafter",
    "Proposal",
    "SpecStats",
    "SpeculativeModel",
    "SpeculativeOutput",
    "UnsupportedModelError",
    "VocabularyMismatchError",
    "generate",
    "greedy_accept",
    "patch",
    "rejection_accept",
    "unpatch",
]
