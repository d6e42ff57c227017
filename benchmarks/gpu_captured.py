"""gpu_check's ``captured`` stage (v3, issue 58): the deciding rows first, with raw CUDA graphs.

Per model, each row written as it finishes: ``hf-compiled`` (transformers' static cache + ``torch.compile``, the
bar), the oracle at k=4 with ``compile_verifier="graphs"`` (free drafts: the engine's ceiling with captured verify
passes), then the random EAGLE-3 head with ``compile_drafter="graphs"`` over that verifier at SIMULATED 2 / 3 / 4
tokens a pass, then sync warnings per pass at batch 1 and 3 in that configuration, last the oracle and SIMULATED 3
with inductor's fused kernels inside the verifier's graphs (``fuse``: each shape compiles at its first pass). Every row records the graphs it
captured and their capture seconds (``graphs``, ``capture_seconds``). On a CPU the same code runs the stand-in
(:mod:`specdec.runners.capture`): the rows then check the code paths, not speed.
"""

from __future__ import annotations

import time
from typing import Any

GRAPHS = {"compile_verifier": "graphs"}


def stage_captured(entry: dict[str, Any], model: Any, state: dict[str, Any], args: Any, tools: Any) -> None:
    """The deciding rows of issue 58 for one model (``tools``: gpu_check's module, for its shared helpers)."""
    from specdec.api import SpeculativeModel
    from specdec.drafters import AcceptanceProfile, OracleDrafter
    from specdec.drafters.eagle import EagleDrafter

    device, k = model.device, args.drafter_k
    ids, mask = tools.random_prompt(int(model.config.vocab_size), args.prompt_tokens, device)
    gen, warm = tools._gen_kwargs(args.new_tokens), tools._gen_kwargs(min(8, args.new_tokens))
    rows: list[dict[str, Any]] = []
    entry.update(k=k, new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens, rows=rows,
                 capture="raw torch.cuda.CUDAGraph" if device.type == "cuda" else "stand-in (eager, same buffers)")
    baselines = state.setdefault("baselines", {})
    curve = state.get("curve")
    reference = tools._reference(model, ids, mask, args.new_tokens, state)
    expected = reference[ids.shape[1]:].tolist()

    # 1. hf-compiled: the bar every ratio of this stage is taken against
    if not baselines.get("hf-compiled"):
        tools._hf_compiled_row(entry, model, args, rows, ids, mask, gen, curve, expected, state)
    else:
        entry["hf_compiled_note"] = "measured by an earlier stage of this run"
    tools.report_write()

    # 2. the oracle at k=4 (every draft right) with captured verify passes
    def oracles(label: str, options: dict[str, Any]) -> None:
        """The oracle at every ``--ks`` with these verifier options (every draft accepted), primed first."""
        for kk in args.ks:
            row: dict[str, Any] = {"method": f"specdec[oracle,k={kk},{label}]", "status": "running"}
            rows.append(row)
            spec = SpeculativeModel(model, OracleDrafter(reference.unsqueeze(0)), num_draft_tokens=kk, **options)
            t0 = time.perf_counter()
            spec.prime_verifier(args.new_tokens, [ids.shape[1]])
            row["prime_seconds"] = tools._r(time.perf_counter() - t0, 2)
            _oracle_row(row, spec, model, ids, mask, gen, warm, expected, kk, args, tools, curve)
            _ratios(rows, baselines)
            tools.report_write()

    oracles("graphs", GRAPHS)

    # 3. the head at SIMULATED acceptance, head and verifier captured
    head = EagleDrafter(tools.random_eagle3(model), model)
    head.compile_graphs()
    for tokens in args.sim_tokens:
        profile = AcceptanceProfile.for_tokens_per_pass(tokens, k)
        row = {"method": "SIMULATED", "simulated": True, "profile": profile.name, "drafter": HEAD_GRAPHS,
               "verifier": "graphs", "expected_tokens_per_pass": tools._r(profile.expected_tokens_per_pass(k), 3),
               "status": "running"}
        rows.append(row)
        try:
            spec = tools._simulated_row(row, model, head, HEAD_GRAPHS, profile, GRAPHS, ids, mask, reference, args, state)
            row.update(_graph_figures(spec, head))
        except Exception as e:  # a row's failure is a finding; the next rows still run (a timeout ends the stage)
            row.update(status="error", error=tools._one_line(e))
        _ratios(rows, baselines)
        tools.report_write()

    # 4. syncs per pass with everything captured, batch 1 and 3
    entry["syncs"] = {}
    for batch in (1, 3):
        entry["syncs"][f"batch_{batch}"] = sync_warnings(model, head, args, tools, batch)
        tools.report_write()

    # 5. fused kernels inside the graphs (inductor, compiled at each shape's first pass): the oracle and SIMULATED 3
    fused = {"compile_verifier": {"backend": "graphs", "fuse": True,
                                  "fuse_backend": "inductor" if device.type == "cuda" else "eager"}}
    oracles("graphs+fused", fused)
    profile = AcceptanceProfile.for_tokens_per_pass(3.0, k)
    row = {"method": "SIMULATED", "simulated": True, "profile": profile.name, "drafter": HEAD_GRAPHS,
           "verifier": "graphs+fused", "expected_tokens_per_pass": tools._r(profile.expected_tokens_per_pass(k), 3),
           "status": "running"}
    rows.append(row)
    spec = tools._simulated_row(row, model, head, HEAD_GRAPHS, profile, fused, ids, mask, reference, args, state)
    row["method"] += "+fused"
    row.update(_graph_figures(spec, head))
    _ratios(rows, baselines)
    tools.report_write()


HEAD_GRAPHS = "eagle3 (random head, compile_drafter=graphs)"


def _oracle_row(row: dict[str, Any], spec: Any, model: Any, ids: Any, mask: Any, gen: dict[str, Any],
                warm: dict[str, Any], expected: list[int], k: int, args: Any, tools: Any, curve: Any) -> None:
    """The oracle's timed runs (every draft accepted), recalibrated on specdec's own output after a bf16 near-tie:
    a pass of k + 1 tokens may round a near-tie of generate's one-token steps the other way (stage 3 does the same)."""
    import torch

    from specdec.drafters import OracleDrafter
    from specdec.eval.measure import Runner
    from specdec.eval.methods import MethodSpec

    runner = Runner(MethodSpec("specdec", "oracle", k), model, spec=spec)
    runner(ids, warm, None, mask)
    probe = runner(ids, gen, None, mask)[0]
    identical, calibrations = probe.output_ids == expected, 0
    while tools._acceptance(probe) < 1.0 and calibrations < 4:
        calibrations += 1
        spec.drafter = OracleDrafter(torch.cat([ids[0].cpu(), torch.tensor(
            probe.output_ids, dtype=torch.long, device="cpu")]).unsqueeze(0))
        probe = runner(ids, gen, None, mask)[0]
    measured, seconds = tools._median_run(runner, ids, mask, gen, args.repeats)
    row.update(tools._row(row["method"], measured, seconds, curve, k=k), status="ok", identical_to_generate=identical,
               calibration_runs=calibrations, **_graph_figures(spec))


def _graph_figures(spec: Any, head: Any = None) -> dict[str, Any]:
    """The graphs this row's verifier (and head) captured so far and the seconds each took."""
    static = spec.verifier.static
    figures: dict[str, Any] = {"graphs": static.graphs if static else 0,
                               "capture_seconds": [round(s, 3) for s in (static.capture_seconds if static else [])],
                               "capture_failed": static.failed if static else None}
    # the GPU's own time per replay of the widest graph of each phase: a pass's ms beyond them is the host's
    verify = [c.graphs for caches in (static._free.values() if static else []) for c in caches if hasattr(c, "graphs")]
    figures["verify_replay_ms"] = _widest_replay_ms(verify)
    if head is not None and head._graph_caches is not None:
        drafts = [c.graphs for caches in head._graph_caches.values() for c in caches]
        figures.update(draft_graphs=sum(g.graphs for g in drafts),
                       draft_capture_seconds=[round(s, 3) for g in drafts for s in g.capture_seconds],
                       draft_capture_failed=next((g.failed for g in drafts if g.failed), None),
                       draft_replay_ms=_widest_replay_ms(drafts))
    return figures


def _widest_replay_ms(graphs: list[Any]) -> float | None:
    """ms per replay of the graph with the longest replay among ``graphs`` (None without real graphs: a CPU)."""
    times = [ms for g in graphs for ms in g.replay_ms().values()]
    return round(max(times), 3) if times else None


def _ratios(rows: list[dict[str, Any]], baselines: dict[str, Any]) -> None:
    for r in rows:
        if baselines.get("hf-compiled") and r.get("tokens_per_s") and r["method"] != "hf-compiled":
            r["vs_hf_compiled"] = round(r["tokens_per_s"] / baselines["hf-compiled"], 3)
        if baselines.get("hf") and r.get("tokens_per_s"):
            r["vs_hf"] = round(r["tokens_per_s"] / baselines["hf"], 3)


def sync_warnings(model: Any, head: Any, args: Any, tools: Any, batch: int) -> dict[str, Any]:
    """Sync warnings per steady pass (``torch.cuda.set_sync_debug_mode("warn")``; HostTrace's count beside) for one
    greedy call of ``batch`` rows (ragged: row ``b`` is ``b`` tokens shorter) with the captured head at SIMULATED 3
    tokens a pass and captured verify passes."""
    import torch

    from specdec.api import SpeculativeModel
    from specdec.drafters import AcceptanceProfile, SimulatedDrafter

    device, k, new = model.device, args.drafter_k, args.sync_new_tokens
    ids, _ = tools.random_prompt(int(model.config.vocab_size), args.prompt_tokens, device, seed=3)
    ids = ids.expand(batch, -1).clone()
    mask = torch.ones_like(ids)
    for b in range(batch):
        mask[b, :b] = 0  # left padding: a ragged batch
    sim = SimulatedDrafter(head, AcceptanceProfile.for_tokens_per_pass(min(3.0, k + 1.0), k), name=HEAD_GRAPHS)
    sim.prepare(model, ids, mask, max_new_tokens=new, pad_token_id=0, eos_token_id=None)
    spec = SpeculativeModel(model, sim, num_draft_tokens=k, **GRAPHS)
    spec.generate(ids, attention_mask=mask, **tools._gen_kwargs(new))  # warm-up: captures every graph the call meets
    counts = tools.count_syncs(spec, ids, mask, new)
    keep = ("passes", "tokens_per_pass", "sync_warnings_per_pass", "sync_warnings_by_pass", "sync_warning_sites",
            "host_trace_syncs_per_pass", "host_trace_uploads_per_pass", "host_trace_ops_per_pass", "host_trace_sites")
    return {"batch": batch, **{key: counts[key] for key in keep},
            "graphs": spec.verifier.static.graphs if spec.verifier.static else 0}
