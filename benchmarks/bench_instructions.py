"""CPU per durable step as instructions executed (valgrind's callgrind), this checkout against another.

Usage: ``python benchmarks/bench_instructions.py [--base REV] [--runs 32] [--turns 20,60]
[--mode group|alone] [--json out.json]``

Why instructions and not seconds: on a machine other jobs share, CPU time moves by more than the
differences a change to the loop makes (a few percent), while the count of instructions a
process executes is the same from one run to the next within a fraction of a percent (measured:
below). So this is the figure to compare two versions of the code by, and wall-clock throughput
(``bench_throughput.py``, ``bench_cpu_per_step.py``) the one to size a deployment by.

What is counted: the runs of ``bench_throughput.py`` (each turn one idempotent tool call, 400
bytes of text; ``2 * turns + 1`` durable steps a run), M of them on one SQLite journal in one
process, through :class:`cuaderno.GroupCommit` in mode ``group``. The whole process is counted
(interpreter start, imports, opening the journal), so the figure per step is the difference
between two lengths of run divided by the steps between them: what one more step costs, with
every fixed cost cancelled out.

``--base REV``: the same measurement on the source tree of ``REV`` (checked out with ``git
worktree`` in a temporary folder, its ``src`` on ``PYTHONPATH``, this file's driver), in the same
invocation, and the ratio. ``valgrind`` must be installed (Debian: ``apt-get install valgrind``).
A cell takes about a minute on this machine (callgrind runs the interpreter some 50 times
slower).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r"""
import asyncio, sys, tempfile, os
sys.path.insert(0, {bench!r})
from bench_throughput import drive_runs
from cuaderno import open_journal
try:
    from cuaderno import GroupCommit
except ImportError:  # older trees kept it private
    from cuaderno.journal._group import GroupCommit
runs, turns, mode = {runs}, {turns}, {mode!r}
folder = tempfile.mkdtemp()
base = open_journal("sqlite:///" + os.path.join(folder, "j.db"))
store = GroupCommit(base) if mode == "group" else base
steps = asyncio.run(drive_runs(store, [f"r{{i}}" for i in range(runs)], turns))
store.close()
print("STEPS", steps)
"""


def instructions(src: Path, runs: int, turns: int, mode: str) -> tuple[int, int]:
    """Instructions the driver's process executed, and the durable steps it took."""
    with tempfile.TemporaryDirectory() as out:
        code = DRIVER.format(bench=str(ROOT / "benchmarks"), runs=runs, turns=turns, mode=mode)
        env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.out",
                               sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
        found = re.search(r"STEPS (\d+)", done.stdout)
        total = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None or total is None:
            raise SystemExit(f"callgrind run failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return int(total.group(1)), int(found.group(1))


def per_step(src: Path, runs: int, short: int, long: int, mode: str) -> dict[str, Any]:
    i_short, s_short = instructions(src, runs, short, mode)
    i_long, s_long = instructions(src, runs, long, mode)
    return {"short": [i_short, s_short], "long": [i_long, s_long],
            "per_step": (i_long - i_short) / (s_long - s_short)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=None, help="a git revision to compare against")
    ap.add_argument("--runs", type=int, default=32)
    ap.add_argument("--turns", default="20,60", help="the two run lengths, comma-separated")
    ap.add_argument("--mode", default="group", choices=("group", "alone"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    short, long = (int(t) for t in args.turns.split(","))
    report: dict[str, Any] = {"runs": args.runs, "turns": [short, long], "mode": args.mode}
    report["head"] = per_step(ROOT / "src", args.runs, short, long, args.mode)
    if args.base:
        with tempfile.TemporaryDirectory() as tree:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", tree, args.base],
                           check=True, capture_output=True)
            try:
                report["base"] = {"rev": args.base, **per_step(Path(tree) / "src", args.runs, short, long, args.mode)}
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tree], check=False,
                               capture_output=True)
    head = report["head"]["per_step"]
    print(f"M={args.runs} {args.mode}, steps {short}->{long} turns: head {head:,.0f} instructions/step")
    if "base" in report:
        base = report["base"]["per_step"]
        print(f"base {args.base}: {base:,.0f} instructions/step; head/base = {head / base:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
