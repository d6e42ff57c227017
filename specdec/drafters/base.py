"""The drafter interface: what the speculative loop asks of anything that proposes tokens.

:class:`Drafter` is a base class with a default for every optional member, so the engine, the API
and the evaluation never probe a drafter with ``hasattr``. A drafter's life in one ``generate`` call::

    d = drafter.for_call()                 # per-call copy: one SpeculativeModel serves many threads
    d.start(input_ids, mask, max_len, verifier=<verifier cache>, hidden=<prompt hidden states>)
    loop: d.propose(rows, k, ctx) -> Proposal
          d.commit(Commit(rows, accepted, added, hidden=..., path=...))
          d.keep_rows(index)             # finished rows leave the batch
    d.finish()
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from specdec.processing import RowContext, RowProcessors

if TYPE_CHECKING:
    from specdec.trees.build import TreeShape
    from specdec.trees.tree import DraftTree
    from specdec.verifiers.hf import CacheSession


@dataclass
class Proposal:
    """``k`` proposed tokens per row and, when sampling, the processed probabilities they were drawn from.

    ``probs`` is ``[batch, k, vocab]`` or ``None``; ``None`` means a deterministic drafter, which the
    acceptance rule treats as one-hot ``q``.
    """

    tokens: torch.LongTensor
    probs: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[1])


@dataclass
class DraftContext:
    """What a drafter may use to draft: the processors and the sampling mode of this call.

    ``processors`` apply per row (:meth:`RowProcessors.apply` with ``(row owner, context)`` pairs, see
    :meth:`Rows.contexts`); a plain ``LogitsProcessorList`` (or ``None``) is taken as the same list for every row.
    """

    processors: RowProcessors
    do_sample: bool
    generator: torch.Generator | None = None
    vocab_size: int | None = None  # the verifier's vocabulary: never propose ids at or beyond it

    def __post_init__(self) -> None:
        if not isinstance(self.processors, RowProcessors):
            self.processors = RowProcessors(self.processors)


class Rows:
    """The committed rows of the active batch: ``tokens [B, width]`` and ``lengths [B]``.

    Row ``b`` is ``tokens[b, :lengths[b]]`` in transformers' layout: the left padding of its prompt,
    then its real tokens. Indexing and iterating give those 1-D views, so a drafter can treat the
    batch as a list of rows of different lengths. ``owners[b]``: row ``b``'s index in the batch the
    call was given (rows that finish leave the active batch), which picks its logits processors.
    """

    def __init__(self, tokens: torch.LongTensor, lengths: torch.LongTensor, owners: list[int] | None = None) -> None:
        self.tokens, self.lengths = tokens, lengths
        self._lengths = lengths.tolist()  # host copy: slicing with it costs no device sync
        self.owners = list(range(len(self._lengths))) if owners is None else list(owners)

    @classmethod
    def from_list(cls, rows: list[torch.LongTensor]) -> "Rows":
        """Pack 1-D rows (right-padded with zeros) into a :class:`Rows`."""
        width = max(len(r) for r in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.long, device=rows[0].device)
        for b, row in enumerate(rows):
            tokens[b, : len(row)] = row
        return cls(tokens, torch.tensor([len(r) for r in rows], dtype=torch.long, device="cpu"))

    def __len__(self) -> int:
        return len(self._lengths)

    def __getitem__(self, b: int) -> torch.LongTensor:
        return self.tokens[b, : self._lengths[b]]

    def __iter__(self) -> Iterator[torch.LongTensor]:
        return (self[b] for b in range(len(self)))

    def contexts(self) -> list[RowContext]:
        """``(owner, row)`` per row: what :meth:`RowProcessors.apply` takes for the rows as they stand."""
        return list(zip(self.owners, self))

    def length(self, b: int) -> int:
        """Length of row ``b`` (left padding included), without a device sync."""
        return self._lengths[b]

    @property
    def device(self) -> torch.device:
        return self.tokens.device


@dataclass
class Commit:
    """What one verification pass committed, as the engine tells it to the drafter.

    ``rows``: the committed rows after the pass. ``accepted[b]``: drafts of row ``b`` the verifier
    accepted. ``added[b]``: tokens committed to row ``b`` (accepted drafts, then the verifier's own
    token; fewer when a stop rule ended the row inside the block). ``hidden``: for drafters that asked
    (:attr:`Drafter.hidden_layers`), the verifier's hidden states ``[B, n, H * len(layers)]`` at the
    ``n`` positions it just verified (the previous newest token, then the drafts); entry ``j < added[b]``
    of row ``b`` belongs to a committed token. ``path``: for tree drafts, the node index of each
    accepted draft per row (``[B, depth]``, -1 past ``accepted[b]``); ``None`` for chains.
    """

    rows: Rows
    accepted: torch.LongTensor
    added: torch.LongTensor
    hidden: torch.Tensor | None = None
    path: torch.LongTensor | None = None


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

    def prime(self) -> None:
        """Compile now (dummy forwards) rather than in the first calls; nothing to do by default."""

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

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> Proposal:
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
