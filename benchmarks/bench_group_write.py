"""What one group transaction costs a SQLite store: statements and worker CPU per group.

Usage: ``python benchmarks/bench_group_write.py [--runs 8,32] [--groups 200] [--repeats 5]
[--against OTHER_SRC]``

A group of M runs, each appending one batch of two events (a tool step's intent and result,
400-byte payloads, compressed) through ``SqliteCheckpointer.append_group``, as a worker's group
commit hands it over. Two cases: ``same``, the store's own connection wrote last (its summaries
are cached), and ``other``, another connection commits between groups (every summary may be
stale: the group reads them again). Per cell: the statements SQLite ran per group (its trace
callback: each row of an ``executemany`` counts), the calls the store made (``execute`` and
``executemany``), and the process CPU per group (``time.process_time`` around ``append_group``,
``synchronous=NORMAL`` so that the sync does not dominate), median of ``--repeats`` blocks.

``--against SRC``: the same cells measured on another source tree too (``SRC`` is its ``src``
folder, e.g. a checkout of main), each cell run in a fresh process, the two trees alternated,
medians side by side.

Measured (2 CPUs shared with other jobs, load average 3-4; ``--runs 32 --repeats 7 --against`` the
tree before the shared group write, which wrote a SQLite group batch after batch): the store's
summaries cached, 1,658 against 1,973 µs of CPU per group, 6 against 67 ``execute`` calls, 67
statements either way (each row is one); after another connection's commit, 2,552 against 2,892
µs, 11 against 103 calls, 72 against 103 statements (the 32 summaries read by one statement, not
one each). What it does to a whole step (``bench_cpu_ab.py``, M=32, 50 turns, group commit, 12
ABBA pairs, three runs): a step's worker CPU, the new tree over the old, 0.895, 0.939 and 0.922
(median of the pairs), 0.898 with ``--synchronous NORMAL``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TEXT = ("lorem ipsum dolor sit amet, consectetur adipiscing elit " * 8)[:400]


def cell(m: int, groups: int, other: bool, repeats: int) -> dict[str, float]:
    """One case in this process (the cuaderno on ``sys.path``)."""
    from cuaderno.events import StepEvent
    from cuaderno.journal._group import GroupBatch
    from cuaderno.journal.sqlite import SqliteCheckpointer

    path = os.path.join(tempfile.mkdtemp(prefix="bench-group-"), "j.db")
    store = SqliteCheckpointer(path, synchronous="NORMAL")
    runs = [f"run-{i:03d}" for i in range(m)]
    store.append_group([GroupBatch([StepEvent(run_id=r, step_id="run", phase="start", kind="run",
                                              payload={"task": "t"})]) for r in runs])
    side = sqlite3.connect(path, isolation_level=None)
    side.execute("CREATE TABLE IF NOT EXISTS bench_side (x)")
    traced: list[str] = []
    calls = [0]
    real = store._db

    class Counting:
        """The store's connection, counting the calls it is given."""

        def execute(self, *a: Any) -> Any:
            calls[0] += 1
            return real.execute(*a)

        def executemany(self, *a: Any) -> Any:
            calls[0] += 1
            return real.executemany(*a)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    blocks = []
    per_block = max(1, groups // repeats)
    g = 0
    for _ in range(repeats):
        cpu = 0.0
        for _ in range(per_block):
            if other:
                side.execute("INSERT INTO bench_side VALUES (1)")
            batches = [GroupBatch([StepEvent(run_id=r, step_id=f"s{g}", phase="intent", kind="tool", name="t",
                                             payload={"a": TEXT}),
                                   StepEvent(run_id=r, step_id=f"s{g}", phase="result", kind="tool", name="t",
                                             payload={"r": TEXT})]) for r in runs]
            t0 = time.process_time()
            outs = store.append_group(batches)
            cpu += time.process_time() - t0
            assert all(isinstance(o, list) and len(o) == 2 for o in outs), outs
            g += 1
        blocks.append(1e6 * cpu / per_block)
    # The statements of a few more groups, counted apart from the timed ones.
    real.set_trace_callback(traced.append)
    store._db = Counting()  # type: ignore[assignment]
    for k in range(10):
        if other:
            side.execute("INSERT INTO bench_side VALUES (1)")
        store.append_group([GroupBatch([StepEvent(run_id=r, step_id=f"t{k}", phase="intent", kind="tool", name="t",
                                                  payload={"a": TEXT})]) for r in runs])
    store._db = real
    real.set_trace_callback(None)
    side.close()
    store.close()
    return {"cpu_us": statistics.median(blocks), "statements": len(traced) / 10, "calls": calls[0] / 10}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="8,32")
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--against", default=None, help="another tree's src folder, measured alternately")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        m, other = args.child.split(":")
        print(json.dumps(cell(int(m), args.groups, other == "other", args.repeats)))
        return
    here = str(Path(__file__).resolve().parents[1] / "src")
    trees = {"this": here, **({"against": args.against} if args.against else {})}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for m in args.runs.split(","):
        for case in ("same", "other"):
            for _ in range(args.repeats if args.against else 1):
                for name, src in trees.items():  # alternated
                    out = subprocess.run([sys.executable, __file__, "--child", f"{m}:{case}", "--groups",
                                          str(args.groups), "--repeats", str(args.repeats)],
                                         env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True,
                                         check=True)
                    results.setdefault((f"M={m} {case}", name), []).append(json.loads(out.stdout))
    print(f"SQLite group transactions, {args.groups} groups per cell, medians; trees: "
          + ", ".join(f"{k}={v}" for k, v in trees.items()))
    print("| cell | tree | CPU µs/group | statements/group (traced) | execute calls/group |")
    print("|---|---|---|---|---|")
    for (label, name), reps in results.items():
        med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
        print(f"| {label} | {name} | {med['cpu_us']:,.0f} | {med['statements']:.1f} | {med['calls']:.1f} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
