"""The resume benchmark still runs against the loop it measures.

It reaches into the loop (it wraps ``RunLog.conversation`` to time "ready" and swaps
``_snapshots.tail_open`` to measure a resume without snapshots), so a refactor of the loop can
break it without any other test noticing: it once failed on an attribute the state no longer had.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_resume_runs_on_small_runs() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_resume.py"), "--sizes", "100,200",
                          "--repeats", "1", "--storm", "0", "--backends", "sqlite"],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines() if line.strip().startswith(("100 ", "200 "))]
    assert [r[0] for r in rows] == ["100", "200"]
    assert all(int(r[1]) > 0 for r in rows)  # the runs were built and resumed, row counts reported


def test_bench_claim_cpu_runs_on_a_small_queue() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_claim_cpu.py"), "--backends", "sqlite",
                          "--runs", "20", "--held", "8", "--free", "4", "--claims", "8"],
                         capture_output=True, text=True, env=env, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "4.0 runs/claim" in out.stdout  # every claim took its 4 runs past the 8 held elsewhere
