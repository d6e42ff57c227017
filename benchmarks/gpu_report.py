"""gpu_check's markdown report (``gpu_check.md``): one section per stage, rendered from ``gpu_check.json``'s data."""

from __future__ import annotations

from typing import Any



def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> list[str]:
    present = [(key, title) for key, title in columns if any(r.get(key) is not None for r in rows)]
    lines = ["| " + " | ".join(t for _, t in present) + " |", "|" + "---|" * len(present)]
    for r in rows:
        lines.append("| " + " | ".join("-" if r.get(key) is None else str(r[key]) for key, _ in present) + " |")
    return lines


def _status(entry: dict[str, Any]) -> str:
    text = f"**{entry.get('status', '?')}**"
    if entry.get("seconds") is not None:
        text += f" ({entry['seconds']} s)"
    for key in ("error", "note"):
        if entry.get(key):
            text += f"; {key}: {entry[key]}"
    return text


ENGINE_COLUMNS = [("method", "method"), ("tokens_per_s", "tok/s"), ("vs_hf", "vs hf"),
                  ("vs_hf_compiled", "vs hf-compiled"), ("acceptance_rate", "accept"),
                  ("tokens_per_pass", "tok/pass"), ("pass_ms", "ms/pass"), ("verify_ms", "verify ms"),
                  ("overhead_ms", "overhead ms"), ("ceiling_x", "ceiling x"), ("of_ceiling", "of ceiling"),
                  ("identical_to_generate", "= generate"), ("calibration_runs", "recal.")]
DRAFTER_COLUMNS = [("drafter", "drafter"), ("status", "status"), ("draft_step_ms", "ms/draft step"),
                   ("draft_step_over_verifier_step", "vs verifier step"), ("propose_ms", "ms/propose"),
                   ("propose_over_verify_pass", "propose / verify pass"), ("tokens_per_s", "tok/s"),
                   ("acceptance_rate", "accept"), ("build_seconds", "build s"), ("reason", "why not"),
                   ("error", "error")]
SIM_COLUMNS = [("method", "method (SIMULATED acceptance)"), ("verifier", "verifier"),
               ("expected_tokens_per_pass", "profile tok/pass"), ("tokens_per_pass", "tok/pass"),
               ("tokens_per_s", "tok/s"), ("vs_hf", "vs hf"), ("vs_hf_compiled", "vs hf-compiled"),
               ("pass_ms", "ms/pass"), ("verifier_compile_seconds", "compile s"), ("identical_to_generate", "= generate"),
               ("calibration_runs", "recal."), ("graphs_compiled_in_timed_run", "graphs in timed run"),
               ("status", "status"), ("error", "error")]
SYNC_KEYS = [("passes", "passes"), ("tokens_per_pass", "tokens per pass"),
             ("sync_warnings_per_pass", "set_sync_debug_mode warnings per steady pass"),
             ("sync_warnings_before_first_pass", "warnings before the first pass (prefill, start)"),
             ("sync_warnings_total", "warnings in the call"), ("host_trace_syncs_per_pass", "HostTrace syncs per steady pass"),
             ("host_trace_uploads_per_pass", "HostTrace non-blocking uploads per pass"),
             ("host_trace_ops_per_pass", "HostTrace aten ops per pass")]
SPEC_COLUMNS = [("method", "method"), ("prompts", "prompts"), ("tokens_per_s", "tok/s"), ("vs_hf", "vs hf"),
                ("vs_hf_compiled", "vs hf-compiled"), ("acceptance_rate", "accept"), ("tokens_per_pass", "tok/pass"),
                ("identical", "identical")]


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


CAPTURED_COLUMNS = [("method", "method"), ("tokens_per_s", "tok/s"), ("vs_hf_compiled", "vs hf-compiled"),
                    ("expected_tokens_per_pass", "profile tok/pass"), ("tokens_per_pass", "tok/pass"),
                    ("pass_ms", "ms/pass"), ("verify_replay_ms", "verify graph ms"),
                    ("draft_replay_ms", "draft graph ms"), ("graphs", "verify graphs"), ("capture_seconds", "capture s"),
                    ("draft_graphs", "draft graphs"), ("draft_capture_seconds", "draft capture s"),
                    ("identical_to_generate", "= generate"), ("calibration_runs", "recal."), ("status", "status")]


def render_captured(entry: dict[str, Any]) -> list[str]:
    """Section 0 (v3): the deciding rows with raw CUDA graphs, per model."""
    if entry.get("status") == "skipped":
        return ["## 0. Captured phases (raw CUDA graphs)", "", _status(entry), ""]
    lines = ["## 0. Captured phases (raw CUDA graphs): the deciding rows", "", _status(entry), "",
             "`compile_verifier=\"graphs\"` (and `compile_drafter=\"graphs\"` for the head): every verify pass and "
             "greedy chain draft replays a raw `torch.cuda.CUDAGraph` captured at its first use; `capture s`: warm-up "
             "and capture of each graph; `verify graph ms` / `draft graph ms`: the GPU's time per replay of the widest graph "
             "alone (the rest of `ms/pass` is the host's). SIMULATED rows: a chosen acceptance over the random head "
             "(section 7).", ""]
    for name, m in (entry.get("models") or {}).items():
        lines += [f"### {name}", "", _status(m) + (f"; {m['capture']}" if m.get("capture") else ""), ""]
        if m.get("hf_compiled_compile_seconds") is not None:
            lines += [f"hf-compiled: compiled in {m['hf_compiled_compile_seconds']} s (backend "
                      f"{m.get('hf_compiled_backend')}, mode {m.get('hf_compiled_mode')}).", ""]
        if m.get("rows"):
            lines += _table(m["rows"], CAPTURED_COLUMNS) + [""]
        for batch, sync in (m.get("syncs") or {}).items():
            lines += [f"Syncs, {batch.replace('_', ' ')} (k = {m.get('k')}): {sync.get('sync_warnings_per_pass')} "
                      f"sync warnings per steady pass (by pass: {sync.get('sync_warnings_by_pass')}), HostTrace "
                      f"{sync.get('host_trace_syncs_per_pass')} syncs, {sync.get('host_trace_uploads_per_pass')} "
                      f"uploads and {sync.get('host_trace_ops_per_pass')} host-dispatched ops per pass; warning "
                      f"sites {sync.get('sync_warning_sites')}; graphs {sync.get('graphs')}.", ""]
    return lines


def render_markdown(data: dict[str, Any]) -> str:
    lines = ["# specdec GPU check", "", "```", data["command"], "```", "",
             f"Started {data['started']}; {data['timing'].get('elapsed_seconds')} s elapsed of a "
             f"{data['settings'].get('budget_seconds')} s budget. Raw figures: `gpu_check.json`.", ""]
    env = data["environment"]
    lines += ["## 1. Environment", "", _status(env), ""]
    keys = ("device_name", "capability", "memory_gib", "free_memory_gib", "driver", "torch", "cuda", "transformers",
            "accelerate", "safetensors", "numpy", "python", "git_commit", "quant_schemes", "compile_verifier")
    if any(env.get(k) is not None for k in keys):
        lines += ["| | |", "|---|---|"] + [f"| {k} | {env[k]} |" for k in keys if env.get(k) is not None]
        opt = env.get("optional_packages") or {}
        lines += [f"| optional packages | {', '.join(f'{k} {v}' for k, v in opt.items() if v) or '-'} |",
                  f"| missing | {', '.join(k for k, v in opt.items() if not v) or '-'} |", ""]
    lines += render_captured(data["captured"])
    tests = data["cuda_tests"]
    lines += ["## 2. tests/test_cuda.py", "", _status(tests), ""]
    if tests.get("counts"):
        lines += [", ".join(f"{k}: {v}" for k, v in tests["counts"].items()), ""]
        failures = tests.get("failures", [])
        lines += [f"- {f['kind']} `{f['test']}`: {f['reason'][:200]}" for f in failures[:20]]
        if len(failures) > 20:
            lines += [f"- ... {len(failures) - 20} more in gpu_check.json and cuda_tests.log"]
        lines += [""]
    models = data.get("models", {})
    if models:
        lines += ["Models (random weights, built from a config): " + "; ".join(
            f"{n}: {m.get('status')}" + (f", {_params(m['parameters'])} parameters, {m.get('dtype')}"
                                         if m.get("parameters") is not None else "")
            + (f" ({m['error']})" if m.get("error") else "") for n, m in models.items()), ""]
    eng = data["engine_overhead"]
    lines += ["## 3. Engine overhead: oracle drafter (free drafts, all accepted)", "", _status(eng), "",
              "`ms/pass`: decode time per verifier pass (per token for hf); `verify ms`: the verifier's own forward "
              "over k + 1 tokens (stage 5's curve); `overhead ms` the difference; `ceiling x` = (k + 1) / "
              "verify_cost(k + 1) relative to one token; `of ceiling`: decode tokens/s over (k + 1) / verify "
              "seconds. `recal.`: reruns that replayed specdec's own output after a bf16 near-tie.", ""]
    for name, m in (eng.get("models") or {}).items():
        lines += [f"### {name}", "", _status(m), ""]
        if m.get("compile_verifier"):
            lines += [f"compile_verifier: {m['compile_verifier']}."]
        if m.get("hf_compiled_compile_seconds") is not None:
            lines += [f"hf-compiled: compiled in {m['hf_compiled_compile_seconds']} s "
                      f"(backend {m.get('hf_compiled_backend')}, mode {m.get('hf_compiled_mode')})."]
        if m.get("rows"):
            lines += [""] + _table(m["rows"], ENGINE_COLUMNS)
        lines += [""]
    dc = data["drafter_costs"]
    lines += ["## 4. Drafter step cost vs verifier step", "", _status(dc), ""]
    for name, m in (dc.get("models") or {}).items():
        lines += [f"### {name}", "", _status(m), ""]
        if m.get("verifier_step_ms") is not None:
            lines += [f"Verifier: {m['verifier_step_ms']} ms per 1-token step, {m.get('verify_pass_ms')} ms per pass "
                      f"of k + 1 = {m.get('k', 0) + 1} tokens.", ""]
        if m.get("drafters"):
            lines += _table(m["drafters"], DRAFTER_COLUMNS)
        lines += [""]
    vc = data["verify_cost"]
    lines += ["## 5. Verifier cost curve (tree=\"auto\"'s measurement)", "", _status(vc), ""]
    for name, m in (vc.get("models") or {}).items():
        lines += [f"### {name}", "", _status(m), ""]
        if m.get("sizes"):
            lines += [f"context {m.get('context')} tokens, {m.get('device')}", "",
                      "| tokens/pass | " + " | ".join(str(s) for s in m["sizes"]) + " |",
                      "|---|" + "---|" * len(m["sizes"]),
                      "| ms | " + " | ".join(str(s) for s in m["ms"]) + " |",
                      "| relative | " + " | ".join(str(s) for s in m["relative"]) + " |"]
        lines += [""]
    sb = data["spec_bench"]
    lines += ["## 6. Spec-Bench, embedded model (greedy)", "", _status(sb), ""]
    source = sb.get("model_source") or {}
    if source.get("source"):
        lines += [f"- model: {source['source']}" + (f" ({len(source['parts'])} parts)" if source.get("parts") else "")
                  + (f", {source['path']}" if source.get("path") else "")
                  + (f", loaded in {sb['load_seconds']} s" if sb.get("load_seconds") is not None else "")]
    for key in ("dataset", "prompts", "max_new_tokens", "self_draft_note", "compiled_note", "summary_note"):
        if sb.get(key):
            lines += [f"- {key}: {sb[key]}"]
    if sb.get("table"):
        lines += [""] + _table(sb["table"], SPEC_COLUMNS)
    lines += [""]
    if sb.get("table_compiled") or sb.get("methods_compiled"):
        lines += ["### Compiled (`hf-compiled`, specdec with `compile_verifier`; `hf` again, same run)", ""]
        if sb.get("table_compiled"):
            lines += _table(sb["table_compiled"], SPEC_COLUMNS)
        else:
            lines += ["no prompt finished (the compiles come before the first timed prompt)"]
        lines += [""]
    lines += _render_simulated(data.get("simulated") or {}) + _render_syncs(data.get("syncs_per_pass") or {})
    return "\n".join(lines)


def _render_simulated(sim: dict[str, Any]) -> list[str]:
    lines = ["## 7. SIMULATED acceptance: a real drafter's cost, a chosen acceptance", "", _status(sim), ""]
    if sim.get("models"):
        lines += ["Every row here is SIMULATED: the drafter runs each pass at full cost, its drafts are replaced by the "
                  "verifier's greedy token with the profile's conditional acceptance (seeded), else a wrong token "
                  "(specdec.drafters.SimulatedDrafter). `profile tok/pass`: what the profile expects at this k; "
                  "`tok/pass`: measured. `recal.`: reruns drafting from specdec's own output after a bf16 near-tie.", ""]
    for name, m in (sim.get("models") or {}).items():
        lines += [f"### {name}", "", _status(m), ""]
        base = m.get("baselines") or {}
        if any(base.values()):
            lines += [f"Baselines (stage 3, same prompt and length): hf {base.get('hf')} tok/s, hf-compiled "
                      f"{base.get('hf-compiled')} tok/s; k = {m.get('k')}, {m.get('new_tokens')} new tokens; eager "
                      f"rows: {m.get('head_eager')}; compile_verifier rows: {m.get('head_compiled') or 'none'}."]
        for key in ("hf_note", "compiled_note"):
            if m.get(key):
                lines += [f"- {m[key]}"]
        if m.get("rows"):
            lines += [""] + _table(m["rows"], SIM_COLUMNS)
        lines += [""]
    if sim.get("models"):
        source = next((m.get("profiles_source") for m in sim["models"].values() if m.get("profiles_source")), None)
        if source:
            lines += [f"The shipped head's profile: {source}.", ""]
    return lines


def _render_syncs(syncs: dict[str, Any]) -> list[str]:
    lines = ["## 8. Syncs per pass", "", _status(syncs), ""]
    for name, m in (syncs.get("models") or {}).items():
        lines += [f"### {name}", "", _status(m), ""]
        if m.get("drafter"):
            lines += [f"One greedy call: {m['drafter']}, k = {m.get('k')}, {m.get('new_tokens')} new tokens, batch 1; "
                      f"`torch.cuda.set_sync_debug_mode`: {m.get('sync_debug_mode')}.", "", "| | |", "|---|---|"]
            lines += [f"| {title} | {m[key]} |" for key, title in SYNC_KEYS if m.get(key) is not None]
            lines += [""]
        if m.get("sync_warning_sites"):
            lines += ["Warning sites: " + ", ".join(f"`{site}` x{n}" for site, n in m["sync_warning_sites"]), ""]
        if m.get("host_trace_sites"):
            lines += ["HostTrace sites (steady passes): " + ", ".join(
                f"`{what} {site}` x{n}" for what, site, n in m["host_trace_sites"]), ""]
    return lines
