"""Ragged-batch KV cache layouts: one shared write pointer vs per-row write pointers.

Measures the steady state of batched speculative verification with two cache layouts:

(a) ``shared`` -- specdec's :class:`~specdec.runners.session.CacheSession`, used as is: every row
    writes its block into the same slot range, rejected drafts become holes hidden by the 2-D
    attention mask, position ids are per row, and ``compact()`` gathers the holes out when the
    slots run out (its cost is counted in the pass that triggers it).
(b) ``per-row`` -- :class:`RowPointerRunner` below: each row scatters its block at its own write
    pointer, the attention sees slots up to ``max(row pointer) + n`` with a per-row 4-D mask
    (left padding and slots past the row's own end are masked, causality per row), per-row
    position ids, rollback = per-row pointer moves, never any compaction.

Before timing, the script asserts on a tiny random Llama (fp32, sdpa and eager attention) that (b)
returns the same logits as (a) over ragged steps, including a step where (a) compacts.

Workload per batch size: random prompts of ragged lengths (left padded; one prefill, copied into a
fresh cache for every run and not timed), then ``--passes`` verify passes of k+1 = 7 tokens where
each row keeps ``1 + accepted`` of them, ``accepted`` uniform in 0..6 (seeded, the same sequence for
both layouts). Slots are sized like the engine sizes them (``specdec.slots.cache_slots``). The two
layouts are interleaved pass by pass (AB, BA, AB, ... within a run, the order flipped every repeat)
after a short warm-up, so load from other processes hits both alike. The table gives the median
over repeats of the mean wall time per pass (forward + keep, compaction included), the ratio b/a
(< 1: per-row is faster), and a "best-of" time (each pass's fastest repeat, averaged over passes),
which filters out bursts of CPU contention.

    python benchmarks/cache_layouts.py                       # SmolLM2-135M at B=4,8,16 + tiny Llama at B=4
    python benchmarks/cache_layouts.py --batch-sizes 4 --passes 30 --repeats 2 --json /tmp/layouts.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin

from specdec.slots import cache_slots
from specdec.runners.cache import CacheOverflowError
from specdec.runners.hf import CausalLMRunner
from specdec.runners.session import CacheSession

K = 6  # drafts per pass; each verify pass feeds k + 1 tokens per row

# --------------------------------------------------------------------------------------------
# Layout (b): per-row write pointers
# --------------------------------------------------------------------------------------------


class RowPointerLayer(CacheLayerMixin):
    """One layer's ``[batch, kv_heads, slots, head_dim]`` buffers; rows write at their own offsets."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, owner: "RowPointerCache") -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads = key_states.shape[:2]
        slots = self.owner.max_cache_len
        # zeros, not empty: slots past a row's end are read (masked) and must not hold NaN/inf bit patterns
        self.keys = key_states.new_zeros(batch, heads, slots, key_states.shape[-1])
        self.values = value_states.new_zeros(batch, value_states.shape[1], slots, value_states.shape[-1])
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        index = self.owner.write_index  # [batch, n]: slot of each new token of each row
        for buf, new in ((self.keys, key_states), (self.values, value_states)):
            buf.scatter_(2, index[:, None, :, None].expand(new.shape), new)
        end = self.owner.end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.seen

    def get_max_length(self) -> int:
        return self.owner.max_cache_len


class RowPointerCache(Cache):
    """A transformers ``Cache`` whose layers write where :meth:`prepare` says (set once per forward)."""

    def __init__(self, num_layers: int, max_cache_len: int) -> None:
        super().__init__(layers=[RowPointerLayer(self) for _ in range(num_layers)])
        self.max_cache_len = int(max_cache_len)
        self.write_index = torch.empty(0, 0, dtype=torch.long)
        self.seen = 0  # slots before this forward that some row uses (= max row pointer)
        self.end = 0  # slots attention reads in this forward (= max row pointer + n)

    def prepare(self, write_index: torch.Tensor, seen: int) -> None:
        self.write_index, self.seen, self.end = write_index, seen, seen + write_index.shape[1]


class RowPointerRunner:
    """Same driving interface as ``CausalLMRunner`` (``prefill``/``forward``/``keep``/``counts``), per-row pointers.

    Row ``b`` holds its left padding in slots ``[0, pad[b])`` and its real tokens, without holes, in
    ``[pad[b], ptr[b])``; ``counts[b] = ptr[b] - pad[b]``.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.cache: RowPointerCache | None = None
        self.pad = self.ptr = self.counts = torch.empty(0, dtype=torch.long)
        impl = getattr(model.config, "_attn_implementation", "sdpa")
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"per-row masks need sdpa or eager attention, not {impl}")
        self._bool_mask = impl == "sdpa"

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @torch.inference_mode()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_len: int) -> torch.Tensor:
        """Run the left-padded prompt (all pointers equal, so transformers' own 2-D mask applies)."""
        batch, width = input_ids.shape
        self.cache = RowPointerCache(self.num_layers, max_len)
        valid = attention_mask.bool()
        self.counts = valid.sum(dim=1)
        self.pad = width - self.counts
        self.ptr = torch.full((batch,), width, dtype=torch.long)
        positions = (valid.long().cumsum(dim=1) - 1).clamp_min(0)
        self.cache.prepare(torch.arange(width).expand(batch, width), 0)
        out = self.model(input_ids=input_ids, attention_mask=None if bool(valid.all()) else valid.long(),
                         position_ids=positions, past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        return out.logits[:, -1]

    @torch.inference_mode()
    def adopt(self, source: CacheSession, max_len: int) -> None:
        """Start from ``source``'s freshly prefilled (left padded, hole-free) cache instead of a prefill."""
        width = source.length
        self.cache = RowPointerCache(self.num_layers, max_len)
        for mine, theirs in zip(self.cache.layers, source.cache.layers):
            mine.lazy_initialization(theirs.keys, theirs.values)
            mine.keys[:, :, :width].copy_(theirs.keys[:, :, :width])
            mine.values[:, :, :width].copy_(theirs.values[:, :, :width])
        self.counts = source.counts.clone()
        self.pad = width - self.counts
        self.ptr = torch.full_like(self.counts, width)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens [batch, n]`` at each row's own pointer; return logits ``[batch, n, vocab]``."""
        n = tokens.shape[1]
        seen = int(self.ptr.max())
        end = seen + n
        if end > self.cache.max_cache_len:
            raise CacheOverflowError(f"{n} more tokens after slot {seen} in a cache of {self.cache.max_cache_len}")
        steps = torch.arange(n)
        index = self.ptr.unsqueeze(1) + steps  # [batch, n]
        slots = torch.arange(end)
        # query j of row b sees its real slots [pad[b], ptr[b] + j]: its past and its block up to itself
        allowed = (slots >= self.pad[:, None, None]) & (slots <= index[:, :, None])  # [batch, n, end]
        if self._bool_mask:
            mask = allowed.unsqueeze(1)
        else:
            dtype = self.model.dtype
            mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min).unsqueeze(1)
        self.cache.prepare(index, seen)
        out = self.model(input_ids=tokens, attention_mask=mask, position_ids=self.counts.unsqueeze(1) + steps,
                         past_key_values=self.cache, use_cache=True)
        self.ptr = self.ptr + n
        self.counts = self.counts + n
        return out.logits

    def keep(self, counts: torch.Tensor) -> None:
        """Keep the first ``counts[b]`` real tokens of each row: a per-row pointer move."""
        counts = torch.as_tensor(counts, dtype=torch.long)
        if bool((counts > self.counts).any()):
            raise ValueError(f"cannot keep {counts.tolist()} tokens: rows hold only {self.counts.tolist()}")
        self.counts = counts
        self.ptr = self.pad + counts

    @property
    def span(self) -> int:
        """Slots attention will read next pass, before adding the new block."""
        return int(self.ptr.max())


# --------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------


def tiny_llama(seed: int, attn: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, attn_implementation=attn)
    return LlamaForCausalLM(config).eval()


@dataclass
class Workload:
    input_ids: torch.Tensor  # [batch, width], left padded
    attention_mask: torch.Tensor  # [batch, width]
    blocks: torch.Tensor  # [passes, batch, k + 1] tokens fed per verify pass
    accepted: torch.Tensor  # [passes, batch] drafts accepted per pass (0..k)
    slots: int


def make_workload(vocab: int, batch: int, min_len: int, max_len: int, passes: int, seed: int) -> Workload:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (batch,), generator=g)
    width = int(lengths.max())
    ids = torch.randint(1, vocab, (batch, width), generator=g)
    mask = (torch.arange(width) >= (width - lengths).unsqueeze(1)).long()
    ids = ids * mask  # pad id 0 (masked anyway)
    accepted = torch.randint(0, K + 1, (passes, batch), generator=g)
    blocks = torch.randint(1, vocab, (passes, batch, K + 1), generator=g)
    # the engine's max_length: the longest row after prefill's first token and every pass's 1 + accepted
    max_length = width + 1 + int((accepted + 1).sum(dim=0).max())
    slots = cache_slots(batch, width, max_length, K)
    return Workload(ids, mask, blocks, accepted, slots)


@dataclass
class Run:
    seconds: float  # all passes
    pass_seconds: list[float]  # each pass
    mean_span: float  # mean key slots attended per pass
    compactions: int


LAYOUTS = ("shared", "per-row")


def run_pair(model: PreTrainedModel, prefilled: CacheSession, wl: Workload, passes: int | None = None,
             flip: bool = False) -> dict[str, Run]:
    """Drive both layouts through ``passes`` verify passes (default all) of ``wl`` in lockstep.

    Each starts from a copy of the prefilled cache; pass ``p`` of one layout runs right before or
    after pass ``p`` of the other (order alternating per pass), so CPU contention from other
    processes hits both alike.
    """
    shared = CausalLMRunner(model).adopt(prefilled, wl.slots)
    per_row = RowPointerRunner(model)
    per_row.adopt(prefilled, wl.slots)
    runners: dict[str, CacheSession | RowPointerRunner] = {"shared": shared, "per-row": per_row}
    n = wl.blocks.shape[2]
    times: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    spans: dict[str, list[int]] = {k: [] for k in LAYOUTS}
    compactions = 0
    for p in range(wl.blocks.shape[0] if passes is None else passes):
        for layout in (LAYOUTS if (p + flip) % 2 == 0 else LAYOUTS[::-1]):
            runner = runners[layout]
            fed = runner.counts
            before = shared.length if layout == "shared" else per_row.span
            t0 = time.perf_counter()
            runner.forward(wl.blocks[p])
            span = shared.length if layout == "shared" else before + n  # key slots this pass attended
            runner.keep(fed + wl.accepted[p] + 1)  # last committed token + accepted drafts stay
            times[layout].append(time.perf_counter() - t0)
            spans[layout].append(span)
            if layout == "shared" and span != before + n:
                compactions += 1
    return {k: Run(sum(times[k]), times[k], statistics.fmean(spans[k]), compactions if k == "shared" else 0)
            for k in LAYOUTS}


@dataclass
class Row:
    model: str
    batch: int
    prompt_width: int
    slots: int
    passes: int
    shared_ms: list[float] = field(default_factory=list)  # mean ms per pass, one per repeat
    per_row_ms: list[float] = field(default_factory=list)
    shared_best_ms: float = 0.0  # mean over passes of each pass's fastest repeat (filters CPU contention)
    per_row_best_ms: float = 0.0
    shared_span: float = 0.0
    per_row_span: float = 0.0
    shared_compactions: int = 0

    @property
    def shared_median(self) -> float:
        return statistics.median(self.shared_ms)

    @property
    def per_row_median(self) -> float:
        return statistics.median(self.per_row_ms)

    @property
    def ratio(self) -> float:
        return self.per_row_median / self.shared_median


def measure(name: str, model: PreTrainedModel, vocab: int, batch: int, args: argparse.Namespace) -> Row:
    wl = make_workload(vocab, batch, args.min_prompt, args.max_prompt, args.passes, args.seed + batch)
    prefilled, _ = CausalLMRunner(model).prefill(wl.input_ids, wl.attention_mask, wl.input_ids.shape[1])
    row = Row(name, batch, wl.input_ids.shape[1], wl.slots, args.passes)
    per_pass: dict[str, list[list[float]]] = {"shared": [], "per-row": []}
    run_pair(model, prefilled, wl, passes=min(3, args.passes))  # warm-up
    for rep in range(args.repeats):
        runs = run_pair(model, prefilled, wl, flip=rep % 2 == 1)
        for layout, run in runs.items():
            per_pass[layout].append(run.pass_seconds)
        row.shared_ms.append(1000 * runs["shared"].seconds / args.passes)
        row.per_row_ms.append(1000 * runs["per-row"].seconds / args.passes)
        row.shared_span, row.shared_compactions = runs["shared"].mean_span, runs["shared"].compactions
        row.per_row_span = runs["per-row"].mean_span
        print(f"  {name} B={batch} rep {rep}: shared {row.shared_ms[-1]:8.2f}  per-row {row.per_row_ms[-1]:8.2f} ms/pass",
              file=sys.stderr, flush=True)
    best = {k: 1000 * statistics.fmean(min(ts) for ts in zip(*v)) for k, v in per_pass.items()}
    row.shared_best_ms, row.per_row_best_ms = best["shared"], best["per-row"]
    return row


# --------------------------------------------------------------------------------------------
# Correctness: (b) must reproduce (a)'s logits
# --------------------------------------------------------------------------------------------


def check_equivalence(seed: int = 0, steps: int = 10) -> float:
    """Assert per-row-pointer logits equal shared-pointer logits on a tiny random Llama; return the max |diff|."""
    worst = 0.0
    for attn in ("sdpa", "eager"):
        model = tiny_llama(seed, attn)
        wl = make_workload(1000, 4, 3, 14, steps, seed)
        width = wl.input_ids.shape[1]
        b = RowPointerRunner(model)
        # the fewest shared-pointer slots that cannot overflow, so that (a) runs out of slots and compacts
        a, first = CausalLMRunner(model).prefill(wl.input_ids, wl.attention_mask,
                                                 width + int((wl.accepted + 1).sum(dim=0).max()) + K + 1)
        la = first.logits
        lb = b.prefill(wl.input_ids, wl.attention_mask, width + (steps + 1) * (K + 1))
        diffs = [(la - lb).abs().max()]
        assert torch.allclose(la, lb, rtol=1e-4, atol=1e-5), "prefill logits differ"
        compacted = False
        for p in range(steps):
            before = a.length
            fa, fb = a.counts, b.counts
            la, lb = a.forward(wl.blocks[p]).logits, b.forward(wl.blocks[p])
            compacted |= a.length != before + wl.blocks.shape[2]
            assert torch.allclose(la, lb, rtol=1e-4, atol=1e-5), f"{attn}: logits differ at step {p}"
            diffs.append((la - lb).abs().max())
            a.keep(fa + wl.accepted[p] + 1)
            b.keep(fb + wl.accepted[p] + 1)
            assert torch.equal(a.counts, b.counts)
        assert compacted, "the check should cover a compaction of the shared-pointer cache"
        worst = max(worst, float(max(diffs)))
    return worst


# --------------------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| model | batch | prompt width | slots | shared (a) ms/pass | per-row (b) ms/pass | b/a "
        "| best-of a | best-of b | b/a (best-of) | mean span a | mean span b | compactions a |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r.model} | {r.batch} | {r.prompt_width} | {r.slots} | {r.shared_median:.2f} "
                     f"| {r.per_row_median:.2f} | {r.ratio:.3f} | {r.shared_best_ms:.2f} | {r.per_row_best_ms:.2f} "
                     f"| {r.per_row_best_ms / r.shared_best_ms:.3f} | {r.shared_span:.0f} | {r.per_row_span:.0f} "
                     f"| {r.shared_compactions} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", default="4,8,16", help="batch sizes for SmolLM2-135M")
    ap.add_argument("--tiny-batch", type=int, default=4, help="batch size for the tiny random Llama (0: skip)")
    ap.add_argument("--no-smollm", action="store_true", help="skip SmolLM2-135M")
    ap.add_argument("--passes", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-prompt", type=int, default=40)
    ap.add_argument("--max-prompt", type=int, default=400)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    with torch.inference_mode():
        diff = check_equivalence(args.seed)
        print(f"check: per-row logits == shared logits on a tiny random Llama (max |diff| {diff:.2e})", file=sys.stderr)
        rows: list[Row] = []
        if not args.no_smollm:
            from specdec.models import load_model

            model, tok = load_model("smollm2")
            for b in (int(x) for x in args.batch_sizes.split(",") if x):
                rows.append(measure("SmolLM2-135M", model, len(tok), b, args))
            del model
        if args.tiny_batch:
            rows.append(measure("tiny Llama", tiny_llama(args.seed), 1000, args.tiny_batch, args))

    print(f"k+1 = {K + 1} tokens per pass, {args.passes} passes, accepted ~ U(0..{K}), prompts "
          f"{args.min_prompt}..{args.max_prompt} left padded, fp32, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} repeats, layouts interleaved pass by pass\n")
    print(table(rows))
    if args.json:
        data = {"k": K, "passes": args.passes, "repeats": args.repeats, "threads": torch.get_num_threads(),
                "prompt_lengths": [args.min_prompt, args.max_prompt], "max_abs_logit_diff": diff,
                "rows": [asdict(r) | {"shared_median_ms": r.shared_median, "per_row_median_ms": r.per_row_median,
                                      "ratio_per_row_over_shared": r.ratio} for r in rows]}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
