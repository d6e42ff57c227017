"""specdec: lossless speculative decoding for Hugging Face causal language models.

>>> import specdec
>>> fast = specdec.SpeculativeModel(model, draft="self:int8", tokenizer=tokenizer)
>>> fast.generate(**inputs, max_new_tokens=64)          # same as model.generate, faster

The public names are imported on first use (they need torch and transformers), so that the
command line's ``--help`` and ``specdec plan`` start without either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdec.errors import SpecdecError  # the base of every error a user can fix (torch-free: imported at once)
from specdec.lazy import lazy_exports

if TYPE_CHECKING:
    from specdec.acceptance import greedy_accept, rejection_accept
    from specdec.api import DEFAULT_NUM_DRAFT_TOKENS, SpeculativeModel, SpeculativeOutput, generate, patch, unpatch
    from specdec.constraints import UnsupportedProcessorError
    from specdec.drafters import DraftChain, Drafter, ModelDrafter, Proposal, VocabularyMismatchError
    from specdec.stats import SpecStats
    from specdec.runners.cache import CacheOverflowError, ManagedCache
    from specdec.runners.hf import UnsupportedModelError

__version__ = "0.1.0"

#: public name -> module that defines it
_LAZY = {
    "greedy_accept": "specdec.acceptance",
    "rejection_accept": "specdec.acceptance",
    "DEFAULT_NUM_DRAFT_TOKENS": "specdec.api",
    "SpeculativeModel": "specdec.api",
    "SpeculativeOutput": "specdec.api",
    "generate": "specdec.api",
    "patch": "specdec.api",
    "unpatch": "specdec.api",
    "Drafter": "specdec.drafters",
    "ModelDrafter": "specdec.drafters",
    "DraftChain": "specdec.drafters",
    "Proposal": "specdec.drafters",  # DraftChain's earlier name
    "VocabularyMismatchError": "specdec.drafters",
    "SpecStats": "specdec.stats",
    "CacheOverflowError": "specdec.runners.cache",
    "ManagedCache": "specdec.runners.cache",
    "UnsupportedModelError": "specdec.runners.hf",
    "UnsupportedProcessorError": "specdec.constraints",
}

__all__ = [
    "CacheOverflowError",
    "DEFAULT_NUM_DRAFT_TOKENS",
    "DraftChain",
    "Drafter",
    "ManagedCache",
    "ModelDrafter",
    "Proposal",
    "SpecStats",
    "SpecdecError",
    "SpeculativeModel",
    "SpeculativeOutput",
    "UnsupportedModelError",
    "UnsupportedProcessorError",
    "VocabularyMismatchError",
    "generate",
    "greedy_accept",
    "patch",
    "rejection_accept",
    "unpatch",
]


__getattr__, __dir__ = lazy_exports(globals(), _LAZY)
