"""EAGLE-style draft heads as drafters: a small head reads the verifier's own hidden states.

The head keeps its own KV cache (:class:`~specdec.heads.modules.HeadCache`); its slot ``i`` of a row holds
the pair (verifier feature at position ``i``, token ``i + 1``). Features arrive with the prompt
(``start(hidden=...)``) and with every verification (``Commit.hidden``); they wait as *pending* until the
token after them is committed, and :meth:`EagleDrafter.propose` feeds them in one pass whose last output
gives the first draft. Later drafts feed the head's own output back. Draft slots are dropped at the next
commit, since the verifier's real features replace them (as in EAGLE).
"""

from __future__ import annotations

import copy
import threading
import types
import warnings
from pathlib import Path
from typing import Any

import torch

from specdec.acceptance import draft_distribution
from specdec.drafters.base import Drafter
from specdec.protocol import Commit, DraftChain, DraftContext, Rows, left_pads
from specdec.runners.static import COMPILE_ERRORS
from specdec.drafters.scores import processed_scores
from specdec.heads.checkpoint import load_head, verifier_shape
from specdec.heads.static_draft import draft_chain, region_steps
from specdec.runners.capture import PhaseGraphs
from specdec.slots import STATIC_LENGTH_STEP
from specdec.heads.modules import CachedKeyValues, EagleHead, HeadCache, TreeKeyValues
from specdec.trees.build import TreeShape, grow_tree
from specdec.transfer import upload
from specdec.trees.tree import DraftTree


#: static drafts: head cache slots kept free past ``max_len`` for a padded feed and the drafts of one pass
_STATIC_ROOM = 64
_POOL_LOCK = threading.Lock()  # the pooled head caches of compile_graphs(), shared by concurrent calls


class EagleDrafter(Drafter):
    """Draft with an EAGLE-1/2 or EAGLE-3 head (:func:`specdec.heads.load_head`) for ``verifier``."""

    supports_tree = True

    def __init__(self, head: EagleHead, verifier: Any) -> None:
        dtype = verifier.get_input_embeddings().weight.dtype
        if dtype.is_floating_point and any(p.is_floating_point() and p.dtype != dtype for p in head.parameters()):
            head.to(dtype=dtype)  # a head built by hand (fp32) over a bf16 verifier: cast as load_head does
        self.head = head
        _, layers, _ = verifier_shape(verifier)
        self.hidden_layers = (layers,) if head.config.kind == "eagle" else tuple(head.config.aux_layers)
        self._cache: HeadCache | None = None
        self._pending: list[torch.Tensor] = []  # per row: features whose next token was not yet fed
        self._committed: torch.Tensor | None = None
        self._pending_counts: torch.Tensor | None = None  # len of each row's pending, on the device, when known there
        self._lengths: list[int] = []  # host mirror of the head cache's lengths
        self._committed_lengths: list[int] = []
        c = head.config
        identity = c.kind == "eagle" or (c.draft_vocab_size == c.vocab_size and not bool(head.d2t.any()))
        # verifier ids of the head's vocabulary rows; None when they are the verifier's ids already
        self._draft_ids = None if identity else head.to_target(torch.arange(c.draft_vocab_size, device=head.d2t.device))
        # compile(): {"pass": ..., "logits": ...} compiled functions, shared by the per-call copies (emptied on failure)
        self._compiled: dict[str, Any] | None = None
        #: greedy chains draft through one region of fixed shapes (:mod:`specdec.heads.static_draft`), captured as a
        #: CUDA graph when compiled on a GPU; :meth:`compile` turns it on
        self.static_draft = False
        self._fed_hidden: torch.Tensor | None = None  # the last commit's features, while they are the whole pending
        self._pads_t: torch.Tensor | None = None
        self._steps = 1  # static drafts: the region's k in this call (the widest met)
        #: compile_graphs(): free head caches per (batch, slots), each with its captured graphs (None: no capture)
        self._graph_caches: dict[tuple, list[HeadCache]] | None = None
        self._pooled = False  # this call's cache came from (and goes back to) that pool
        # compile_graphs(): the buffer row of each active row once rows retired (None: every buffer row is active); the
        # head cache keeps the retired rows as dummies, so the captured region keeps its shape and addresses
        self._live: torch.Tensor | None = None
        self._spare: HeadCache | None = None  # a pooled cache set aside after its rows were copied out (see _leave_pool)

    @classmethod
    def from_pretrained(cls, directory: str | Path, verifier: Any) -> "EagleDrafter":
        """Load the head in ``directory`` (EAGLE-1/2 or EAGLE-3 layout) for ``verifier``."""
        return cls(load_head(directory, verifier), verifier)

    @property
    def kind(self) -> str:
        return self.head.config.kind

    @property
    def compilable(self) -> bool:
        return True

    def compile(self) -> None:
        """Run the head's passes and draft logits through ``torch.compile`` (inductor, dynamic shapes), and greedy
        chains through one fixed-shape region per ``k`` (:mod:`specdec.heads.static_draft`): on a GPU a CUDA graph
        (``mode="reduce-overhead"``) replayed every pass, with no host read inside.

        A head step is a few dozen small ops (norms, rotary, attention glue): per-op overhead on a CPU (about a fifth
        of the step, measured on the shipped head) and one kernel launch each on a GPU, which inductor fuses. Drafts
        may differ from eager ones at float near-ties; the output stays the verifier's. A failed compilation warns
        and runs the head eagerly."""
        # one compiled function per pass kind, each over its own copy of the code: dynamo keeps at most 8 graphs per
        # code object (then runs it eagerly, silently), and a head's kinds x (1 row, several) x (1 token, several)
        # need more than that; a second head compiles its own
        self._compiled = {kind: torch.compile(_own_code(_head_pass), dynamic=True) for kind in ("feed", "step", "tree")}
        self._compiled["logits"] = torch.compile(_own_code(_head_logits), dynamic=True)
        self.static_draft = True  # greedy chains: the whole draft as one graph per k (made at first use)

    @property
    def captures_graphs(self) -> bool:
        return True

    def compile_graphs(self) -> None:
        """Draft greedy chains through one raw CUDA graph per (batch, ``k``) of the fixed-shape region
        (:mod:`specdec.heads.static_draft`), captured at first use in one shared pool (:mod:`specdec.runners.capture`),
        over head caches pooled between calls so that their graphs are reused; no ``torch.compile``. On a CPU the same
        region runs eagerly over the same static buffers. Sampling, processors and trees stay eager."""
        self.static_draft = True
        self._graph_caches = {}  # (batch, slots) -> [HeadCache] with their graphs: shared by the per-call copies

    def prime(self) -> None:
        """Compile now with dummy passes of every kind a call runs (feeds of one and of several committed tokens,
        one-token chain steps, tree frontiers of one and of several nodes, the static chain region for ``k`` up to
        4), for one row and for several: dynamic
        shapes cover every size but 1, which dynamo specialises."""
        if not self._compiled:
            return
        c, p = self.head.config, next(self.head.parameters())
        call, ctx, device = self.for_call(), DraftContext(None, False), p.device
        # eager feeds and steps (sampling, processors, trees, composite) and, when on, the static chain region (k=3)
        runs = [(static, batch, prompt) for static in sorted({False, self.static_draft}) for batch, prompt in ((1, 3), (2, 6))]
        with torch.no_grad():
            for static, batch, prompt in runs:
                call.static_draft = static
                zeros = lambda n, width: torch.zeros(batch, n, width, dtype=p.dtype, device=device)  # noqa: E731
                ones = lambda n: torch.ones(batch, n, dtype=torch.long, device=device)  # noqa: E731
                each = lambda n: torch.full((batch,), n, dtype=torch.long, device=device)  # noqa: E731
                rows = lambda n: Rows(ones(n), torch.full((batch,), n, dtype=torch.long, device="cpu"))  # noqa: E731
                call.start(ones(prompt), None, prompt + 16, hidden=zeros(prompt, c.fc_in_features))
                length = prompt + 1
                for added in (1, 2, 1):  # the feed after each commit: one token, then two
                    call.propose(rows(length), 3, ctx)
                    length += added
                    call.commit(Commit(rows(length), each(added - 1), each(added), hidden=zeros(added, c.fc_in_features)))
                base = call._cache.lengths
                for fed, frontier in ((0, 1), (1, 2), (3, 3)):
                    visible = torch.ones(batch, frontier, fed + frontier, dtype=torch.bool, device=device)
                    depth = torch.full((batch, frontier), 1 + fed, dtype=torch.long, device=device)
                    call._logits(call._pass("tree", ones(frontier), zeros(frontier, c.hidden_size), True,
                                            TreeKeyValues(call._cache, base, visible, depth)))
                call.finish()

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: Any = None, hidden: torch.Tensor | None = None) -> None:
        if hidden is None:
            raise ValueError("an EAGLE drafter needs the verifier's prompt hidden states (start(hidden=...))")
        self.forwards = 0
        batch = input_ids.shape[0]
        pads = left_pads(attention_mask, batch)  # before any Rows exists: the prompt's features are sliced by it
        c, p = self.head.config, next(self.head.parameters())
        # static drafts: slots rounded up (calls of similar lengths share graphs), with room for a feed and the drafts
        slots = -(-(max_len + 1 + _STATIC_ROOM) // STATIC_LENGTH_STEP) * STATIC_LENGTH_STEP if self.static_draft \
            else max_len + 1
        self._cache = self._borrow(batch, slots) if self._graph_caches is not None else \
            HeadCache(len(self.head.decoder_layers), batch, slots, c.num_key_value_heads, c.head_dim, p.dtype, p.device)
        self._pads_t = upload(pads, torch.long, p.device) if self.static_draft else None
        self._fed_hidden, self._steps, self._live = None, 1, None
        self._pending = [hidden[b, pad:] for b, pad in enumerate(pads)]
        self._pending_counts = None
        self._committed = self._cache.lengths.clone()
        self._lengths = [0] * batch  # host mirror of the cache's lengths: the loop never reads them back
        self._committed_lengths = list(self._lengths)

    def _feed_pending(self, rows: Rows) -> torch.Tensor:
        """Feed every row's pending (feature, next token) pairs in one pass; the output after each row's last."""
        self._compact()
        cache, counts, lengths = self._cache, [len(p) for p in self._pending], self._lengths
        width, device = max(counts), cache.lengths.device
        feats = torch.zeros(len(rows), width, self._pending[0].shape[-1], dtype=self._pending[0].dtype, device=device)
        tokens = torch.zeros(len(rows), width, dtype=torch.long, device=device)
        for b, (pending, n) in enumerate(zip(self._pending, counts)):
            start = rows.pads[b] + lengths[b] + 1  # the token after slot lengths[b], in the padded row
            feats[b, :n] = pending
            tokens[b, :n] = rows[b][start:start + n]
        out = self._run(tokens, feats, own=False)
        # the counts on the device: the last commit's ``added`` when it alone made the pending features
        counts_t = self._pending_counts if self._pending_counts is not None else upload(counts, torch.long, device)
        cache.lengths = cache.lengths + counts_t
        self._lengths = [length + n for length, n in zip(lengths, counts)]
        self._pending, self._pending_counts, self._fed_hidden = [], None, None
        return out[torch.arange(len(rows), device=device), counts_t - 1].unsqueeze(1)

    def _run(self, tokens: torch.Tensor, feats: torch.Tensor, own: bool) -> torch.Tensor:
        self.forwards += 1
        kind = "step" if own else "feed"
        return self._pass(kind, tokens, feats, own, CachedKeyValues(self._cache, tokens.shape[1], max(self._lengths)))

    def _pass(self, kind: str, tokens: torch.Tensor, feats: torch.Tensor, own: bool, kv: Any) -> torch.Tensor:
        """One head pass of ``kind`` (``feed``, ``step``, ``tree``; compiled after :meth:`compile`): its pre-norm
        outputs ``[B, n, H]``."""
        return self._call(kind, _head_pass, self.head, tokens, feats, own, kv)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._call("logits", _head_logits, self.head, hidden)

    def _call(self, name: str, eager: Any, *args: Any) -> Any:
        compiled = self._compiled.get(name) if self._compiled else None
        if compiled is not None:
            try:
                return compiled(*args)
            except COMPILE_ERRORS as err:
                warnings.warn(f"torch.compile failed for the drafter ({type(err).__name__}: {err}); running it eagerly",
                              stacklevel=4)
                self._compiled.clear()  # the dict is shared: every per-call copy goes eager
        return eager(*args)

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        if k <= 0:
            return DraftChain(torch.zeros(len(rows), 0, dtype=torch.long, device=rows.device), None)
        if self.static_draft and not (ctx.do_sample or ctx.processors) and self._fed_hidden is not None:
            # the feed must fit, and one region serves the call: passes that ask for fewer drafts (the last ones,
            # an adaptive k) run the widest region met and drop the extra drafts
            steps = self._steps = region_steps(max(k, self._fed_hidden.shape[1] - 1, self._steps))
            if max(self._lengths) + 2 * steps + 1 <= self._cache.slots:
                return self._propose_static(rows, k, steps)
        with torch.no_grad():
            out = self._feed_pending(rows)
            self._committed, self._committed_lengths = self._cache.lengths.clone(), list(self._lengths)
            ids, tokens, probs = rows.contexts(), [], []
            for i in range(k):
                logits = self._logits(out[:, -1])
                if ctx.do_sample or ctx.processors:
                    scores = processed_scores(self._full_vocab(logits), ids, ctx)
                    p = draft_distribution(scores)
                    token = torch.multinomial(p, 1, generator=ctx.generator).squeeze(-1) if ctx.do_sample else scores.argmax(-1)
                    if ctx.do_sample:
                        probs.append(p)
                    ids = [(owner, torch.cat([row, t.view(1)])) for (owner, row), t in zip(ids, token)]
                else:
                    token = self.head.to_target(logits.argmax(dim=-1))
                tokens.append(token)
                if i < k - 1:
                    out = self._run(token.unsqueeze(1), out, own=True)
                    self._cache.lengths = self._cache.lengths + 1
                    self._lengths = [length + 1 for length in self._lengths]
        return DraftChain(torch.stack(tokens, dim=1), torch.stack(probs, dim=1) if probs else None)

    def _propose_static(self, rows: Rows, k: int, steps: int) -> DraftChain:
        """:meth:`propose` through the fixed-shape region: the feed padded to ``steps + 1``, ``steps`` drafts of which
        the first ``k`` are proposed. Outputs are copied: a replayed graph reuses its output memory."""
        cache, width, live = self._cache, steps + 1, self._live
        feats = torch.nn.functional.pad(self._fed_hidden, (0, 0, 0, width - self._fed_hidden.shape[1]))
        mine = cache.lengths if live is None else cache.lengths[live]  # the active rows' lengths
        at = (self._pads_t + mine + 1).unsqueeze(1) + torch.arange(width, device=cache.lengths.device)
        tokens = rows.tokens.gather(1, at.clamp(max=rows.tokens.shape[1] - 1))  # each fed feature's next token
        with torch.no_grad():
            if self._graph_caches is not None:
                drafts, lengths = self._draft_graphed(steps, tokens, feats)
                if live is not None:
                    drafts = drafts[live]
            else:
                drafts, lengths = self._call(self._chain_region(steps), draft_chain, self.head, cache.keys, cache.values,
                                             cache.lengths, tokens, feats, self._pending_counts, steps)
        self.forwards += steps
        cache.lengths = self._committed = lengths.clone()
        self._lengths = [n + len(p) for n, p in zip(self._lengths, self._pending)]
        self._committed_lengths = list(self._lengths)
        self._pending, self._pending_counts, self._fed_hidden = [], None, None
        return DraftChain(drafts[:, :k].clone())

    def _borrow(self, batch: int, slots: int) -> HeadCache:
        """A pooled head cache (its buffers, hence its graphs, kept between calls), zeroed lengths; else a new one."""
        c, p = self.head.config, next(self.head.parameters())
        with _POOL_LOCK:
            free = self._graph_caches.get((batch, slots))
            cache = free.pop() if free else None
        if cache is None:
            cache = HeadCache(len(self.head.decoder_layers), batch, slots, c.num_key_value_heads, c.head_dim,
                              p.dtype, p.device)
            cache.graphs = PhaseGraphs("draft", capture=True)
        cache.lengths = torch.zeros_like(cache.lengths)
        self._pooled = True
        return cache

    def _draft_graphed(self, steps: int, tokens: torch.Tensor, feats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The region through the cache's graph for (``steps``, shapes): captured at first use, replayed after. With
        retired rows, the active rows' inputs are placed at their buffer rows and the dummies feed one filler token
        from slot 0 (their slots are never read), so the batch, hence the graph, stays the call's first."""
        cache, head = self._cache, self.head
        keys, values = cache.keys, cache.values
        lengths, counts = cache.lengths, self._pending_counts
        if self._live is not None:
            live, batch = self._live, cache.lengths.shape[0]
            tokens = tokens.new_zeros((batch, *tokens.shape[1:])).index_copy_(0, live, tokens)
            feats = feats.new_zeros((batch, *feats.shape[1:])).index_copy_(0, live, feats)
            counts = counts.new_ones(batch).index_copy_(0, live, counts)
            lengths = torch.zeros_like(lengths).index_copy_(0, live, lengths[live])

        def draft(lengths: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor, counts: torch.Tensor) -> Any:
            return draft_chain(head, keys, values, lengths, tokens, feats, counts, steps)

        key = (steps, tuple(tokens.shape), tuple(feats.shape), feats.dtype)
        return cache.graphs.run(key, draft, (lengths, tokens, feats, counts), [*keys, *values])

    def _compact(self) -> None:
        """Before an eager pass: drop the retired dummy rows from the head cache (new buffers: its graphs go)."""
        if self._live is None:
            return
        self._leave_pool(self._live)
        self._committed = self._committed.index_select(0, self._live)
        self._live = None

    def _leave_pool(self, rows: torch.Tensor) -> None:
        """Go on with a copy of buffer ``rows`` of the head cache (its graphs start empty); a pooled cache is kept
        aside, buffers and graphs untouched, and goes back to the pool at :meth:`finish`."""
        if not self._pooled:
            self._cache.keep_rows(rows)
            if self._graph_caches is not None:
                self._cache.graphs = PhaseGraphs("draft", capture=True)
            return
        pooled, small = self._cache, copy.copy(self._cache)
        small.keys = [k.index_select(0, rows) for k in pooled.keys]
        small.values = [v.index_select(0, rows) for v in pooled.values]
        small.lengths, small.graphs = pooled.lengths.index_select(0, rows), PhaseGraphs("draft", capture=True)
        self._spare, self._cache, self._pooled = pooled, small, False

    def _chain_region(self, steps: int) -> str:
        """The name of the compiled region drafting ``steps`` (compiled at first use; nothing once compiling failed).
        Each ``steps`` gets its own code object, so ``range(steps)`` stays a constant; batch and cache sizes go
        dynamic after the first change (dynamo's default), and CUDA graphs record one graph per shape met."""
        name = f"chain-{steps}"
        if self._compiled and name not in self._compiled:
            cuda = next(self.head.parameters()).device.type == "cuda"
            self._compiled[name] = torch.compile(_own_code(draft_chain), fullgraph=True,
                                                 **({"mode": "reduce-overhead"} if cuda else {}))
        return name

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        """A static or dynamic tree (EAGLE-2): each depth's frontier runs through the head in one pass, each
        node attending to the committed slots and its own ancestors; the slots go at the next commit."""
        self._compact()
        with torch.no_grad():
            out = self._feed_pending(rows)[:, -1]  # [B, H]: the output that predicts the first draft
            self._committed = base = self._cache.lengths.clone()
            self._committed_lengths = list(self._lengths)
            longest = max(self._lengths)
            outputs: list[torch.Tensor] = []  # per expansion: [B, F, H], in feed order

            def expand(tokens, depth, parent_pos, visible):
                fed = torch.cat([out.unsqueeze(1)] + outputs, dim=1)  # feed position p is at p + 1
                feats = fed.gather(1, (parent_pos + 1)[..., None].expand(-1, -1, fed.shape[-1]))
                self.forwards += 1
                h = self._pass("tree", tokens, feats, True, TreeKeyValues(self._cache, base, visible, depth, longest))
                outputs.append(h)
                return self._full_vocab(self._logits(h))

            root = self._full_vocab(self._logits(out))
            grown = grow_tree(root, expand, shape, rows, ctx, lambda logits, contexts: processed_scores(logits, contexts, ctx))
        return grown.tree

    def _full_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits spread over the verifier's vocabulary (-inf where the head cannot draft)."""
        if self._draft_ids is None:
            return logits
        full = logits.new_full(logits.shape[:-1] + (self.head.config.vocab_size,), float("-inf"))
        full[..., self._draft_ids] = logits
        return full

    def commit(self, update: Commit) -> None:
        self._cache.lengths = self._committed.clone()  # drafts' slots go: the verifier's features replace them
        self._lengths = list(self._committed_lengths)
        hidden, added = update.hidden, update.added_host
        if hidden is None:
            raise ValueError("an EAGLE drafter needs the verifier's hidden states in every Commit")
        fresh = [hidden[b, :n] for b, n in enumerate(added)]
        # another drafter may have proposed this step (composite): features not fed yet stay pending
        if self._pending:
            self._pending, self._pending_counts = [torch.cat([old, new]) for old, new in zip(self._pending, fresh)], None
            self._fed_hidden = None
        else:
            self._pending, self._pending_counts = fresh, update.added
            self._fed_hidden = hidden

    def keep_rows(self, indices: torch.Tensor) -> None:
        index = indices.tolist()  # host data (the engine's index): uploaded once, without blocking
        on_device = upload(index, torch.long, self._committed.device)
        if self._pooled and self._fed_hidden is not None:  # captured drafts: the leaving rows stay as dummies
            live = self._live if self._live is not None else torch.arange(len(self._lengths), device=on_device.device)
            self._live = live.index_select(0, on_device)
            self._fed_hidden = self._fed_hidden.index_select(0, on_device)
            if self._pending_counts is not None:
                self._pending_counts = self._pending_counts.index_select(0, on_device)
        else:
            self._compact()
            self._leave_pool(on_device)  # new buffers: a pooled cache's graphs no longer apply; this one gets its own
            self._committed = self._committed.index_select(0, on_device)
            if self._pending:
                self._pending_counts, self._fed_hidden = None, None
        self._lengths = [self._lengths[i] for i in index]
        self._committed_lengths = [self._committed_lengths[i] for i in index]
        if self._pads_t is not None:
            self._pads_t = self._pads_t.index_select(0, on_device)
        if self._pending:
            self._pending = [self._pending[i] for i in index]

    def finish(self) -> None:
        pooled = self._cache if self._pooled else self._spare
        if pooled is not None:
            with _POOL_LOCK:
                self._graph_caches.setdefault((pooled.lengths.shape[0], pooled.slots), []).append(pooled)
        self._pooled, self._spare = False, None
        self._cache, self._pending, self._committed, self._pending_counts = None, [], None, None
        self._fed_hidden, self._pads_t, self._live = None, None, None


def _head_pass(head: EagleHead, tokens: torch.Tensor, feats: torch.Tensor, own: bool, kv: Any) -> torch.Tensor:
    """Embed ``tokens``, mix in ``feats`` (verifier features, or with ``own`` the head's previous outputs) and run
    the decoder layers over ``kv``'s slots: the head's pre-norm outputs ``[B, n, H]``."""
    embeds = head.embed(tokens)
    hidden = head.input_hidden(embeds, feats.to(embeds.dtype), own=own)
    return head(embeds, hidden, kv.positions, kv)


def _head_logits(head: EagleHead, hidden: torch.Tensor) -> torch.Tensor:
    return head.logits(hidden)


def _own_code(fn: Any) -> Any:
    """``fn`` over a fresh copy of its code object, so that dynamo keeps a cache (and a recompile budget) for it alone."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
