"""The token index behind suffix decoding: where each short n-gram ends, and the continuations of a context's suffix.

Pure Python over token ids (no torch). A :class:`TokenIndex` holds sequences of token ids and, for every position
and every n in :data:`LEVELS`, the position where that n-gram ends (keyed by the n-gram's hash; a collision costs
a wasted candidate, never a wrong draft, since every candidate is checked token by token). A query
(:meth:`TokenIndex.match`) takes the longest indexed n-gram that ends the context, checks how far back each of its
most recent occurrences (at most :data:`MAX_CANDIDATES`) agrees with the context (at most :data:`MAX_MATCH`
tokens), and counts what followed them in a :class:`Continuations` trie: the occurrences of the longest suffix
found, and of the key n-gram alone. Drafts are read from those counts (:meth:`Continuations.chain`,
:meth:`Continuations.tree`): most frequent first, as long as the match allows (``factor * match length``).

Why an n-gram index and not a suffix tree: a suffix tree of depth D costs D nodes a token (Python dicts: hundreds
of bytes each), while this costs one list slot per level; a query is a few dict reads and at most
:data:`MAX_CANDIDATES` slice comparisons, small beside a verify pass (docs/suffix.md has the measurements).
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field

#: the n-gram lengths indexed at every position, shortest first (a query tries the longest first)
LEVELS = (1, 2, 4)
#: how far back a match is checked (the draft length follows it, so longer matches change nothing)
MAX_MATCH = 32
#: the most recent occurrences of a key a query looks at (bounds a query's cost on very common n-grams)
MAX_CANDIDATES = 64
#: a position is ``sequence id << SHIFT | offset``: codes grow with insertion order (FIFO eviction bisects them)
SHIFT = 32
_OFFSET = (1 << SHIFT) - 1


def _key(tokens: list[int] | tuple[int, ...]) -> int:
    """The index key of an n-gram (its length is part of the tuple's hash through its items)."""
    return hash(tuple(tokens))


@dataclass
class Continuations:
    """What followed the occurrences of one matched suffix: a trie of counts over ``total`` occurrences.

    ``nodes[i] = (token, parent, count)`` (parent -1: the root); ``match``: the matched suffix's length.
    """

    match: int
    total: int
    nodes: list[tuple[int, int, int]] = field(default_factory=list)
    children: dict[int, dict[int, int]] = field(default_factory=dict)  # node (-1: root) -> token -> node

    def add(self, path: list[int]) -> None:
        """Count one occurrence's continuation."""
        parent = -1
        for token in path:
            kids = self.children.setdefault(parent, {})
            node = kids.get(token)
            if node is None:
                node = kids[token] = len(self.nodes)
                self.nodes.append((token, parent, 1))
            else:
                t, p, c = self.nodes[node]
                self.nodes[node] = (t, p, c + 1)
            parent = node

    def limit(self, depth: int, factor: float, offset: float) -> int:
        """How deep a draft from this match may go: ``factor * match + offset``, at least 1, at most ``depth``."""
        return max(1, min(depth, int(factor * self.match + offset + 1e-9)))

    def chain(self, depth: int, min_prob: float) -> tuple[list[int], float]:
        """The most frequent path, ``depth`` tokens at most, stopping where its share of the occurrences falls
        below ``min_prob``; returns ``(tokens, score)``, the score being the sum of those shares."""
        out, score, node = [], 0.0, -1
        while len(out) < depth:
            kids = self.children.get(node)
            if not kids:
                break
            best = max(kids.values(), key=lambda i: (self.nodes[i][2], -i))
            prob = self.nodes[best][2] / self.total
            if prob < min_prob:
                break
            out.append(self.nodes[best][0])
            score += prob
            node = best
        return out, score

    def tree(self, depth: int, size: int, min_prob: float) -> tuple[list[int], list[int], list[float], float]:
        """The ``size`` most frequent nodes (best first, each after its parent), ``depth`` deep at most and worth at
        least ``min_prob``: ``(tokens, parents, probs, score)`` with parents indexing this list (-1: the root)."""
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[float] = []
        heap = [(-self.nodes[i][2], i, -1, 1) for i in self.children.get(-1, {}).values()]
        heapq.heapify(heap)
        while heap and len(tokens) < size:
            count, node, parent, level = heapq.heappop(heap)
            prob = -count / self.total
            if prob < min_prob:
                break
            tokens.append(self.nodes[node][0])
            parents.append(parent)
            probs.append(prob)
            if level < depth:
                here = len(tokens) - 1
                for child in self.children.get(node, {}).values():
                    heapq.heappush(heap, (-self.nodes[child][2], child, here, level + 1))
        return tokens, parents, probs, sum(probs)


class TokenIndex:
    """Sequences of token ids with an n-gram end index over them (see the module docstring). Not thread-safe:
    :class:`~specdec.drafters.suffix.SuffixCache` locks around it; a per-call index belongs to one call."""

    def __init__(self) -> None:
        self.seqs: dict[int, array] = {}  # int32 token arrays (4 bytes a token), in insertion order: the oldest first
        # n-gram key -> its position code, or its codes ascending once it has several (int64: 8 bytes each): most
        # long n-grams occur once, and a bare int costs less than an array
        self.ends: dict[int, int | array] = {}
        self.tokens = 0

    def extend(self, sid: int, tokens: list[int]) -> None:
        """Append ``tokens`` to sequence ``sid`` (a new sequence gets an id above every live one) and index them."""
        seq = self.seqs.setdefault(sid, array("i"))
        start = len(seq)
        seq.extend(tokens)
        self.tokens += len(tokens)
        base, ends = sid << SHIFT, self.ends
        for i in range(start, len(seq)):
            for n in LEVELS:
                if i + 1 < n:
                    break
                key = _key(seq[i + 1 - n : i + 1])
                codes = ends.get(key)
                if codes is None:
                    ends[key] = base | i
                elif type(codes) is int:
                    ends[key] = array("q", (codes, base | i))
                else:
                    codes.append(base | i)

    def remove_oldest(self) -> int:
        """Drop the oldest sequence and its index entries (they lead every list they are in); returns its length."""
        sid = next(iter(self.seqs))
        seq = self.seqs.pop(sid)
        self.tokens -= len(seq)
        bound, ends = (sid + 1) << SHIFT, self.ends
        for i in range(len(seq)):
            for n in LEVELS:
                if i + 1 < n:
                    break
                key = _key(seq[i + 1 - n : i + 1])
                codes = ends.get(key)
                if codes is None:
                    continue
                if type(codes) is int:
                    if codes < bound:
                        del ends[key]
                    continue
                cut = bisect_left(codes, bound)
                if cut == len(codes):
                    del ends[key]
                elif cut:
                    del codes[:cut]
        return len(seq)

    def match(self, context: list[int], depth: int) -> list[Continuations]:
        """The continuations (``depth`` tokens each) of the longest indexed suffix of ``context``: for the longest
        suffix found and, when shorter, for the key n-gram alone (more occurrences, a shorter allowed draft).
        Empty when no suffix of ``context`` occurs with a continuation."""
        context = array("i", context[-MAX_MATCH:])  # a match looks no further back; arrays compare in C
        size = len(context)
        for n in reversed(LEVELS):
            if n > size:
                continue
            codes = self.ends.get(_key(context[size - n :]))
            if codes is None:
                continue
            found = self._extend(context, (codes,) if type(codes) is int else codes[-MAX_CANDIDATES:], n, depth)
            if not found:
                continue
            longest = max(m for m, _ in found)
            out = [self._count(found, longest, depth)]
            if longest > n:
                out.append(self._count(found, n, depth))
            return out
        return []

    def _extend(self, context: array, codes: array | tuple[int], n: int, depth: int) -> list[tuple[int, list[int]]]:
        """``(match length, continuation)`` of each occurrence that agrees with ``context`` on at least ``n``
        tokens and has something after it."""
        seqs, size, out = self.seqs, len(context), []
        tail = context[size - n :]
        for code in codes:
            seq, end = seqs.get(code >> SHIFT), code & _OFFSET
            if seq is None or end + 1 >= len(seq) or seq[end + 1 - n : end + 1] != tail:
                continue  # evicted, nothing follows it (the context's own end), or a hash collision
            # how far back it agrees: doubling slice comparisons, then halving (C-speed compares, not a token loop)
            most = min(MAX_MATCH, end + 1, size)
            lo, hi = n, n
            while hi < most:
                nxt = min(most, hi * 2)
                if seq[end + 1 - nxt : end + 1 - hi] != context[size - nxt : size - hi]:
                    break
                lo = hi = nxt
            else:
                out.append((hi, seq[end + 1 : end + 1 + depth].tolist()))
                continue
            top = min(most, hi * 2)  # agrees on lo tokens, not on top
            while top - lo > 1:
                mid = (lo + top) // 2
                if seq[end + 1 - mid : end + 1 - lo] == context[size - mid : size - lo]:
                    lo = mid
                else:
                    top = mid
            out.append((lo, seq[end + 1 : end + 1 + depth].tolist()))
        return out

    @staticmethod
    def _count(found: list[tuple[int, list[int]]], at_least: int, depth: int) -> Continuations:
        picked = [path for m, path in found if m >= at_least]
        trie = Continuations(match=at_least, total=len(picked))
        for path in picked:
            trie.add(path)
        return trie
