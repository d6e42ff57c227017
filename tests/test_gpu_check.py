"""benchmarks/gpu_check.py (the first run on a lent GPU) at toy size on CPU, and the oracle drafter it measures with.

The oracle replays the verifier's own greedy output, so every draft must be accepted and the output must be
``generate``'s: a drafter or engine bug that loses a token, shifts a row or mis-maps a retired row shows here.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec
from specdec.drafters import OracleDrafter
from tiny_models import VOCAB, left_padded, make_model

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
KW = dict(do_sample=False, eos_token_id=None, pad_token_id=0)


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("k", [1, 4, 8])
def test_oracle_reproduces_generate_with_every_draft_accepted(k):
    model = make_model("llama")
    ids, mask = left_padded([9])
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=20, **KW)
    spec = specdec.SpeculativeModel(model, OracleDrafter(ref), num_draft_tokens=k)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=20, **KW)
    assert torch.equal(out, ref)
    stats = spec.last_stats
    assert stats.acceptance_rate == 1.0 and stats.proposed > 0
    assert stats.mean_accepted_length > 1  # passes commit k + 1 tokens, not one


def test_oracle_on_a_ragged_batch_of_two_rows():
    model = make_model("qwen2")
    ids, mask = left_padded([5, 13], seed=3)
    oracle = OracleDrafter.from_generate(model, ids, mask, max_new_tokens=17, eos_token_id=None, pad_token_id=0)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=17, **KW)
    assert oracle.expected == ref.tolist()
    spec = specdec.SpeculativeModel(model, oracle, num_draft_tokens=4)
    out = spec.generate(ids, attention_mask=mask, max_new_tokens=17, **KW)
    assert torch.equal(out, ref)
    assert [row.acceptance_rate for row in spec.last_stats.rows] == [1.0, 1.0]


def test_oracle_follows_rows_that_leave_the_batch():
    """Row 0 stops at an EOS first; row 1 must still get its own expected tokens (matched by owner, not position)."""
    model = make_model("llama")
    ids, mask = left_padded([7, 11], seed=5)
    free = model.generate(ids, attention_mask=mask, max_new_tokens=24, **KW)[:, ids.shape[1]:]
    # an EOS that ends row 0 early and never appears in row 1
    eos = next(int(t) for t in free[0, 2:10] if int(t) not in free[1].tolist())
    kwargs = dict(max_new_tokens=24, do_sample=False, eos_token_id=eos, pad_token_id=0)
    ref = model.generate(ids, attention_mask=mask, **kwargs)
    spec = specdec.SpeculativeModel(model, OracleDrafter(ref), num_draft_tokens=4)
    out = spec.generate(ids, attention_mask=mask, **kwargs)
    assert torch.equal(out, ref)
    first, second = spec.last_stats.rows
    assert first.verifier_passes < second.verifier_passes  # row 0 really left the batch first
    assert second.acceptance_rate == 1.0
    # row 0 accepted every draft up to its EOS; the drafts after it in that pass are cut by the stop rule
    stop = int((ref[0, ids.shape[1]:] == eos).nonzero()[0])
    assert first.accepted == stop


def test_a_wrong_or_short_oracle_costs_acceptance_never_output():
    model = make_model("llama")
    ids, mask = left_padded([8], seed=1)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=16, **KW)
    wrong = ref.clone()
    wrong[0, ids.shape[1] + 3:] = (wrong[0, ids.shape[1] + 3:] + 1) % VOCAB
    spec = specdec.SpeculativeModel(model, OracleDrafter(wrong), num_draft_tokens=4)
    assert torch.equal(spec.generate(ids, attention_mask=mask, max_new_tokens=16, **KW), ref)
    assert spec.last_stats.acceptance_rate < 1.0
    # an oracle that knows 4 new tokens proposes those, then nothing: plain one-token passes
    spec = specdec.SpeculativeModel(model, OracleDrafter([ref[0, : ids.shape[1] + 5]]), num_draft_tokens=4)
    assert torch.equal(spec.generate(ids, attention_mask=mask, max_new_tokens=16, **KW), ref)
    assert spec.last_stats.proposed == spec.last_stats.accepted == 4


def test_oracle_refuses_empty_rows():
    with pytest.raises(ValueError, match="non-empty"):
        OracleDrafter([[1, 2], []])


def test_parse_pytest_counts_and_failures():
    gc = _gpu_check()
    done = ("..F.s\n"
            "FAILED tests/test_cuda.py::test_a[x] - AssertionError: row 0 differs at step 3\n"
            "ERROR tests/test_cuda.py::test_b - RuntimeError: CUDA error\n"
            "1 failed, 3 passed, 1 skipped, 28 deselected, 1 error in 12.34s\n")
    parsed = gc.parse_pytest(done)
    assert parsed["counts"] == {"failed": 1, "passed": 3, "skipped": 1, "deselected": 28, "errors": 1}
    assert parsed["failures"][0] == {"kind": "failed", "test": "tests/test_cuda.py::test_a[x]",
                                     "reason": "AssertionError: row 0 differs at step 3"}
    cut = gc.parse_pytest("...F..s. [ 40%]\n..E\n")  # killed before its summary line
    assert cut["counts"]["passed"] == 8 and cut["counts"]["failed"] == 1 and cut["counts"]["partial"]


def test_carried_parts_reassemble_and_a_missing_part_is_named(tmp_path):
    gc = _gpu_check()
    source = tmp_path / gc.GGUF_NAME
    payload = bytes(range(256)) * (10 * 1024)  # 2.5 MiB: three parts of 1 MiB
    source.write_bytes(payload)
    carry = tmp_path / "carry"
    manifest = gc.prepare_carry(carry, 1, str(source), dataset=str(tmp_path / "none.jsonl"))
    assert [p["name"] for p in manifest["parts"]] == [f"{gc.GGUF_NAME}.part-0{i}" for i in range(3)]
    assert (carry / "pylib" / "gguf").is_dir() or importlib.util.find_spec("gguf") is None
    args = gc.parse_args(["--out", str(tmp_path / "o"), "--carry-dir", str(carry)])
    found = gc.find_embedded(args, [carry])
    assert found["source"] == "carried parts" and len(found["parts"]) == 3
    assert gc.reassemble(found, tmp_path / "whole").read_bytes() == payload
    (carry / f"{gc.GGUF_NAME}.part-01").unlink()
    with pytest.raises(FileNotFoundError, match="part-01"):
        gc.reassemble(gc.find_embedded(args, [carry]), tmp_path / "again")


def test_auto_part_size_fits_one_call_beside_the_tree(tmp_path):
    """A part, the travelling tree and the small carried paths stay under the device's 64 MiB per call (the
    tree grew past what fixed 32 MiB parts left room for)."""
    gc = _gpu_check()
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("runs/\n")
    (repo / "tracked.bin").write_bytes(b"x" * (30 * 2**20))
    (repo / "untracked.txt").write_bytes(b"y" * 2**20)  # untracked, not ignored: travels too
    (repo / "runs").mkdir()
    (repo / "runs" / "big.bin").write_bytes(b"z" * (40 * 2**20))  # ignored: stays here
    subprocess.run(["git", "-C", str(repo), "add", "tracked.bin", ".gitignore"], check=True)
    tree = gc.travelling_tree_bytes(repo)
    assert tree == 31 * 2**20 + len("runs/\n")
    part = gc.auto_part_mib(repo)
    assert part * 2**20 + tree + gc.CARRY_EXTRAS <= gc.TRANSFER_LIMIT < (part + 1) * 2**20 + tree + gc.CARRY_EXTRAS
    (repo / "tracked.bin").write_bytes(b"x" * (59 * 2**20))
    with pytest.raises(SystemExit, match="shrink"):
        gc.auto_part_mib(repo)


def test_gpu_check_quick_on_cpu(tmp_path):
    out = tmp_path / "check"
    run = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads((out / "gpu_check.json").read_text())
    stages = ("environment", "cuda_tests", "engine_overhead", "drafter_costs", "verify_cost", "spec_bench",
              "simulated", "syncs_per_pass")
    assert all(stage in data for stage in stages)
    markdown = (out / "gpu_check.md").read_text()
    assert markdown.startswith("# specdec GPU check") and "--dry-run" in markdown.split("\n")[3]
    assert data["environment"]["status"] == "ok" and data["environment"]["torch"] == torch.__version__
    assert data["cuda_tests"]["status"] == "ok" and "not a CUDA device" in data["cuda_tests"]["note"]

    engine = data["engine_overhead"]["models"]["tiny"]
    assert engine["status"] == "ok", engine
    # hf, the uncompiled sweep over every k (default: 4), hf-compiled, then compile_verifier for every k: a timeout
    # while priming the verifier keeps the uncompiled sweep and hf-compiled, which every vs_hf_compiled needs
    order = [r["method"] for r in engine["rows"]]
    assert order == ["hf", "specdec[oracle,k=4]", "hf-compiled", "specdec[oracle,k=4,compile_verifier]"], order
    rows = {r["method"]: r for r in engine["rows"]}
    for k in (4,):
        oracle = rows[f"specdec[oracle,k={k}]"]
        assert oracle["acceptance_rate"] == 1.0 and oracle["identical_to_generate"] is True
        assert oracle["calibration_runs"] == 0 and oracle["tokens_per_pass"] > 1
        assert oracle["ceiling_x"] > 0 and oracle["vs_hf"] > 0 and oracle["vs_hf_compiled"] > 0
    assert rows["hf-compiled"]["identical_to_generate"] is True and rows["hf-compiled"]["compiled_graphs"] == 0

    curve = data["verify_cost"]["models"]["tiny"]
    assert curve["status"] == "ok" and curve["sizes"][0] == 1 and curve["sizes"][-1] == 64
    assert len(curve["ms"]) == len(curve["sizes"]) and curve["relative"][0] == 1.0

    drafters = {d["drafter"]: d for d in data["drafter_costs"]["models"]["tiny"]["drafters"]}
    assert drafters["eagle3 (random head)"]["status"] == "ok" and drafters["self:int4"]["status"] == "ok"
    assert drafters["eagle3 (random head, compile_drafter)"]["status"] == "ok"
    profile = drafters["eagle3 (random head)"]["profile"]  # where a head's step goes, op by op
    assert profile["calls"] > 0 and profile["aten_ops_per_call"] > 10 and profile["host_ms_per_call"] > 0
    assert profile["top_host_ops"] and all(op["count_per_call"] > 0 for op in profile["top_host_ops"])
    assert all(d["status"] in ("ok", "unavailable") for d in drafters.values()), drafters
    assert drafters["self:int4"]["draft_step_ms"] > 0

    bench = data["spec_bench"]
    assert bench["status"] == "ok", bench
    table = {r["method"]: r for r in bench["table"]}
    assert "hf" in table and any(m.endswith("tree=auto]") for m in table)
    assert not any("compiled" in m for m in table)  # the compiled methods are a second eval, on CUDA only
    for name, row in table.items():
        if name != "hf":  # greedy: every method's output is generate's
            assert row["identical"] == f"{row['prompts']}/{row['prompts']}", (name, row)
    assert "table_compiled" not in bench and "CUDA" in bench["compiled_note"]
    # only what the GPU machine's 8 returned files have room for
    kept = {p.name for p in (out / "spec_bench").iterdir()}
    assert "records.jsonl" in kept and kept <= {"records.jsonl", "summary.json"}, kept
    assert "summary.json" in kept or importlib.util.find_spec("evaluate") is None
    assert not (out / "spec_bench_compiled").exists()
    labels = [step["label"] for step in data["timing"]["stages"]]
    assert labels == ["environment", "captured tiny", "cuda_tests", "build tiny", "verify_cost tiny", "engine_overhead tiny",
                      "drafter_costs tiny", "simulated tiny", "syncs_per_pass tiny", "spec_bench"], labels

    # SIMULATED acceptance: the head eager at 2 / 3 / 4 tokens per pass, a model drafter at 3, then the compiled head
    # with compile_verifier at 2 / 3 / 4, the shipped head's profile last; every row labelled, every output generate's
    sim = data["simulated"]["models"]["tiny"]
    assert data["simulated"]["status"] == "ok" and sim["status"] == "ok", sim
    assert sim["baselines"]["hf"] == rows["hf"]["tokens_per_s"]
    assert sim["baselines"]["hf-compiled"] == rows["hf-compiled"]["tokens_per_s"]
    sim_rows = sim["rows"]
    assert [(r["verifier"], r["drafter"], r["expected_tokens_per_pass"]) for r in sim_rows] == [
        ("eager", "eagle3 (random head)", 2.0), ("eager", "eagle3 (random head)", 3.0),
        ("eager", "eagle3 (random head)", 4.0), ("eager", "tiny model drafter", 3.0),
        *[("compile_verifier", "eagle3 (random head, compile_drafter)", t) for t in (2.0, 3.0, 4.0)],
        ("compile_verifier", "eagle3 (random head, compile_drafter)", 1.638)], sim_rows
    for r in sim_rows:
        assert r["status"] == "ok" and r["simulated"] is True and r["method"].startswith("SIMULATED["), r
        assert r["identical_to_generate"] is True and r["calibration_runs"] == 0
        assert r["tokens_per_pass"] > 1 and r["tokens_per_s"] > 0 and r["vs_hf"] > 0 and r["vs_hf_compiled"] > 0
        assert r["graphs_compiled_in_timed_run"] == 0 or r["verifier"] == "compile_verifier"
    assert "head-v2" in sim_rows[-1]["profile"] and "BENCHMARKS.md section 18" in sim["profiles_source"]
    section = markdown.split("## 7. SIMULATED")[1].split("## 8.")[0]
    table = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(table) == len(sim_rows) and all("SIMULATED[" in line for line in table), table

    # v3: the deciding rows first, through the capture module's stand-in on a CPU: hf-compiled, the oracle with
    # captured verify passes (every draft accepted), the captured head at SIMULATED 2 / 3 / 4, syncs at batch 1 and 3
    captured = data["captured"]["models"]["tiny"]
    assert data["captured"]["status"] == "ok" and captured["status"] == "ok", captured
    assert captured["capture"].startswith("stand-in")
    crows = captured["rows"]
    sims = [f"SIMULATED[{t} tokens/pass at k=4 (a={a})]" for t, a in ((2, 0.519), (3, 0.741), (4, 0.888))]
    assert [r["method"].split(" over ")[0] for r in crows] == [
        "hf-compiled", "specdec[oracle,k=4,graphs]", *sims, "specdec[oracle,k=4,graphs+fused]", sims[1]], crows
    assert crows[-1]["method"].endswith("+graphs+fused") and crows[-1]["verifier"] == "graphs+fused"
    for oracle in (crows[1], crows[5]):
        assert oracle["acceptance_rate"] == 1.0 and oracle["graphs"] >= 1 and len(oracle["capture_seconds"]) >= 1
    for r in crows[1:]:
        assert r["status"] == "ok" and r["identical_to_generate"] is True and r["vs_hf_compiled"] > 0, r
        assert r["graphs"] >= 1 and r.get("capture_failed") is None
    heads = [r for r in crows if r["method"].startswith("SIMULATED")]
    assert len(heads) == 4 and all(r["draft_graphs"] >= 1 and r["draft_capture_failed"] is None for r in heads)
    assert [s["batch"] for s in captured["syncs"].values()] == [1, 3]
    assert all(s["host_trace_syncs_per_pass"] == 1.0 for s in captured["syncs"].values()), captured["syncs"]
    assert "## 0. Captured phases" in markdown

    syncs = data["syncs_per_pass"]["models"]["tiny"]
    assert data["syncs_per_pass"]["status"] == "ok" and syncs["status"] == "ok", syncs
    assert syncs["passes"] > 1 and syncs["host_trace_syncs_per_pass"] is not None
    assert syncs["sync_debug_mode"] == "not available on cpu" and syncs["sync_warnings_per_pass"] is None
    assert syncs["drafter"].startswith("SIMULATED[") and "## 8. Syncs per pass" in markdown


def test_gpu_check_runs_spec_bench_after_the_first_model(tmp_path, monkeypatch):
    """Stage 6 right after the first model's stages 3-5, before the second model; its reserve ends there. The
    stages are stubs: this checks main's order and time boxes only."""
    gc = _gpu_check()
    seen = []
    monkeypatch.setattr(gc, "carry_dirs", lambda extra: [])  # no carried pylib put on this process's sys.path
    monkeypatch.setattr(gc, "build_model", lambda name, device, dtype: torch.nn.Linear(2, 2))
    for stage in ("stage_verify_cost", "stage_engine_overhead", "stage_drafter_costs"):
        monkeypatch.setattr(gc, stage, lambda entry, *a, stage=stage: seen.append(stage))

    def spec_bench(entry, *args, box_left):
        seen.append("stage_spec_bench")
        entry["box_left"] = box_left()

    monkeypatch.setattr(gc, "stage_spec_bench", spec_bench)
    out = tmp_path / "order"
    assert gc.main(["--device", "cpu", "--quick", "--models", "tiny,135m", "--budget-seconds", "50", "--out", str(out),
                    "--stages", "verify_cost,engine_overhead,drafter_costs,spec_bench"]) == 0
    data = json.loads((out / "gpu_check.json").read_text())
    steps = data["timing"]["stages"]
    assert [s["label"] for s in steps] == [
        "build tiny", "verify_cost tiny", "engine_overhead tiny", "drafter_costs tiny", "spec_bench",
        "build 135m", "verify_cost 135m", "engine_overhead 135m", "drafter_costs 135m"], steps
    assert [s["start"] for s in steps] == sorted(s["start"] for s in steps)
    assert seen.count("stage_spec_bench") == 1 and all(s["status"] == "ok" for s in steps), (seen, steps)
    assert 0 < data["spec_bench"]["box_left"] <= 50
    # --quick reserves 10 s of the 50 for stage 6 until it has run: then 135m's curve (cap 120) gets all the rest
    curve = next(s for s in steps if s["label"] == "verify_cost 135m")
    assert curve["box_seconds"] > 50 - curve["start"] - 5, curve  # not 10 s less (a loaded machine starts it late)
    assert data["verify_cost"]["status"] == "ok" and data["spec_bench"]["status"] == "ok"

    # no model stage: stage 6 alone gets a box of up to SPEC_BENCH_ALONE_CAP (--quick: times its slack)
    out = tmp_path / "alone"
    cap = gc.SPEC_BENCH_ALONE_CAP * gc.QUICK_CAP_SLACK
    assert gc.main(["--device", "cpu", "--quick", "--stages", "spec_bench", "--budget-seconds", str(cap + 120),
                    "--out", str(out)]) == 0
    steps = json.loads((out / "gpu_check.json").read_text())["timing"]["stages"]
    assert [s["label"] for s in steps] == ["spec_bench"] and steps[0]["box_seconds"] == cap


def test_v2_defaults_and_arguments():
    """The default run is v2 (issue 43): both shapes, oracle k=4, the CUDA test subset, no self-drafters, SIMULATED
    2 / 3 / 4 tokens per pass and a model drafter at 3, within 480 s."""
    gc = _gpu_check()
    args = gc.parse_args(["--out", "o"])
    assert args.models == ["1b", "8b"] and args.ks == [4] and args.budget_seconds == 480
    assert args.cuda_tests == "subset" and args.self_schemes == () and args.sim_shipped
    assert args.sim_tokens == [2.0, 3.0, 4.0] and args.sim_model_tokens == 3.0 and args.sync_new_tokens == 32
    assert set(args.stages.split(",")) == set(gc.STAGES)
    quick = gc.parse_args(["--out", "o", "--quick"])
    assert quick.self_schemes == gc.SELF_SCHEMES and quick.models == ["tiny"]
    assert gc.parse_args(["--out", "o", "--self-schemes", "int4,nf4"]).self_schemes == ("int4", "nf4")
    for bad in (["--self-schemes", "int3"], ["--sim-tokens", "6"], ["--sim-model-tokens", "0.5"]):
        with pytest.raises(SystemExit):
            gc.parse_args(["--out", "o", *bad])
    # the 8b's reserve, the CUDA tests' box, the environment's and the 1b's floors fit the budget
    one, eight = gc.SHAPES["1b"], gc.SHAPES["8b"]
    assert gc.STAGE_CAPS["environment"] + gc.STAGE_CAPS["cuda_tests"] + eight["reserve"] + sum(
        one["floors"].values()) < args.budget_seconds
    assert eight["drafter"] == "1b" and set(gc.MODEL_STAGES) <= set(one["caps"]) & set(eight["caps"])
    assert gc.STAGE_CAPS["cuda_tests"] <= 90


def test_help_and_the_cuda_subset_collect():
    help_run = subprocess.run([sys.executable, str(SCRIPT), "--help"], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
    assert help_run.returncode == 0 and "--sim-tokens" in help_run.stdout and "SIMULATED" in help_run.stdout
    gc = _gpu_check()
    collect = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                              "tests/test_cuda.py", "-m", "not slow", "-k", gc.CUDA_TEST_SUBSET],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert collect.returncode == 0, collect.stdout[-2000:]
    chosen = [line for line in collect.stdout.splitlines() if line.startswith("tests/test_cuda.py::")]
    assert 10 <= len(chosen) <= 60, len(chosen)  # every drafter kind on one architecture, not all 180 cases
    assert any("compiled_verifier" in t for t in chosen) and all("static" not in t for t in chosen)


def test_markdown_labels_every_simulated_row(tmp_path):
    gc = _gpu_check()
    report = gc.Report(tmp_path, "python benchmarks/gpu_check.py --out x", {"budget_seconds": 480}, 480)
    row = dict(method="SIMULATED[3 tokens/pass at k=4 (a=0.741)] over eagle3 (random head)", simulated=True,
               verifier="eager", expected_tokens_per_pass=3.0, tokens_per_pass=2.9, tokens_per_s=80.0, vs_hf=1.9,
               vs_hf_compiled=1.2, status="ok")
    report.data["simulated"] = {"status": "ok", "models": {"8b": {
        "status": "ok", "rows": [row, {**row, "method": row["method"] + " +compile_verifier",
                                       "verifier": "compile_verifier"}],
        "baselines": {"hf": 42.0, "hf-compiled": 66.0}, "k": 4, "new_tokens": 128,
        "head_eager": gc.HEAD_EAGER, "head_compiled": gc.HEAD_COMPILED, "profiles_source": "BENCHMARKS.md"}}}
    report.data["syncs_per_pass"] = {"status": "ok", "models": {"8b": {
        "status": "ok", "drafter": row["method"], "k": 4, "new_tokens": 32, "sync_debug_mode": "warn", "passes": 12,
        "sync_warnings_per_pass": 1.0, "host_trace_syncs_per_pass": 1.0, "sync_warning_sites": [["engine.py:86", 11]],
        "host_trace_sites": [["Tensor.tolist", "verification.py:41 read", 11]]}}}
    report.write()
    markdown = (tmp_path / "gpu_check.md").read_text()
    section = markdown.split("## 7. SIMULATED acceptance")[1].split("## 8. Syncs per pass")[0]
    table = [line for line in section.splitlines() if line.startswith("| SIM")]
    assert len(table) == 2 and "hf 42.0 tok/s, hf-compiled 66.0 tok/s" in section
    assert "| set_sync_debug_mode warnings per steady pass | 1.0 |" in markdown and "`engine.py:86` x11" in markdown
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["simulated"]["models"]["8b"]["rows"][0]["vs_hf_compiled"] == 1.2
    assert data["syncs_per_pass"]["models"]["8b"]["sync_warnings_per_pass"] == 1.0


def test_each_model_leaves_the_next_its_reserve_and_its_later_stages_their_floors(tmp_path, monkeypatch):
    """Stub stages: the boxes of the first model's steps leave the second model's reserve and the first model's
    later floors; the second model, the last, gets the rest."""
    gc = _gpu_check()
    monkeypatch.setattr(gc, "carry_dirs", lambda extra: [])
    monkeypatch.setattr(gc, "build_model", lambda name, device, dtype: torch.nn.Linear(2, 2))
    for stage in ("stage_verify_cost", "stage_engine_overhead", "stage_drafter_costs", "stage_syncs_per_pass"):
        monkeypatch.setattr(gc, stage, lambda entry, *a: None)
    monkeypatch.setattr(gc, "stage_simulated", lambda entry, model, state, args, drafter: entry.update(
        drafter=drafter is not None))
    shapes = {name: dict(gc.SHAPES[name]) for name in ("tiny", "135m")}
    shapes["tiny"]["floors"] = {"simulated": 30, "syncs_per_pass": 10}
    shapes["135m"]["reserve"] = 100
    monkeypatch.setattr(gc, "SHAPES", {**gc.SHAPES, **shapes})
    out = tmp_path / "reserve"
    assert gc.main(["--device", "cpu", "--quick", "--models", "tiny,135m", "--budget-seconds", "400", "--out",
                    str(out), "--stages", ",".join(gc.MODEL_STAGES)]) == 0
    data = json.loads((out / "gpu_check.json").read_text())
    steps = {s["label"]: s for s in data["timing"]["stages"]}
    assert list(steps) == [f"{step} {m}" for m in ("tiny", "135m") for step in ("build", *gc.MODEL_STAGES)]

    def left(label):  # what the budget had left when the step started
        return 400 - steps[label]["start"]

    assert steps["engine_overhead tiny"]["box_seconds"] <= left("engine_overhead tiny") - 140 + 1
    assert steps["simulated tiny"]["box_seconds"] <= left("simulated tiny") - 110 + 1
    assert steps["syncs_per_pass tiny"]["box_seconds"] <= left("syncs_per_pass tiny") - 100 + 1
    assert steps["verify_cost 135m"]["box_seconds"] > left("verify_cost 135m") - 5  # the last model: all the rest
    assert data["simulated"]["models"]["tiny"]["drafter"] is True  # the toy drafts with a second toy
    assert data["simulated"]["models"]["135m"]["drafter"] is False
    assert all(data[s]["status"] == "ok" for s in gc.MODEL_STAGES)
