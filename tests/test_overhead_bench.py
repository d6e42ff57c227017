"""benchmarks/overhead.py (issue 43's CPU proxies) at toy size: its JSON keeps the contract keys with sane values.

Counts only: timings are reported, never asserted (the 2-core machine is shared).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "overhead.py"


def _overhead():
    spec = importlib.util.spec_from_file_location("overhead_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_json_has_the_contract_keys(tmp_path: Path) -> None:
    bench = _overhead()
    out = tmp_path / "overhead.json"
    threads = torch.get_num_threads()
    report = bench.main(["--models", "tiny", "--layers", "2", "--drafters", "eagle", "prompt-lookup",
                         "--batches", "1", "4", "--max-new-tokens", "10", "-k", "3", "--repeats", "1",
                         "--json", str(out)], log=lambda line: None)
    assert torch.get_num_threads() == threads  # main restores the thread count it pinned to 1
    written = json.loads(out.read_text())
    assert written["results"] == json.loads(json.dumps(report["results"]))
    assert written["meta"]["k"] == 3 and Path(written["meta"]["specdec"]).is_dir()
    rows = list(bench.iter_rows(written))
    assert {(kind, batch) for _, kind, batch, _ in rows} == {(d, b) for d in ("eagle", "prompt-lookup") for b in (1, 4)}
    for model, kind, batch, row in rows:
        for key in bench.CONTRACT_KEYS:
            assert isinstance(row[key], (int, float)) and not isinstance(row[key], bool), (kind, key)
            # overhead ms is a difference of two times: under noise it may dip below 0
            assert row[key] >= 0 or key == "overhead_ms_per_pass", (kind, key, row[key])
        assert row["syncs_per_pass_max"] >= row["syncs_per_pass"]
        assert row["ops_per_verifier_step"] > 0 and row["verifier_ms_per_step"] > 0
        # overhead counts everything but the verifier's own forward, the drafter's propose included
        assert row["overhead_ops_per_pass"] >= row["ops_per_pass"]["draft"]
        assert row["steady_passes"] >= 1 and all(isinstance(s, str) for s in row["sync_sites"])
        if kind == "eagle":  # a head runs its own forwards: ops in its draft steps
            assert row["ops_per_draft_step"] > 0
    assert "| tiny | eagle | 1 |" in bench.markdown(written)
    assert "pending" in bench.compare(written, None)
    same = bench.compare(written, written)  # the same outputs: no row flagged
    assert "pending" not in same and " * |" not in same and len(same.splitlines()) == 2 + len(rows)
