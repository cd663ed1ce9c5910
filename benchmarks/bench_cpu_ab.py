"""CPU per durable step of two source trees, cell by cell in turn, on a machine other jobs share.

Usage: ``python benchmarks/bench_cpu_ab.py --base REV [--pairs 12] [--runs 32] [--turns 50]
[--mode group|alone] [--gc on|off] [--synchronous FULL|NORMAL] [--json out.json]``

``bench_cpu_per_step.py`` runs one tree per invocation, and the figures of two invocations a few
seconds apart differ by more than the change they compare whenever another job takes a core
(measured here, load average 5 on 2 CPUs: the same tree gave 190-284 µs/step from one cell to the
next). This script keeps one process per tree alive (``REV``'s ``src`` and this checkout's, each
on ``PYTHONPATH``, both driven by this checkout's ``bench_throughput.drive_runs``), warms both
with a short cell (imports, first compilations: a fixed cost of the process, not of a step), then
hands them cells in turn, ABBA, each cell a new SQLite journal. The process waiting for its turn
is blocked on a pipe, so the two never compete; each pair of cells met nearly the same load, and
the median of the pairs' ratios is the figure to read.

Reported per tree (medians over the pairs, per durable step): CPU (``getrusage``: user and
system apart), voluntary and involuntary context switches, minor page faults, and the garbage
collector's passes per cell by generation; then the median of the pairs' head/base ratios of CPU
with its range, and the load average over the measurement.

Knobs to find where a difference goes: ``--gc off`` (``gc.disable()`` in both processes after
the warm-up: what the collector's passes cost), ``--synchronous NORMAL`` (the journal's WAL is
not synced at commit: the work between syncs, without the cold caches a wait for the disk
leaves behind).

A measurement (2 CPUs, load average 4.5-6.2, 12 pairs, M=32, 50 turns, group commit),
``--base 6c4f382`` against 558e759: base 207.7 µs/step (user 184.4, system 23.1), head 223.1
(user 205.8, system 21.9), paired ratio 1.077. The difference is user time: system time, the
system calls a cell makes (``strace -c``) and the instructions it executes (callgrind, within
0.4%) are the same. What cachegrind's model counts differently per step (a warm 50-turn cell):
L1 data misses 11,956 -> 12,809 (+7%; the interpreter's loop +316, the collector +200) and
mispredicted branches 17,708 -> 18,143 (+2.5%; the interpreter's indirect dispatch +310): the
head runs about 8% more bytecode per step (12,300 more instructions in the interpreter's loop)
and about 19,000 fewer instructions of C in libraries (hashing: BLAKE2b's reference code in
CPython against OpenSSL's SHA-256), at the same total, and bytecode costs more time per
instruction than C that hashes (``bench_bytecodes.py``: 5,123 -> 5,739 bytecodes per step; a run's
fixed cost 13.3k -> 17.1k bytecodes, under 1% of a 50-turn run's steps, so the difference is per
step, not a fixed cost divided into steps). Not the cause, measured: threads (group commit writes
on the loop; no thread is started during a cell), context switches (0.24 / 0.25 voluntary per
step, most of them the syncs), page faults (about 0.001 per step on both), the allocator
(``PYTHONMALLOC=malloc`` on both: 1.094), the collector (``--gc off``: 1.046 and 1.079 in two runs,
against 1.061 and 1.033 with it on, so the collector's share is within the noise; cachegrind puts
it at about 200 of the 853 added L1 misses).

Repeated runs of 10-12 pairs on this shared machine gave paired ratios of 0.996 to 1.094 (the
range within one run is wider: 0.81-1.37), so read one run's figure as +-5%: a difference of a
few percent needs several runs, or ``bench_instructions.py`` / ``bench_bytecodes.py``, which
count and do not time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def _child(mode: str, gc_mode: str, synchronous: str) -> None:
    """One tree's process: a warm-up cell, then one cell per line read from stdin, its figures as
    one JSON line on stdout."""
    import asyncio

    sys.path.insert(0, str(BENCH))
    from bench_throughput import drive_runs, open_store

    folder = tempfile.mkdtemp(prefix="bench-cpu-ab-")

    def cell(runs: int, turns: int) -> dict[str, Any]:
        store = open_store(f"sqlite:///{folder}/j-{time.time_ns()}.db?synchronous={synchronous}", mode)
        gc0 = [s["collections"] for s in gc.get_stats()]
        u0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        steps = asyncio.run(drive_runs(store, [f"r{i}" for i in range(runs)], turns))
        t1, u1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        gc1 = [s["collections"] for s in gc.get_stats()]
        store.close()
        return {"steps": steps, "wall": t1 - t0, "user": u1.ru_utime - u0.ru_utime, "sys": u1.ru_stime - u0.ru_stime,
                "vcs": u1.ru_nvcsw - u0.ru_nvcsw, "ivcs": u1.ru_nivcsw - u0.ru_nivcsw,
                "minflt": u1.ru_minflt - u0.ru_minflt, "gc": [b - a for a, b in zip(gc0, gc1, strict=True)]}

    try:
        cell(8, 5)  # imports and first calls: the process's fixed cost, not a step's
        if gc_mode == "off":
            gc.collect()
            gc.disable()
        print("ready", flush=True)
        for line in sys.stdin:
            runs, turns = (int(x) for x in line.split())
            print(json.dumps(cell(runs, turns)), flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _summary(cells: list[dict[str, Any]]) -> dict[str, float]:
    steps = cells[0]["steps"]

    def med(key: str) -> float:
        return statistics.median(c[key] for c in cells) / steps

    out = {"cpu_us": 1e6 * statistics.median(c["user"] + c["sys"] for c in cells) / steps,
           "user_us": 1e6 * med("user"), "sys_us": 1e6 * med("sys"), "vcs": med("vcs"), "ivcs": med("ivcs"),
           "minflt": med("minflt"), "steps_per_s": statistics.median(steps / c["wall"] for c in cells)}
    for g in range(3):
        out[f"gc{g}_per_cell"] = statistics.median(c["gc"][g] for c in cells)
    return out


def measure(trees: dict[str, Path], args: argparse.Namespace) -> dict[str, Any]:
    procs = {}
    for name, src in trees.items():
        env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
        procs[name] = subprocess.Popen(
            [sys.executable, __file__, "--child", "--mode", args.mode, "--gc", args.gc,
             "--synchronous", args.synchronous], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    cells: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    loads = [os.getloadavg()[0]]
    try:
        for p in procs.values():
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a tree's process failed to start (see its error above)")
        for i in range(args.pairs):
            for name in (["base", "head"] if i % 2 == 0 else ["head", "base"]):  # ABBA
                p = procs[name]
                assert p.stdin is not None and p.stdout is not None
                p.stdin.write(f"{args.runs} {args.turns}\n")
                p.stdin.flush()
                cells[name].append(json.loads(p.stdout.readline()))
            loads.append(os.getloadavg()[0])
    finally:
        for p in procs.values():
            if p.stdin is not None:
                p.stdin.close()
            p.wait(timeout=60)
    ratios = [(h["user"] + h["sys"]) / (b["user"] + b["sys"]) for b, h in zip(cells["base"], cells["head"], strict=True)]
    return {"pairs": args.pairs, "runs": args.runs, "turns": args.turns, "mode": args.mode, "gc": args.gc,
            "synchronous": args.synchronous, "steps_per_cell": cells["base"][0]["steps"],
            "load": [min(loads), max(loads)], "base": _summary(cells["base"]), "head": _summary(cells["head"]),
            "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}, "cells": cells}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="a git revision: its src is the base tree")
    ap.add_argument("--base-src", help="or the base tree's src folder itself")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--runs", type=int, default=32)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--mode", default="group", choices=("group", "alone"))
    ap.add_argument("--gc", default="on", choices=("on", "off"))
    ap.add_argument("--synchronous", default="FULL", choices=("FULL", "NORMAL"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.mode, args.gc, args.synchronous)
        return 0
    if (args.base is None) == (args.base_src is None):
        ap.error("give one of --base REV or --base-src PATH")
    with tempfile.TemporaryDirectory() as tree:
        if args.base is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", tree, args.base],
                           check=True, capture_output=True)
        base_src = Path(tree) / "src" if args.base is not None else Path(args.base_src)
        try:
            report = measure({"base": base_src, "head": ROOT / "src"}, args)
        finally:
            if args.base is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tree], check=False,
                               capture_output=True)
    print(f"M={args.runs}, {args.turns} turns, {args.mode}, gc {args.gc}, synchronous={args.synchronous}: "
          f"{args.pairs} pairs of cells of {report['steps_per_cell']} steps, load average "
          f"{report['load'][0]:.1f}-{report['load'][1]:.1f}")
    print("| tree | CPU µs/step | user | system | vol. switches/step | invol. | minor faults/step "
          "| gc passes/cell (gen 0/1/2) | steps/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("base", "head"):
        s = report[name]
        print(f"| {name} | {s['cpu_us']:.1f} | {s['user_us']:.1f} | {s['sys_us']:.1f} | {s['vcs']:.3f} | "
              f"{s['ivcs']:.3f} | {s['minflt']:.4f} | {s['gc0_per_cell']:.0f}/{s['gc1_per_cell']:.0f}/"
              f"{s['gc2_per_cell']:.0f} | {s['steps_per_s']:,.0f} |")
    r = report["ratio"]
    print(f"head/base CPU per step: median of the pairs {r['median']:.3f} (range {r['min']:.3f}-{r['max']:.3f}); "
          f"ratio of the medians {report['head']['cpu_us'] / report['base']['cpu_us']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
