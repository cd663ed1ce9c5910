"""CPU per durable step, the worker's and the PostgreSQL server's, and the bound it sets.

Usage: ``python benchmarks/bench_cpu_per_step.py [--runs 32] [--modes group,alone]
[--backends sqlite,postgres] [--repeats 3] [--pg URL]``

The runs of ``bench_throughput.py`` (50 turns, one tool call per turn, the same canned model), M
of them in this one process. Per cell: durable steps/s; the CPU the worker process spent per
step (``getrusage``: user + system, every thread of the process); on PostgreSQL, the CPU the
server's processes spent per step (``/proc/<pid>/stat`` of every ``postgres`` process, read
while the store's pooled connections are still open: a backend that exits takes its count with
it); what share of one core the worker kept busy; and the bound those costs set on this machine:
``cores / (worker + server CPU per step)``, the most steps/s any number of worker processes could
reach together if CPU were all they spent.

That bound is what the throughput goals are checked against: when it is below a goal, no commit
scheme reaches the goal on this machine; only less CPU per step (or more cores) would. Run it on
a quiet machine: other processes' CPU is not counted, but they slow the cells.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time

from bench_throughput import Journals, drive_runs, open_store

TICK = os.sysconf("SC_CLK_TCK")
CORES = len(os.sched_getaffinity(0))
"""The CPUs this process may run on (``os.cpu_count()`` counts the host's, not the container's)."""


def server_cpu_s() -> float:
    """CPU seconds of every live process named ``postgres*`` (user + system)."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")].startswith("postgres"):
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cell(url: str, mode: str, m: int, turns: int, pg: bool) -> dict[str, float]:
    store = open_store(url, mode)
    try:
        server0, own0, t0 = server_cpu_s() if pg else 0.0, own_cpu_s(), time.perf_counter()
        steps = asyncio.run(drive_runs(store, [f"r{i}" for i in range(m)], turns))  # a new journal each cell
        server1, own1, t1 = server_cpu_s() if pg else 0.0, own_cpu_s(), time.perf_counter()
    finally:
        store.close()  # after the readings: the pool's backends take their CPU counts with them
    wall = t1 - t0
    worker_us, server_us = 1e6 * (own1 - own0) / steps, 1e6 * (server1 - server0) / steps
    return {"steps_per_s": steps / wall, "worker_us": worker_us, "server_us": server_us,
            "busy": (own1 - own0) / wall, "bound": CORES * 1e6 / (worker_us + server_us)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=32)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--modes", default="group,alone")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pg", default=os.environ.get("CUADERNO_TEST_PG", "postgresql://127.0.0.1:5432/test"))
    args = ap.parse_args()
    journals = Journals(tempfile.mkdtemp(prefix="bench-cpu-"), args.pg)
    print(f"M={args.runs}, {args.turns} turns, one process, {CORES} CPUs, medians of {args.repeats}")
    print("| backend | mode | steps/s | worker µs/step | server µs/step | worker busy | bound, all cores |")
    print("|---|---|---|---|---|---|---|")
    try:
        for backend in args.backends.split(","):
            for mode in args.modes.split(","):
                reps = [cell(journals.new(backend), mode, args.runs, args.turns, backend == "postgres")
                        for _ in range(args.repeats)]
                med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
                server = f"{med['server_us']:.0f}" if backend == "postgres" else "-"
                print(f"| {backend} | {mode} | {med['steps_per_s']:,.0f} | {med['worker_us']:.0f} | {server} | "
                      f"{med['busy']:.2f} | {med['bound']:,.0f} |", flush=True)
    finally:
        journals.drop()
    print(f"load average after: {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
