"""What group commit by default costs one run alone: the worker's CPU per durable step of a single
run on the store with group commit off (``store.group_commit = False``) and on the store as
:func:`~cuaderno.open_journal` returns it (its runs commit through the store's shared group),
side by side and interleaved (off, default, off, default...) so that the machine's drift falls on
both alike.

Usage: ``python benchmarks/bench_group_default.py [--turns 200] [--pairs 7] [--backends sqlite,postgres]
[--pg URL]``

Each measurement: a new journal, one run of ``--turns`` turns (one effect-free tool call per turn,
a canned model), driven to its end on one event loop; CPU is ``time.process_time`` of this
process over the run (the PostgreSQL server's is not counted), per durable step. SQLite files
are opened with ``synchronous=NORMAL`` (no sync per commit in WAL): the sync is the same in both modes and only adds noise to
a CPU comparison. Reported: the median of each mode and the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench_throughput import _agent, _gateway

from cuaderno import Session, open_journal


async def _one(store: object, turns: int) -> int:
    steps = 0
    async for _ in _agent(turns).run("task", session=Session(f"solo-{uuid.uuid4().hex[:6]}", _gateway(turns), store)):
        steps += 1
    return steps


def measure(url: str, mode: str, turns: int) -> float:
    """CPU microseconds per durable step of one run alone, in ``mode`` (``off`` or ``default``)."""
    store = open_journal(url)
    try:
        if mode == "off":
            store.group_commit = False  # type: ignore[attr-defined]
        t0 = time.process_time()
        steps = asyncio.run(_one(store, turns))
        return 1e6 * (time.process_time() - t0) / steps
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--pg", default=os.environ.get("CUADERNO_TEST_PG", "postgresql://127.0.0.1:5432/test"))
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs", flush=True)
    schemas: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-group-default-") as directory:
        try:
            for backend in args.backends.split(","):
                found: dict[str, list[float]] = {"off": [], "default": []}
                for _ in range(args.pairs):
                    for mode in ("off", "default"):
                        if backend == "sqlite":
                            url = f"sqlite:///{Path(directory) / uuid.uuid4().hex[:8]}.db?synchronous=NORMAL"
                        else:
                            schemas.append(f"bench_gd_{uuid.uuid4().hex[:10]}")
                            url = f"{args.pg}?schema={schemas[-1]}"
                        found[mode].append(measure(url, mode, args.turns))
                ratios = [d / o for o, d in zip(found["off"], found["default"], strict=True)]
                print(f"{backend:8} off {statistics.median(found['off']):6.0f} us/step {[round(x) for x in found['off']]}"
                      f"  default {statistics.median(found['default']):6.0f} us/step "
                      f"{[round(x) for x in found['default']]}  default/off per pair: median "
                      f"{statistics.median(ratios):.3f} {[round(r, 2) for r in ratios]}", flush=True)
        finally:
            if schemas:
                import psycopg
                from psycopg import sql

                with psycopg.connect(args.pg, autocommit=True) as conn:
                    for schema in schemas:
                        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
