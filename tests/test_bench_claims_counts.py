"""The fleet claims benchmark still runs, and its per-run counts (the figures that do not move
with the machine's load) come out of every worker process: a tiny queue, two workers, SQLite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_claims_reports_per_run_counts(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out_json = tmp_path / "cells.json"
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_claims.py"), "--runs", "6", "--tools", "1",
                          "--backends", "sqlite", "--modes", "queue", "--shapes", "2x2", "--repeats", "1",
                          "--json", str(out_json)],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    (cell,) = json.loads(out_json.read_text())
    assert cell["completed"] == 6 and cell["errors"] == 0
    assert cell["releases_per_run"] == 1  # every run let go once
    assert cell["groups_per_run"] > 0 and cell["appends_per_run"] >= 2  # its commits were counted
    assert cell["claims_per_run"] > 0 and cell["claim_cpu_ms_per_run"] > 0  # the claims' own thread, timed
    if sys.platform == "linux":  # /proc: the read and write calls of the workers' threads
        assert cell["syscw_per_run"] > 0
    assert "per run: read calls" in out.stdout
