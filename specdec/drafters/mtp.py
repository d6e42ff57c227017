"""A model's own multi-token-prediction (MTP) layers as its drafter: ``draft="mtp"``.

DeepSeek-V3, GLM-4.5 and other checkpoints ship ``num_mtp_layers`` extra layers (``model.layers.{N + i}.*`` after
the ``N`` decoder layers) trained to predict the token after next. transformers 5.24 drafts with them
(``generate(use_mtp=True)``, batch 1, no trees); this drafter uses the same weights, loaded by transformers' own
:class:`~transformers.modeling_layers.MtpModel` from the checkpoint the verifier came from, inside specdec's loop
(ragged batches, sampling, any ``k``).

MTP layer ``i`` at token position ``p`` reads the pair (``g[i - 1]`` at ``p - 1``, embedding of token ``p``), where
``g[-1]`` is the verifier's final, normed hidden state (what transformers feeds it: ``hidden_states[-1]``) and
``g[i]`` layer ``i``'s output; ``g[i]`` at ``p`` predicts token ``p + i + 1``. Each trained layer keeps its own KV
cache (a :class:`~specdec.runners.session.CacheSession` over one managed layer) holding committed context only: a
pass feeds each layer the positions committed since the last one, and for ``i >= 1`` one more *frontier* column
(``g[i - 1]`` of the previous draft, the previous draft's embedding) whose output gives draft ``i + 1``; the frontier
slot is rolled back at the commit. Drafts past the trained depth reuse the last layer on its own output (recursive
MTP), appending one column each to that layer's cache, rolled back the same way.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from specdec.acceptance import draft_distribution
from specdec.drafters.base import Drafter
from specdec.drafters.scores import processed_scores
from specdec.drafters.qwen_mtp import is_qwen_mtp, load_qwen_mtp, qwen_mtp_layer_count
from specdec.protocol import Commit, DraftChain, DraftContext, Rows, left_pads
from specdec.runners.cache import ManagedCache
from specdec.runners.hf import UnsupportedModelError
from specdec.runners.session import CacheSession
from specdec.transfer import upload
from specdec.trees.build import TreeShape, grow_tree
from specdec.trees.tree import DraftTree


class MtpUnavailableError(UnsupportedModelError):
    """The verifier has no MTP layers to draft with (none in its config, or no weights for them in its checkpoint)."""


def mtp_layer_count(config: Any) -> int:
    """How many MTP layers ``config`` declares (``num_mtp_layers`` of its text config, Qwen's
    ``mtp_num_hidden_layers``; 0 when none)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(getattr(text, "num_mtp_layers", 0) or 0) or qwen_mtp_layer_count(config)


def load_mtp_layers(model: Any) -> torch.nn.Module:
    """The MTP layers of ``model`` from the checkpoint it was loaded from (transformers' ``MtpModel``, sharing the
    model's embeddings, LM head and rotary embedding), on the device of its last decoder layer, in its dtype.

    Raises :class:`MtpUnavailableError` (one line) when the config declares none or the checkpoint holds none."""
    kind = getattr(model.config, "model_type", type(model).__name__)
    if is_qwen_mtp(model.config):  # Qwen3.5 / Qwen3-Next: mtp.* tensors, read by specdec
        try:
            return load_qwen_mtp(model)
        except (LookupError, RuntimeError, OSError) as err:
            raise MtpUnavailableError(f"draft='mtp': the {kind!r} model has no usable MTP layers: {err}") from None
    count = mtp_layer_count(model.config)
    if count < 1:
        raise MtpUnavailableError(f"draft='mtp': model type {kind!r} has no MTP layers (its config sets no "
                                  "num_mtp_layers); use another drafter, e.g. prompt-lookup or self:int8")
    source = getattr(model.config, "name_or_path", "") or ""
    if not source:
        raise MtpUnavailableError(f"draft='mtp': this {kind!r} model was not loaded from a checkpoint "
                                  "(config.name_or_path is empty), so there are no MTP weights to read")
    from transformers.modeling_layers import MtpModel  # transformers >= 5.2x: only needed when this drafter builds

    layers = model.get_decoder().layers
    device = next(layers[-1].parameters()).device
    try:
        with checkpoint_mtp_patterns(model):
            return MtpModel.from_pretrained(model, device_map={"": device}).eval()
    except (RuntimeError, ValueError, OSError) as err:  # missing keys, no known pattern, no safetensors
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise MtpUnavailableError(f"draft='mtp': the {kind!r} checkpoint {source!r} holds no usable weights for its "
                                  f"{count} MTP layer(s) ({first_line[:160]})") from None


@contextlib.contextmanager
def checkpoint_mtp_patterns(model: Any) -> Iterator[None]:
    """While open, transformers' ``MtpModel.from_pretrained(model)`` (and so ``generate(use_mtp=True)``) also finds
    MTP weights at ``model.layers.{N + i}`` for ``model``'s own depth ``N``.

    transformers matches the layer numbers of the released checkpoints only (61 for DeepSeek-V3, 46 and 92 for
    GLM-4.5: the patterns the model class ignores when it loads), so a checkpoint of another depth (distilled,
    tiny) would read as having none. The patterns are added on this instance and removed on exit."""
    text = model.config.get_text_config()
    ours = [rf"model\.layers\.{text.num_hidden_layers + i}\..*" for i in range(mtp_layer_count(model.config))]
    had = "_keys_to_ignore_on_load_unexpected" in vars(model)
    before = model._keys_to_ignore_on_load_unexpected
    model._keys_to_ignore_on_load_unexpected = list(before or []) + ours
    try:
        yield
    finally:
        if had:
            model._keys_to_ignore_on_load_unexpected = before
        else:
            del model._keys_to_ignore_on_load_unexpected


class _LayerCache(ManagedCache):
    """A one-layer managed cache that MTP layer ``i``'s block (built with ``layer_idx=i``) writes to: every
    layer gets a cache of its own, so that rollback and compaction move one pointer."""

    def __init__(self, max_cache_len: int) -> None:
        super().__init__(1, max_cache_len)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return super().update(key_states, value_states, 0, *args, **kwargs)


class _MtpLayerRunner:
    """Runs MTP layer ``index`` for a :class:`CacheSession` (the runner protocol's few members): embeddings of the
    tokens and the previous hidden states (``prev``) in, the layer's output hidden states ``[B, n, H]`` out."""

    sliding = False
    custom_masks = True  # the session builds 4-D masks over its valid slots; causal ones for dense passes here
    cache_arg = "cache"
    num_layers = 1

    def __init__(self, mtp: torch.nn.Module, index: int) -> None:
        self.model, self.index = mtp, index

    def check_tree_masks(self, purpose: str = "") -> None:
        """Masks are built here, so every tree mask is honoured."""

    def run(self, session: CacheSession, hidden_layers: tuple[int, ...], *, input_ids: torch.Tensor,
            attention_mask: torch.Tensor | None, position_ids: torch.Tensor, prev: torch.Tensor, cache: Any,
            **_: Any) -> torch.Tensor:
        mtp, n = self.model, input_ids.shape[1]
        if attention_mask is None and n > 1:  # a dense session passes none: causal over the cache, built here
            start, dtype = cache.length, mtp.dtype
            slot = torch.arange(start + n, device=input_ids.device)
            allowed = slot[None, :] <= start + torch.arange(n, device=input_ids.device)[:, None]
            attention_mask = torch.where(allowed, torch.zeros((), dtype=dtype, device=input_ids.device),
                                         torch.full((), torch.finfo(dtype).min, dtype=dtype, device=input_ids.device))
            attention_mask = attention_mask.expand(input_ids.shape[0], 1, n, start + n)
        embeds = mtp.embed_tokens(input_ids).to(prev.device)
        rope = None
        if mtp.rotary_emb is not None:
            kwargs = {"layer_type": mtp.config.layer_types[self.index]} if mtp.has_per_layer_rope else {}
            rope = mtp.rotary_emb(embeds, position_ids=position_ids, **kwargs)
        out = mtp.layers[self.index](embeds, prev.to(embeds.dtype), position_embeddings=rope, attention_mask=attention_mask,
                                     position_ids=position_ids, cache=cache)
        return mtp.shared_post_norm(out) if mtp.use_shared_post_norm else out


class MtpDrafter(Drafter):
    """Draft with ``verifier``'s own MTP layers (:func:`load_mtp_layers`); chains of any ``k`` and trees, any batch."""

    supports_tree = True

    def __init__(self, mtp: torch.nn.Module, verifier: Any) -> None:
        self.mtp = mtp
        self.num_mtp_layers = len(mtp.layers)
        self.hidden_layers = (int(verifier.config.get_text_config().num_hidden_layers),)  # the final, normed state
        self._runners = [_MtpLayerRunner(mtp, i) for i in range(self.num_mtp_layers)]
        self._reset()

    @classmethod
    def from_model(cls, verifier: Any) -> "MtpDrafter":
        """The drafter of ``verifier``'s MTP layers, read from its checkpoint (:class:`MtpUnavailableError` if none)."""
        return cls(load_mtp_layers(verifier), verifier)

    def _reset(self) -> None:
        self._sessions: list[CacheSession] = []  # one per trained layer in use, in layer order
        self._carry: list[torch.Tensor | None] = []  # per layer: its output at each row's last committed position
        self._has: list[list[bool]] = []  # per layer, per row: whether that carry exists (the position is one it reads)
        self._provisional: list[int] = []  # per layer: slots written after its committed feed this pass
        # verifier states whose next token was not fed yet: row b's are block[b, offsets[b] : offsets[b] + counts[b]]
        self._block: torch.Tensor | None = None
        self._offsets: list[int] = []
        self._counts: list[int] = []
        self._fed: list[int] = []  # per row: the last position fed to layer 0
        self._pads: list[int] = []
        self._max_len = 0
        self._rows: Rows | None = None  # the rows of the current proposal

    @property
    def compilable(self) -> bool:
        return False  # eager only: an MTP layer is one decoder layer, and its masks change shape every pass

    def cost_ratio(self, verifier: torch.nn.Module) -> float:
        """One MTP layer over the verifier's decoder layers (the LM head is shared: counted once per draft)."""
        from specdec.quant.memory import model_bytes

        own = sum(p.numel() * p.element_size() for layer in self.mtp.layers[:1] for p in layer.parameters())
        return min(1.0, max(0.02, own / max(model_bytes(verifier), 1)))

    def start(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None, max_len: int, *,
              verifier: Any = None, hidden: torch.Tensor | None = None) -> None:
        if hidden is None:
            raise ValueError("the MTP drafter needs the verifier's prompt hidden states (start(hidden=...))")
        self._reset()
        self.forwards = 0
        batch = input_ids.shape[0]
        self._pads = left_pads(attention_mask, batch)
        self._block, self._offsets = hidden, list(self._pads)
        self._counts = [hidden.shape[1] - pad for pad in self._pads]
        self._fed = [0] * batch  # position 0 has no state before it: layer 0 starts at position 1
        self._max_len = max_len

    def _session(self, index: int, batch: int, device: torch.device) -> CacheSession:
        """Layer ``index``'s session, made on first use (a layer first used mid-call sees context from then on)."""
        while len(self._sessions) <= index:
            # room for the holes ragged rows leave; the session compacts them when it runs out
            session = CacheSession(self._runners[len(self._sessions)], batch, 2 * self._max_len + 16, device)
            session.cache = _LayerCache(session.cache.max_cache_len)
            self._sessions.append(session)
            self._carry.append(None)
            self._has.append([False] * batch)
            self._provisional.append(0)
        return self._sessions[index]

    def _forward(self, index: int, tokens: torch.Tensor, prev: torch.Tensor, positions: torch.Tensor,
                 valid: torch.Tensor | None) -> torch.Tensor:
        self.forwards += 1
        return self._sessions[index].forward(tokens, valid, position_ids=positions, prev=prev)

    def _feed_first(self, rows: Rows) -> tuple:
        """Feed layer 0 every pending (verifier state, next token) pair, left aligned (holes after shorter rows).
        Returns its outputs, their counts and first positions per row, its output at each row's newest committed
        position ``P`` (it predicts ``P + 1``), its carry and has-flags from before the pass, and ``P`` per row."""
        batch, device, dtype = len(rows), rows.device, self.mtp.dtype
        counts = self._counts
        width = max(counts)
        starts = [f + 1 for f in self._fed]  # first position fed per row
        last = [s + c - 1 for s, c in zip(starts, counts)]  # each row's newest committed position P
        self._rows = rows
        col = torch.arange(width, device=device)
        block = self._block
        at = (upload(self._offsets, torch.long, device)[:, None] + col).clamp(max=block.shape[1] - 1)
        feats = block.gather(1, at[..., None].expand(-1, -1, block.shape[-1])).to(dtype)  # left aligned
        positions = upload(starts, torch.long, device)[:, None] + col
        counts_t = upload(counts, torch.long, device)
        valid = None if min(counts) == width else col[None, :] < counts_t[:, None]
        self._session(0, batch, device)
        out = self._forward(0, self._tokens_at(positions), feats, positions, valid)
        self._provisional[0] = 0
        newest = out[torch.arange(batch, device=device), counts_t - 1]
        old_carry, old_has = self._carry[0], self._has[0]
        self._carry[0], self._has[0] = newest, [True] * batch
        self._block, self._offsets, self._counts, self._fed = None, [0] * batch, [0] * batch, last
        return out, counts, starts, newest, old_carry, old_has, last

    def propose(self, rows: Rows, k: int, ctx: DraftContext) -> DraftChain:
        batch, device = len(rows), rows.device
        if k <= 0:
            return DraftChain(torch.zeros(batch, 0, dtype=torch.long, device=device), None)
        with torch.no_grad():
            out, out_counts, out_starts, frontier, old_carry, old_has, last = self._feed_first(rows)
            contexts, drafts, probs = rows.contexts(), [], []
            active = max(len(self._sessions), min(k, self.num_mtp_layers))
            for depth in range(1, max(k, active)):
                token = None
                if depth <= k:  # draft `depth` from the frontier output that predicts it
                    token = self._draft(frontier, contexts, ctx, probs)
                    drafts.append(token)
                    contexts = [(owner, torch.cat([row, t.view(1)])) for (owner, row), t in zip(contexts, token)] \
                        if (ctx.do_sample or ctx.processors) else contexts
                if depth < active:  # trained layer `depth`: its committed feed, plus the frontier while drafting
                    out, out_counts, out_starts, frontier, old_carry, old_has = self._feed_layer(
                        depth, out, out_counts, out_starts, old_carry, old_has, token if depth < k else None,
                        frontier, last, device)
                elif depth < k:  # past the trained depth: the last layer again, on its own output
                    index = self.num_mtp_layers - 1
                    positions = upload([p + depth for p in last], torch.long, device)[:, None]
                    frontier = self._forward(index, token.unsqueeze(1), frontier.unsqueeze(1), positions, None)[:, 0]
                    self._provisional[index] += 1
            if len(drafts) < k:
                drafts.append(self._draft(frontier, contexts, ctx, probs))
        return DraftChain(torch.stack(drafts, dim=1), torch.stack(probs, dim=1) if probs else None)

    def propose_tree(self, rows: Rows, shape: TreeShape, ctx: DraftContext) -> DraftTree:
        """A static or dynamic tree, one frontier per depth as the EAGLE head grows it: every trained layer first
        takes its committed feed; then the nodes at depth ``d`` (draft ``d``) run through layer ``d`` (past the
        trained depth, the last layer) in one pass, at position ``P + d``, each reading its parent's output. In a
        layer's cache a node sees the committed context, and its ancestors where they ran through the same layer
        (recursive depths); its slots go at the commit."""
        device, n = rows.device, self.num_mtp_layers
        with torch.no_grad():
            out, counts, starts, root, carry, has, last = self._feed_first(rows)
            for index in range(1, n):  # committed context of every trained layer, no frontier
                out, counts, starts, _, carry, has = self._feed_layer(index, out, counts, starts, carry, has, None,
                                                                      root, last, device)
            newest = upload(last, torch.long, device)[:, None]
            outputs: list[torch.Tensor] = []  # per expansion: [B, F, H], in feed order
            fed_before: list[int] = [0, 0]  # nodes fed before depth d (index d), depth 1 first

            def expand(tokens: torch.Tensor, depth: torch.Tensor, parent_pos: torch.Tensor,
                       visible: torch.Tensor) -> torch.Tensor:
                d = len(outputs) + 1  # grow_tree feeds one depth a pass, shallowest first
                index = min(d, n - 1)
                fed = torch.cat([root.unsqueeze(1)] + outputs, dim=1)  # feed position p is at p + 1
                prev = fed.gather(1, (parent_pos + 1)[..., None].expand(-1, -1, fed.shape[-1]))
                # the slots this layer's cache holds of this tree: the nodes fed since its first depth here
                since = fed_before[max(index, 1)]
                h = self._tree_forward(index, tokens, prev, (newest + d).expand_as(tokens), visible[:, :, since:])
                outputs.append(h)
                fed_before.append(fed_before[-1] + tokens.shape[1])
                return self._fit(self.mtp._project_to_logits(h), ctx)

            grown = grow_tree(self._fit(self.mtp._project_to_logits(root), ctx), expand, shape, rows, ctx,
                              lambda logits, contexts: processed_scores(logits, contexts, ctx))
        return grown.tree

    def _tree_forward(self, index: int, tokens: torch.Tensor, prev: torch.Tensor, positions: torch.Tensor,
                      tree_mask: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        self._provisional[index] += tokens.shape[1]
        return self._sessions[index].forward(tokens, position_ids=positions, tree_mask=tree_mask, prev=prev)

    @staticmethod
    def _fit(logits: torch.Tensor, ctx: DraftContext) -> torch.Tensor:
        """Logits over the verifier's vocabulary (a padded head's extra ids dropped)."""
        vocab = ctx.vocab_size or logits.shape[-1]
        return logits[..., :vocab] if logits.shape[-1] > vocab else logits

    def _feed_layer(self, index: int, below: torch.Tensor, below_counts: list[int], below_starts: list[int],
                    below_carry: torch.Tensor | None, below_has: list[bool], token: torch.Tensor | None,
                    below_frontier: torch.Tensor, last: list[int], device: torch.device) -> tuple:
        """Feed trained layer ``index`` the positions the layer below just committed (each reads the layer below's
        output one position earlier: its carry, then its new outputs) and, with ``token``, the frontier column
        (the layer below's frontier output, ``token``'s embedding) whose output predicts the next draft.
        Returns this layer's outputs, counts, starts, frontier, and its carry and has-flags from before the pass
        (what the layer above reads first)."""
        batch = below.shape[0]
        self._session(index, batch, device)
        # per row: the layer below's outputs this layer reads (carry first when it has one), their first position
        reads = [c + h for c, h in zip(below_counts, below_has)]
        counts = [max(r - 1, 0) for r in reads]
        starts = [s - h + 1 for s, h in zip(below_starts, below_has)]
        width = max(counts)
        columns = [below_carry.unsqueeze(1) if below_carry is not None else below[:, :1] * 0, below]
        source = torch.cat(columns, dim=1)  # column 0: the carry, then the layer below's outputs
        col = torch.arange(width, device=device)
        offset = upload([0 if h else 1 for h in below_has], torch.long, device)[:, None]
        prev = source.gather(1, (col + offset).clamp(max=source.shape[1] - 1)[..., None].expand(-1, -1, source.shape[-1]))
        positions = upload(starts, torch.long, device)[:, None] + col
        rows_tokens = self._tokens_at(positions)
        counts_t = upload(counts, torch.long, device)
        valid = None if min(counts) == width else col[None, :] < counts_t[:, None]
        if token is not None:  # the frontier column, after every row's committed ones
            prev = torch.cat([prev, below_frontier.unsqueeze(1)], dim=1)
            rows_tokens = torch.cat([rows_tokens, token.unsqueeze(1)], dim=1)
            positions = torch.cat([positions, upload([p + index for p in last], torch.long, device)[:, None]], dim=1)
            if valid is not None:
                valid = torch.cat([valid, torch.ones(batch, 1, dtype=torch.bool, device=device)], dim=1)
        out = self._forward(index, rows_tokens, prev, positions.clamp_min(0), valid) if prev.shape[1] else \
            prev[:, :0]
        self._provisional[index] = 1 if token is not None else 0
        committed = out[:, :width]
        old_carry, old_has = self._carry[index], self._has[index]
        if width:
            newest = committed[torch.arange(batch, device=device), (counts_t - 1).clamp_min(0)]
            keep = upload([c > 0 for c in counts], torch.bool, device)[:, None]
            self._carry[index] = newest if old_carry is None else torch.where(keep, newest, old_carry)
            self._has[index] = [h or c > 0 for h, c in zip(old_has, counts)]
        frontier = out[:, width] if token is not None else None
        return committed, counts, starts, frontier, old_carry, old_has

    def _tokens_at(self, positions: torch.Tensor) -> torch.Tensor:
        """The committed tokens at real ``positions [B, n]`` (clamped into the rows: hole columns read anything)."""
        rows = self._rows
        at = upload(self._pads, torch.long, positions.device)[:, None] + positions
        return rows.tokens.gather(1, at.clamp(0, rows.tokens.shape[1] - 1))

    def _draft(self, hidden: torch.Tensor, contexts: list, ctx: DraftContext, probs: list) -> torch.Tensor:
        """The next draft from MTP output ``hidden [B, H]`` through the shared LM head (greedy, or sampled from the
        processed scores, whose distribution goes into ``probs``)."""
        logits = self.mtp._project_to_logits(hidden)
        if not (ctx.do_sample or ctx.processors):
            vocab = ctx.vocab_size or logits.shape[-1]
            return logits[..., :vocab].argmax(dim=-1)
        scores = processed_scores(logits, contexts, ctx)
        if not ctx.do_sample:
            return scores.argmax(dim=-1)
        q = draft_distribution(scores)
        probs.append(q)
        return torch.multinomial(q, 1, generator=ctx.generator).squeeze(-1)

    def commit(self, update: Commit) -> None:
        for session, extra in zip(self._sessions, self._provisional):
            if extra:  # frontier / recursive slots: drafts' context, gone now
                session.rollback(session.length - extra)
        self._provisional = [0] * len(self._provisional)
        if update.hidden is None:
            raise ValueError("the MTP drafter needs the verifier's hidden states in every Commit")
        added = list(update.added_host)
        if self._block is None:  # the usual case: the pass's states, row b's first added[b] of them
            self._block, self._offsets, self._counts = update.hidden, [0] * len(added), added
            return
        # states not fed yet (another drafter proposed: composite): each row's old ones, then its new ones
        old = self._block
        rows = [torch.cat([old[b, o : o + c], update.hidden[b, :n]]) for b, (o, c, n) in
                enumerate(zip(self._offsets, self._counts, added))]
        counts = [len(r) for r in rows]
        self._block = torch.zeros(len(rows), max(counts), old.shape[-1], dtype=old.dtype, device=old.device)
        for b, r in enumerate(rows):
            self._block[b, : len(r)] = r
        self._offsets, self._counts = [0] * len(rows), counts

    def keep_rows(self, indices: torch.Tensor) -> None:
        index = indices.tolist()
        for i, session in enumerate(self._sessions):
            session.keep_rows(index)
            if self._carry[i] is not None:
                self._carry[i] = self._carry[i].index_select(0, upload(index, torch.long, self._carry[i].device))
            self._has[i] = [self._has[i][j] for j in index]
        if self._block is not None:
            self._block = self._block.index_select(0, upload(index, torch.long, self._block.device))
        self._offsets = [self._offsets[j] for j in index]
        self._counts = [self._counts[j] for j in index]
        self._fed = [self._fed[j] for j in index]
        self._pads = [self._pads[j] for j in index]

    def stats(self) -> dict[str, float]:
        return {"mtp_layers": float(self.num_mtp_layers)}

    def finish(self) -> None:
        for session in self._sessions:
            session.release()
        self._reset()
