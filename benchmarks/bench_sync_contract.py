"""Does the ``Checkpointer`` contract stay synchronous? What a blocking append costs M runs on one loop.

Usage: ``python benchmarks/bench_sync_contract.py [--runs 1,8,32] [--steps 50] [--repeats 3]
[--payload 400] [--pg postgresql://127.0.0.1:5432/test] [--json out.json]``

M runs share one asyncio event loop, as runs in one worker process do. Each run makes ``--steps``
durable steps; a step is one append: one INSERT and one synced COMMIT of a ``--payload``-byte row
(nothing else, so the figures are the journal's alone: a real step adds ~0.4 ms of loop CPU and a
model call). Aggregate durable steps/s, median over ``--repeats``, for each way of calling the store:

- ``sync``: the append blocks the loop (today's contract: ``store.append(...)`` inline);
- ``thread``: ``await asyncio.to_thread(append)``, one connection per run, a thread pool of M;
- ``async``: psycopg's ``AsyncConnection``, one per run (what an async contract would allow).

Backends:

- ``cuaderno-sqlite``: :class:`SqliteCheckpointer` itself (WAL, ``synchronous=FULL``), one store
  shared by the runs (SQLite has one writer; ``thread`` hops to a thread for the same store);
- ``sqlite``: raw ``sqlite3``, the same settings, one INSERT per commit: the floor under the above;
- ``pg``: psycopg 3 on the machine's PostgreSQL (loopback, ``synchronous_commit=on``);
- ``pg+rtt``: the same with a simulated network round trip of ``--rtt-ms`` (default 0.5) added
  to each statement, as a database on another host costs: ``time.sleep`` where the call blocks,
  ``asyncio.sleep`` in ``async`` (its timer rounds up to whole milliseconds, so ``async`` pays
  1 ms per statement there: if anything, flattering ``sync``).

Every table the benchmark creates is its own (named after its pid) and dropped at the end.

The figures measured, and the decision they led to (the contract stays synchronous; runs that
share a loop call it through a group commit, one transaction and one sync per turn of the loop), are in the docstring of
:mod:`cuaderno.journal.base`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cuaderno import SqliteCheckpointer, StepEvent

Append = Callable[[int, int], None]
"""(run index, step) -> one durable append, blocking."""

TABLE = f"bench_sync_contract_{os.getpid()}"


async def drive(m: int, steps: int, step: Callable[[int, int], Awaitable[None]]) -> float:
    """M runs of ``steps`` appends on this loop; return aggregate steps/s."""
    async def one(run: int) -> None:
        for s in range(steps):
            await step(run, s)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(r) for r in range(m)))
    return m * steps / (time.perf_counter() - t0)


def on_loop(append: Append) -> Callable[[int, int], Awaitable[None]]:
    async def step(run: int, s: int) -> None:
        append(run, s)  # blocks the loop: no other run moves meanwhile
        await asyncio.sleep(0)  # the step's other awaits (a model call) let the others run
    return step


def in_thread(append: Append) -> Callable[[int, int], Awaitable[None]]:
    async def step(run: int, s: int) -> None:
        await asyncio.to_thread(append, run, s)
    return step


def run_mode(m: int, steps: int, make_step: Callable[[], Callable[[int, int], Awaitable[None]]]) -> float:
    async def main() -> float:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=max(m, 1)))
        return await drive(m, steps, make_step())
    return asyncio.run(main())


# -- SQLite ---------------------------------------------------------------------------------------


def cuaderno_sqlite(path: str, payload: bytes) -> tuple[Append, Callable[[], None]]:
    store = SqliteCheckpointer(path)
    text = payload.decode()

    def append(run: int, s: int) -> None:
        store.append([StepEvent(run_id=f"r{run}", step_id=f"s{s}", phase="intent", kind="tool", payload={"x": text})])

    return append, store.close


def raw_sqlite(path: str, payload: bytes) -> tuple[Append, Callable[[], None]]:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (run INTEGER, seq INTEGER, payload BLOB, PRIMARY KEY (run, seq))")
    lock = threading.Lock()  # one connection: the thread variant serialises on it, as a store would

    def append(run: int, s: int) -> None:
        with lock:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t VALUES (?,?,?)", (run, s, payload))
            db.execute("COMMIT")

    return append, db.close


# -- PostgreSQL -----------------------------------------------------------------------------------


def pg_setup(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f"DROP TABLE IF EXISTS {TABLE}")
        con.execute(f"CREATE TABLE {TABLE} (run INTEGER, seq INTEGER, payload BYTEA, PRIMARY KEY (run, seq))")
        commit = con.execute("SHOW synchronous_commit").fetchone()
        fsync = con.execute("SHOW fsync").fetchone()
    print(f"postgres: synchronous_commit={commit[0] if commit else '?'} fsync={fsync[0] if fsync else '?'}")


def pg_truncate(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f"TRUNCATE {TABLE}")


def pg_drop(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as con:
        con.execute(f"DROP TABLE IF EXISTS {TABLE}")


def pg_sync(url: str, m: int, payload: bytes, rtt: float, *, per_run: bool) -> tuple[Append, Callable[[], None]]:
    """Blocking appends: one connection per run (``per_run``, for threads) or one shared."""
    import psycopg

    cons = [psycopg.connect(url) for _ in range(m if per_run else 1)]

    def append(run: int, s: int) -> None:
        con = cons[run if per_run else 0]
        if rtt:
            time.sleep(rtt)
        con.execute(f"INSERT INTO {TABLE} VALUES (%s,%s,%s)", (run, s, payload))  # noqa: S608 - our table
        if rtt:
            time.sleep(rtt)
        con.commit()

    def close() -> None:
        for con in cons:
            con.close()

    return append, close


def pg_async(url: str, m: int, steps: int, payload: bytes, rtt: float) -> float:
    import psycopg

    async def main() -> float:
        cons = [await psycopg.AsyncConnection.connect(url) for _ in range(m)]
        try:
            async def step(run: int, s: int) -> None:
                con = cons[run]
                if rtt:
                    await asyncio.sleep(rtt)
                await con.execute(f"INSERT INTO {TABLE} VALUES (%s,%s,%s)", (run, s, payload))  # noqa: S608
                if rtt:
                    await asyncio.sleep(rtt)
                await con.commit()
            return await drive(m, steps, step)
        finally:
            for con in cons:
                await con.close()

    return asyncio.run(main())


# -- the table ------------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    payload = b"x" * args.payload
    results: dict[str, dict[str, list[float]]] = {}

    def record(name: str, m: int, value: float) -> None:
        results.setdefault(name, {}).setdefault(str(m), []).append(value)

    pg = args.pg
    if pg:
        try:
            pg_setup(pg)
        except Exception as exc:  # no server: the SQLite half still answers part of the question
            print(f"postgres at {pg} unavailable ({type(exc).__name__}: {exc}); SQLite only", file=sys.stderr)
            pg = None
    try:
        for _ in range(args.repeats):
            for m in args.runs:
                for name, make in (("cuaderno-sqlite", cuaderno_sqlite), ("sqlite", raw_sqlite)):
                    for mode, wrap in (("sync", on_loop), ("thread", in_thread)):
                        with tempfile.TemporaryDirectory() as d:
                            append, close = make(str(Path(d) / "j.db"), payload)
                            try:
                                record(f"{name} {mode}", m, run_mode(m, args.steps, lambda a=append, w=wrap: w(a)))
                            finally:
                                close()
                if not pg:
                    continue
                for label, rtt in (("pg", 0.0), ("pg+rtt", args.rtt_ms / 1000)):
                    for mode in ("sync", "thread", "async"):
                        pg_truncate(pg)
                        if mode == "async":
                            record(f"{label} async", m, pg_async(pg, m, args.steps, payload, rtt))
                            continue
                        append, close = pg_sync(pg, m, payload, rtt, per_run=mode == "thread")
                        try:
                            wrap = on_loop if mode == "sync" else in_thread
                            record(f"{label} {mode}", m, run_mode(m, args.steps, lambda a=append, w=wrap: w(a)))
                        finally:
                            close()
    finally:
        if pg:
            pg_drop(pg)
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="1,8,32", type=lambda v: [int(x) for x in v.split(",")])
    ap.add_argument("--steps", default=50, type=int)
    ap.add_argument("--repeats", default=3, type=int)
    ap.add_argument("--payload", default=400, type=int)
    ap.add_argument("--rtt-ms", default=0.5, type=float)
    ap.add_argument("--pg", default=os.environ.get("BENCH_PG", "postgresql://127.0.0.1:5432/test"),
                    help="a PostgreSQL URL (loopback); '' to skip")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = measure(args)
    print(f"\ndurable steps/s, {args.steps} appends per run, median of {args.repeats} "
          f"(payload {args.payload} B, rtt {args.rtt_ms} ms):")
    print(f"{'':22}" + "".join(f"{'M=' + str(m):>10}" for m in args.runs))
    medians: dict[str, dict[str, float]] = {}
    for name, by_m in results.items():
        medians[name] = {m: statistics.median(v) for m, v in by_m.items()}
        print(f"{name:22}" + "".join(f"{medians[name][str(m)]:>10,.0f}" for m in args.runs))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "medians": medians, "all": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

