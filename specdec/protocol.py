"""The speculative loop's vocabulary: what the engine, the drafters, verification and trees exchange.

- :class:`Rows`: the committed rows of the active batch; :class:`DraftContext`: what a drafter may use to draft;
- :class:`Drafts`: what a drafter proposes, a chain (:class:`DraftChain`) or a tree (``specdec.trees.DraftTree``);
- :class:`Commit`: what one verify pass committed, as the drafter is told;
- :func:`checked`: a proposal checked against what was asked before the engine verifies it (:class:`ProposalError`);
- :class:`DraftPlan`: how a call drafts (chains of a fixed or adaptive ``k``: ``specdec.chains.ChainPlan``;
  trees: ``specdec.trees.plan.TreePlan``). The engine asks the plan for each pass's proposal and tells it the
  outcome; it never asks which kind of plan or proposal it holds.

Imports nothing of specdec's but the processors, slot counts and the non-blocking upload: drafters, trees and verification import this, never the reverse.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

import torch

from specdec.errors import SpecdecError
from specdec.processing import RowContext, RowProcessors
from specdec.slots import CallSlots, cache_slots, pass_widths
from specdec.transfer import upload


class Drafts:
    """What a drafter proposes for one verify pass: ``tokens [B, N]`` and, when sampled, ``probs``."""

    tokens: torch.LongTensor
    probs: torch.Tensor | None
    values: torch.Tensor | None = None  # trees: per node, the drafter's estimate that it is accepted (sizing)
    drafted: "DraftedIds | None" = None  # set by :func:`checked`: the drafter's own ids, checked after the pass's read

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[1])

    def scored(self) -> list[tuple[int, int]]:
        """Per row: (drafts the verifier scores, positions they span)."""
        raise NotImplementedError


@dataclass
class DraftChain(Drafts):
    """``k`` proposed tokens per row and, when sampling, the processed probabilities they were drawn from.

    ``probs`` is ``[batch, k, vocab]`` or ``None``; ``None`` means a deterministic drafter, which the
    acceptance rule treats as one-hot ``q``.
    """

    tokens: torch.LongTensor
    probs: torch.Tensor | None = None

    def scored(self) -> list[tuple[int, int]]:
        """A chain's ``k`` drafts at ``k`` positions, every row."""
        return [(self.num_tokens, self.num_tokens)] * self.tokens.shape[0]


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


def left_pads(attention_mask: torch.Tensor | None, batch: int) -> list[int]:
    """Each row's left padding in transformers' layout (zeros where the mask is 0), as host ints: one device read."""
    return [0] * batch if attention_mask is None else (attention_mask == 0).sum(dim=1).tolist()


class Rows:
    """The committed rows of the active batch: ``tokens [B, width]`` and ``lengths [B]``.

    Row ``b`` is ``tokens[b, :lengths[b]]`` in transformers' layout: the left padding of its prompt,
    then its real tokens. Indexing and iterating give those 1-D views, so a drafter can treat the
    batch as a list of rows of different lengths. ``owners[b]``: row ``b``'s index in the batch the
    call was given (rows that finish leave the active batch), which picks its logits processors. ``pads[b]``: the
    left padding of row ``b``'s prompt (host ints, read once per call), where its real tokens start.
    """

    def __init__(self, tokens: torch.LongTensor, lengths: torch.LongTensor | list[int], owners: list[int] | None = None,
                 host: list[list[int]] | None = None, pads: list[int] | None = None) -> None:
        self.tokens = tokens
        # host ints: slicing with them costs no device sync (the engine passes lists; a tensor is read once here)
        self._lengths = list(lengths) if isinstance(lengths, list) else lengths.tolist()
        self.owners = list(range(len(self._lengths))) if owners is None else list(owners)
        self._host = host  # per row, its tokens as host ints (at least lengths[b] of them), when the caller has them
        self.pads = [0] * len(self._lengths) if pads is None else list(pads)

    @property
    def lengths(self) -> torch.LongTensor:
        """Row lengths as a host tensor."""
        return torch.tensor(self._lengths, dtype=torch.long, device="cpu")

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

    def host(self, b: int) -> list[int]:
        """Row ``b``'s tokens as host ints (left padding included): the engine's own copy, no device read; rows
        built without one are read from the device here."""
        if self._host is None:
            return self[b].tolist()
        return self._host[b][: self._lengths[b]]

    @property
    def device(self) -> torch.device:
        return self.tokens.device


@dataclass
class Commit:
    """What one verification pass committed, as the engine tells it to the drafter.

    ``rows``: the committed rows after the pass. ``accepted[b]``: drafts of row ``b`` the verifier
    accepted. ``added[b]``: tokens committed to row ``b`` (accepted drafts, then the verifier's own
    token; fewer when a stop rule ended the row inside the block). Both are device tensors, and
    ``accepted_host`` / ``added_host`` the same as host ints (the engine read them once this pass: a drafter
    that reads the tensors back would add a device sync). ``hidden``: for drafters that asked
    (:attr:`Drafter.hidden_layers`), the verifier's hidden states ``[B, n, H * len(layers)]`` at the
    ``n`` positions it just verified (the previous newest token, then the drafts); entry ``j < added[b]``
    of row ``b`` belongs to a committed token. ``path``: for tree drafts, the node index of each
    accepted draft per row (``[B, depth]``, -1 past ``accepted[b]``); ``None`` for chains; ``path_host`` the same
    as host ints (read with the pass's other ints; :meth:`path_lists` reads ``path`` when built without it).
    """

    rows: Rows
    accepted: torch.LongTensor
    added: torch.LongTensor | None = None
    hidden: torch.Tensor | None = None
    path: torch.LongTensor | None = None
    accepted_host: list[int] | None = None
    added_host: list[int] | None = None
    path_host: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if self.accepted_host is None:  # built outside the engine (tests, priming): read them here
            self.accepted_host = self.accepted.tolist()
        if self.added is None:  # the engine's: computed on the device unless a stop cut a block (that row leaves)
            self.added = self.accepted + 1 if self.steady else upload(self.added_host, torch.long, self.accepted.device)
        elif self.added_host is None:
            self.added_host = self.added.tolist()

    def path_lists(self) -> list[list[int]] | None:
        """``path`` as host ints (``None`` for chains): the engine's copy, else read here once."""
        if self.path_host is None and self.path is not None:
            self.path_host = self.path.tolist()
        return self.path_host

    @property
    def steady(self) -> bool:
        """Whether every row committed its accepted drafts plus one token (no stop inside the block), so that
        ``added == accepted + 1`` on the device too."""
        return all(n == a + 1 for a, n in zip(self.accepted_host, self.added_host))


#: the name a chain of drafts had before ``DraftChain`` (custom drafters may still import it)
Proposal = DraftChain


class ProposalError(SpecdecError, ValueError):
    """A drafter proposed something the engine cannot verify (wrong shape, dtype, length, rows or ids); the message
    names the drafter's class."""


@dataclass(frozen=True, eq=False)
class DraftedIds:
    """A proposal's ids as its drafter gave them (``ids [B, N]``, on the device). They ride along with the pass's one
    device read (:meth:`specdec.verification.Verified.read`) and are checked on the host after it, before anything is
    committed: checking them before the verify pass would cost a second host-device sync."""

    ids: torch.Tensor
    vocab_size: int
    drafter: str

    def check(self, host: list[list[int]]) -> None:
        """Raise :class:`ProposalError` if any of ``host`` (:attr:`ids` as read) is outside ``[0, vocab_size)``."""
        for b, row in enumerate(host):
            bad = next((t for t in row if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise ProposalError(f"drafter {self.drafter} proposed token id {bad} (row {b}); ids must be in "
                                    f"[0, {self.vocab_size}), the verifier's vocabulary")


def checked(drafts: Drafts, drafter: object, rows: Rows, ctx: DraftContext, nodes: int, depth: int,
            kind: type[Drafts] = DraftChain) -> Drafts:
    """``drafts`` as the engine may verify them: at most ``nodes`` drafts per row, at most ``depth`` deep (a chain:
    both are its ``k``), one row per row of ``rows``, ``torch.long`` ids on the rows' device, ``probs``
    ``[B, N, vocab]``; otherwise a one-line :class:`ProposalError` naming the drafter's class. A custom drafter's bad
    proposal would otherwise overflow the cache, pass unnoticed (a ragged batch) or index past the vocabulary (a
    device-side assert that ends the process on CUDA).

    These checks read shapes only (no device sync). The ids' range cannot be read without one, so the ids are
    clamped into the vocabulary for the verify pass (one elementwise op; nothing past it reaches an embedding) and
    the drafter's own ids kept as :attr:`Drafts.drafted`, read with the pass's one read and checked after it. Built-in
    drafters are checked too: it costs one clamp a pass. Returns a shallow copy; the drafter's object is untouched."""
    name = type(drafter).__name__

    def refuse(problem: str) -> ProposalError:
        return ProposalError(f"drafter {name} {problem}")

    if not isinstance(drafts, kind):
        raise refuse(f"returned {type(drafts).__name__}, not a {kind.__name__}")
    tokens, vocab = drafts.tokens, ctx.vocab_size
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
        what = f"{tokens.dtype} tensor of shape {tuple(tokens.shape)}" if isinstance(tokens, torch.Tensor) \
            else type(tokens).__name__
        raise refuse(f"proposed tokens as a {what}; they must be a torch.long tensor [rows, drafts]")
    batch, n = tokens.shape
    if batch != len(rows):
        raise refuse(f"proposed {batch} rows of drafts for a batch of {len(rows)}")
    if tokens.device != rows.device:
        raise refuse(f"proposed tokens on {tokens.device}; the rows are on {rows.device}")
    if n > nodes:
        raise refuse(f"proposed {n} drafts per row; this pass asked for at most {nodes}")
    deepest = n if kind is DraftChain else max((d for _, d in drafts.scored()), default=0)
    if deepest > depth:
        raise refuse(f"proposed drafts {deepest} deep; this pass asked for at most {depth}")
    probs = drafts.probs
    if probs is not None and (not isinstance(probs, torch.Tensor) or not probs.is_floating_point() or probs.dim() != 3
                              or probs.shape != (batch, n, vocab or probs.shape[-1])):
        what = f"a {probs.dtype} tensor of shape {tuple(probs.shape)}" if isinstance(probs, torch.Tensor) \
            else type(probs).__name__
        raise refuse(f"proposed probs as {what}; they must be a float tensor {[batch, n, vocab or 'vocab']}")
    if vocab is None or n == 0:
        return drafts
    safe = copy.copy(drafts)
    safe.tokens = tokens.clamp(0, vocab - 1)
    safe.drafted = DraftedIds(tokens, vocab, name)
    return safe


class Proposer(Protocol):
    """What a :class:`DraftPlan` asks of a drafter (:class:`specdec.drafters.Drafter` answers it)."""

    supports_tree: bool

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> Drafts: ...

    def propose_tree(self, rows: Rows, shape: Any, ctx: DraftContext) -> Drafts: ...


class DraftPlan:
    """How one call drafts: what the engine asks before each pass and tells after it.

    ``num_draft_tokens``: the call's ``k`` (the bound of an adaptive ``k``); :attr:`max_drafts` the most drafts
    one pass scores, :attr:`extra_slots` the cache slots a pass may need past a chain's. Subclasses:
    ``specdec.chains.ChainPlan`` and ``specdec.trees.plan.TreePlan``.
    """

    num_draft_tokens: int
    #: how a sampled chain's drafts are verified (:data:`specdec.acceptance.CHAIN_RULES`); trees: per-node rejection
    rule: str = "token"

    @property
    def max_drafts(self) -> int:
        return self.num_draft_tokens

    @property
    def max_nodes(self) -> int | None:
        """A tree's most nodes per pass; ``None`` for chains."""
        return None

    @property
    def extra_slots(self) -> int:
        return 0

    def slots(self, batch: int, prompt: int, max_length: int) -> int:
        """Cache slots per row of each managed cache for a call of this shape (:func:`specdec.slots.cache_slots`)."""
        return cache_slots(batch, prompt, max_length, self.num_draft_tokens) + self.extra_slots

    def call_slots(self, batch: int, prompt: int, max_length: int, static: bool = False) -> CallSlots:
        """Every cache size of a call of this shape, once: ``static`` for a verifier with compiled passes."""
        return CallSlots.of(self.slots(batch, prompt, max_length), self.widths, static)

    @property
    def widths(self) -> tuple[int, ...]:
        """The token counts a compiled verify pass is padded to (:func:`specdec.slots.pass_widths`)."""
        return pass_widths(self.num_draft_tokens, self.max_nodes)

    def check(self, drafter: Proposer) -> None:
        """Raise ``ValueError`` if ``drafter`` cannot draft what this plan asks for."""

    def propose(self, drafter: Proposer, rows: Rows, room: int, ctx: DraftContext) -> Drafts:
        """Ask ``drafter`` for one pass's drafts, at most ``room`` tokens deep."""
        raise NotImplementedError

    def update(self, drafts: Drafts, accepted: list[int], draft_seconds: float, verify_seconds: float,
               drafter_forwards: int, path: torch.Tensor | list[list[int]] | None = None) -> None:
        """Learn from one pass: ``accepted`` drafts per row (host ints: read once per pass), its timings, the drafter's forwards and, for
        trees, the accepted path (``path [B, D]``: node indices, -1 past the accepted ones; host ints from the engine)."""

    def to_dict(self) -> dict | None:
        """``SpecStats.tree``: a tree's configuration (and what ``auto`` learnt); ``None`` for chains."""
        return None
