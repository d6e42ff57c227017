"""The drafter interface: what the speculative loop asks of anything that proposes tokens.

:class:`Drafter` is a base class with a default for every optional member, so the engine, the API
and the evaluation never probe a drafter with ``hasattr``. A drafter's life in one ``generate`` call::

    d = drafter.for_call()                 # per-call copy: one SpeculativeModel serves many threads
    d.start(input_ids, mask, max_len, verifier=<verifier cache>, hidden=<prompt hidden states>)
    loop: d.propose(rows, k, ctx) -> DraftChain
          d.commit(Commit(rows, accepted, added, hidden=..., path=...))
          d.keep_rows(index)             # finished rows leave the batch
    d.finish()
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from specdec.protocol import Commit, DraftChain, DraftContext, Drafts, Proposal, Rows

# the loop's types live in specdec.protocol; drafter authors may import them from here too
__all__ = ["Commit", "DraftChain", "DraftContext", "Drafter", "Drafts", "Proposal", "Rows", "WrappingDrafter"]

if TYPE_CHECKING:
    from specdec.trees.build import TreeShape
    from specdec.trees.tree import DraftTree
    from specdec.runners.hf import CacheSession


class Drafter:
    """Proposes draft tokens for the speculative loop. Subclass it; override what your drafter needs.

    Required: :meth:`propose`. Everything else has a default: a stateless drafter (prompt lookup)
    overrides nothing else; a drafter with a cache overrides :meth:`start`, :meth:`commit`,
    :meth:`keep_rows` and :meth:`finish`.
    """

    #: verifier hidden states this drafter reads, as indices into transformers' ``output_hidden_states``
    #: (0: the embeddings; ``i``: what enters decoder layer ``i``; ``L``: the final, normed state).
    #: Empty: the verifier computes none (no cost). EAGLE reads ``(L,)``, EAGLE-3 ``(2, L // 2, L - 3)``.
    hidden_layers: tuple[int, ...] = ()
    #: drafter forward passes in the current call (a statistic)
    forwards: int = 0
    #: whether :meth:`propose_tree` drafts trees (heads, model drafters, prompt lookup, composite)
    supports_tree: bool = False
    #: how this drafter was chosen (``draft="auto"``: the ranking it measured), for ``SpecStats.draft_choice``
    choice: dict | None = None
    #: the tokenizer of a drafter that speaks another vocabulary than the verifier's (None: the verifier's)
    draft_tokenizer: Any = None

    @property
    def model(self) -> torch.nn.Module | None:
        """The causal LM this drafter runs, if any (memory planning, HF assisted baselines)."""
        return None

    @property
    def compilable(self) -> bool:
        """Whether :meth:`compile` has a model to compile."""
        return self.model is not None

    def compile(self) -> None:
        """Run the drafter's forwards through ``torch.compile``."""
        raise ValueError(f"{type(self).__name__} has no model to compile")

    @property
    def captures_graphs(self) -> bool:
        """Whether :meth:`compile_graphs` can capture this drafter's greedy draft as raw CUDA graphs."""
        return False

    def compile_graphs(self) -> None:
        """Draft greedy chains through raw CUDA graphs (``compile_drafter="graphs"``, :mod:`specdec.runners.capture`)."""
        raise ValueError(f"compile_drafter='graphs': {type(self).__name__} has no fixed-shape draft to capture "
                         "(EAGLE heads do); use compile_drafter=True")

    def prime(self) -> None:
        """Compile now (dummy forwards) rather than in the first calls; nothing to do by default."""

    def check_tree_masks(self) -> None:
        """Raise ``UnsupportedModelError`` now if a model this drafter feeds tree masks to would ignore them (a
        model drafter's own); nothing to check by default."""

    def cost_ratio(self, verifier: torch.nn.Module) -> float:
        """A clock-free guess of one draft token's cost in verifier passes (adaptive k's prior and its seeded
        calls' whole cost model): the bytes of :attr:`model` over the verifier's; nearly free without a model."""
        from specdec.quant.memory import model_bytes  # counts packed int4/int8 weights at their real size

        if self.model is None:
            return 0.02
        return min(1.0, max(0.02, model_bytes(self.model) / max(model_bytes(verifier), 1)))

    def for_call(self) -> "Drafter":
        """A drafter for one ``generate`` call: shares weights and compiled graphs, owns its per-call
        state, so concurrent calls on one :class:`~specdec.SpeculativeModel` do not collide."""
        return copy.copy(self)

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: "CacheSession | None" = None, hidden: torch.Tensor | None = None) -> None:
        """Prepare for a new batch of prompts. ``max_len`` bounds prompt + generated + draft tokens;
        ``verifier`` is the verifier's cache with the prompt in it (drafters derived from the verifier
        may start from it); ``hidden`` the verifier's prompt hidden states, when :attr:`hidden_layers` asks."""
        self.forwards = 0

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        """Return up to ``k`` draft tokens per row, as a ``[batch, k']`` tensor (``k' <= k``)."""
        raise NotImplementedError

    def propose_tree(self, rows: Rows, shape: "TreeShape", ctx: DraftContext) -> "DraftTree":
        """Return a tree of drafts per row (:class:`~specdec.trees.DraftTree`) shaped by ``shape``; its
        nodes must be deterministic given the context (top-ranked tokens) unless the tree carries ``probs``."""
        raise NotImplementedError(f"{type(self).__name__} cannot draft trees")

    def commit(self, update: Commit) -> None:
        """Learn what the verifier committed (roll back past the first rejected draft)."""

    def keep_rows(self, indices: torch.Tensor) -> None:
        """Keep only these rows (by position in the current batch)."""

    def stats(self) -> dict[str, float]:
        """Drafter-specific statistics of the current call (land in ``SpecStats.drafter_stats``)."""
        return {}

    def finish(self) -> None:
        """Release per-call state (caches)."""


def wants_graphs(drafter: Drafter, how: bool | str, cuda: bool) -> bool:
    """Whether ``compile_drafter=how`` means raw CUDA graphs for ``drafter``: ``"graphs"``, or ``True`` on CUDA for a
    drafter that captures them (the H200 check measured them; on a CPU ``True`` stays ``torch.compile``)."""
    return how == "graphs" or (how is True and cuda and drafter.captures_graphs)


class WrappingDrafter(Drafter):
    """A drafter around another (:attr:`inner`): everything it does not override is the inner drafter's, so a
    wrapper (grammar-aware drafting, simulated acceptance, composite) states only what it changes."""

    inner: Drafter

    @property
    def hidden_layers(self) -> tuple[int, ...]:  # a head inside reads the verifier's features
        return self.inner.hidden_layers

    @property
    def supports_tree(self) -> bool:
        return self.inner.supports_tree

    @property
    def draft_tokenizer(self) -> Any:
        return self.inner.draft_tokenizer

    @property
    def choice(self) -> dict | None:
        return self.inner.choice

    @property
    def forwards(self) -> int:  # the inner drafter's forwards are the wrapper's (stats, adaptive k)
        return self.inner.forwards

    @forwards.setter
    def forwards(self, value: int) -> None:
        self.inner.forwards = value

    @property
    def model(self) -> torch.nn.Module | None:
        return self.inner.model

    @property
    def compilable(self) -> bool:
        return self.inner.compilable

    def compile(self) -> None:
        self.inner.compile()

    @property
    def captures_graphs(self) -> bool:
        return self.inner.captures_graphs

    def compile_graphs(self) -> None:
        self.inner.compile_graphs()

    def prime(self) -> None:
        self.inner.prime()

    def check_tree_masks(self) -> None:
        self.inner.check_tree_masks()

    def cost_ratio(self, verifier: torch.nn.Module) -> float:
        return self.inner.cost_ratio(verifier)

    def for_call(self) -> "WrappingDrafter":
        call = copy.copy(self)
        call.inner = self.inner.for_call()
        return call

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: "CacheSession | None" = None, hidden: torch.Tensor | None = None) -> None:
        self.inner.start(input_ids, attention_mask, max_len, verifier=verifier, hidden=hidden)

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        return self.inner.propose(rows, k, ctx)

    def propose_tree(self, rows: Rows, shape: "TreeShape", ctx: DraftContext) -> "DraftTree":
        return self.inner.propose_tree(rows, shape, ctx)

    def commit(self, update: Commit) -> None:
        self.inner.commit(update)

    def keep_rows(self, indices: torch.Tensor) -> None:
        self.inner.keep_rows(indices)

    def stats(self) -> dict[str, float]:
        return self.inner.stats()

    def finish(self) -> None:
        self.inner.finish()
