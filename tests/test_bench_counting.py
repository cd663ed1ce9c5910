"""The two benchmarks that compare a step's cost between source trees still run against the loop.

Both drive ``bench_throughput.drive_runs`` in child processes (one per tree), so a change to the
loop or to that driver can break them without any other test noticing. Here the base tree is this
checkout's own ``src``, so both sides must nearly agree where the figure is a count.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=300,
                         check=False, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_bench_bytecodes_counts_the_same_tree_the_same() -> None:
    out = _run("benchmarks/bench_bytecodes.py", "--base-src", "src", "--runs", "2", "--turns", "1,3", "--top", "3")
    head = re.search(r"head ([\d,]+) bytecodes/step", out)
    base = re.search(r"base src: ([\d,]+) bytecodes/step", out)
    assert head is not None and base is not None, out
    h, b = (int(m.group(1).replace(",", "")) for m in (head, base))
    assert h > 1000  # a durable step runs some thousands
    # A count, not a timing: one tree counts nearly the same twice (once in eleven counts at this
    # size the count was 1.7% higher, the cause not found; the bound leaves room for that).
    assert abs(h - b) <= 0.05 * b, out


def test_bench_cpu_ab_hands_cells_to_both_trees() -> None:
    out = _run("benchmarks/bench_cpu_ab.py", "--base-src", "src", "--pairs", "2", "--runs", "2", "--turns", "2")
    rows = [line for line in out.splitlines() if line.startswith(("| base |", "| head |"))]
    assert len(rows) == 2, out
    assert all(float(r.split("|")[2]) > 0 for r in rows)  # CPU per step measured on both sides
    assert re.search(r"median of the pairs \d\.\d{3}", out)
