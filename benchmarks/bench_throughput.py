"""Throughput of many runs: group commit against one sync per step, beside a raw driver floor.

Usage: ``python benchmarks/bench_throughput.py [--quick] [--runs 1,8,32,128] [--procs 1,2,4]
[--turns 50] [--backends sqlite,postgres] [--modes alone,default,group] [--repeats 3] [--pg URL]
[--json out.json]``

M concurrent runs of ``--turns`` turns each (a canned model, :class:`Canned`, that calls one
idempotent tool per turn, then answers: ``2 * turns + 1`` durable steps per run, the tool returning 400 bytes of
English-like text) are spread over P worker processes (M/P runs each, as tasks of one asyncio
event loop, which is how a worker drives its runs; the runs of a process share one agent, as a
worker's share the one it was given). The P processes start together at a barrier.
Every process opens its own store on one journal, new for each cell:

- ``alone``: the store with group commit turned off (``store.group_commit = False``): each run's
  commit blocks the loop (one sync per step), as every store did before group commit was the default;
- ``default``: the store as :func:`~cuaderno.open_journal` returns it: its runs commit through
  the store's shared group (:func:`cuaderno.journal.shared_group`), a run alone at once;
- ``group``: the same store wrapped in :class:`~cuaderno.journal._group.GroupCommit`: the
  appends the loop's runs make in one turn of the loop share one transaction and its sync.

Reported per cell: aggregate durable steps/s (steps yielded by every run, each only after its
commit, over the time from the barrier to the last run's end), and p50 / p99 step latency (the
time between a run's consecutive steps, its first step from the run's start), medians over
``--repeats``.

The floor, measured in the same invocation just before each backend's cells (and again after
them; the table gives both): the raw driver doing one INSERT of a 400-byte row and one synced
COMMIT per step, on one connection, in this process: ``sqlite3`` in WAL with
``synchronous=FULL``; psycopg 3 with ``synchronous_commit=on`` on the same server. The issue's
goals compare against it: SQLite M=32 in one process at least 1.0x the floor, PostgreSQL M=32 in
one process at least 5x it, and four PostgreSQL processes at least 3x one.

The loop's ceiling, measured first: the largest M in one process on a store in memory (no SQL,
no sync, nothing durable): what the agent loop itself costs per step, which no durable store can
beat in one process (``--no-ceiling`` skips it).

``--quick``: M = 1, 8, 32, P = 1, 2, 10 turns, one repeat: a smoke run of a minute or two.
SQLite journals live in a temporary directory on the disk of ``--dir`` (default: the system's);
PostgreSQL journals in schemas of their own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench_journal import payload_text

from cuaderno import Agent, ModelRequest, ModelResponse, ScriptedGateway, Session, open_journal, tool
from cuaderno.journal._group import GroupCommit

try:
    from cuaderno.journal import shared_group
except ImportError:  # a tree from before group commit was the default (bench_instructions --base)
    shared_group = None  # type: ignore[assignment]

PAYLOAD = payload_text(400)


# -- one worker process ---------------------------------------------------------------------------


class Canned:
    """A model that answers from a list, one answer per call: the scripted gateway fingerprints
    every request it is sent (its billing log), which grows with the conversation and would
    measure the fake provider rather than cuaderno."""

    def __init__(self, answers: list[ModelResponse]) -> None:
        self.answers, self.calls = answers, 0

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        self.calls += 1
        # A provider call always suspends its caller (it awaits the network). An answer that never
        # suspended would let the first run of a loop drive all its turns before any other run
        # started, alone and at one sync per step, inside the M-run measurement.
        await asyncio.sleep(0)
        return self.answers[min(self.calls, len(self.answers)) - 1]


def _agent(turns: int) -> Agent:
    """One agent for every run of a process, as a worker's runs share the one it was given."""
    @tool(idempotent=True)
    def lookup(item: str) -> str:
        """Look an item up (400 bytes of text)."""
        return PAYLOAD

    return Agent(instructions="throughput", tools=[lookup], max_turns=turns + 1)


def _gateway(turns: int) -> Canned:
    """A run's own model: ``turns`` tool calls, then its answer."""
    return Canned([*(ScriptedGateway.call("lookup", item=f"i{i}") for i in range(turns)),
                   ScriptedGateway.text("done")])


def open_store(url: str, mode: str) -> Any:
    """The journal at ``url``, through a group commit in mode ``group``, without one in ``alone``."""
    base = open_journal(url)
    if mode == "alone":
        base.group_commit = False  # type: ignore[attr-defined]
    return GroupCommit(base) if mode == "group" else base


async def drive_runs(store: Any, run_ids: list[str], turns: int, gaps: list[float] | None = None) -> int:
    """Drive the runs to their end on this loop, sharing one agent; the number of durable steps.
    ``gaps``: each step's time since the run's previous one is appended to it."""
    agent = _agent(turns)
    steps = 0

    async def one(run_id: str) -> None:
        nonlocal steps
        last = time.perf_counter()
        async for _ in agent.run("task", session=Session(run_id, _gateway(turns), store)):
            now = time.perf_counter()
            if gaps is not None:
                gaps.append(now - last)
            last = now
            steps += 1

    await asyncio.gather(*(one(r) for r in run_ids))
    return steps


async def _drive(url: str, mode: str, run_ids: list[str], turns: int) -> dict[str, Any]:
    store = open_store(url, mode)
    gaps: list[float] = []
    t0, cpu0 = time.monotonic(), time.process_time()
    try:
        steps = await drive_runs(store, run_ids, turns, gaps)
    finally:
        t1, cpu1 = time.monotonic(), time.process_time()
        counted = store if mode == "group" else shared_group(store)
        groups = getattr(counted, "groups", 0)
        appends = getattr(counted, "appends", 0)
        store.close()
    return {"steps": steps, "gaps": gaps, "t0": t0, "t1": t1, "groups": groups, "appends": appends,
            "cpu_s": cpu1 - cpu0}


def _worker(url: str, mode: str, run_ids: list[str], turns: int, barrier: Any, out: Any) -> None:
    try:
        barrier.wait(timeout=120)
        out.put(asyncio.run(_drive(url, mode, run_ids, turns)))
    except BaseException as exc:
        out.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


def cell(url: str, mode: str, m: int, procs: int, turns: int) -> dict[str, Any]:
    """One measurement: M runs over ``procs`` processes on the journal at ``url``."""
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    tag = uuid.uuid4().hex[:6]
    shares = [[f"{tag}-{i}" for i in range(m) if i % procs == p] for p in range(procs)]
    workers = [ctx.Process(target=_worker, args=(url, mode, share, turns, barrier, out)) for share in shares]
    for w in workers:
        w.start()
    results = [out.get(timeout=1800) for _ in workers]
    for w in workers:
        w.join()
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        raise RuntimeError(f"{mode} M={m} P={procs}: {errors[0]}")
    steps = sum(r["steps"] for r in results)
    span = max(r["t1"] for r in results) - min(r["t0"] for r in results)
    gaps = sorted(g for r in results for g in r["gaps"])
    groups = sum(r["groups"] for r in results)
    return {"steps_per_s": steps / span, "p50_ms": 1000 * gaps[len(gaps) // 2],
            "cpu_us_per_step": 1e6 * sum(r["cpu_s"] for r in results) / max(1, steps),
            "p99_ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))], "steps": steps,
            "group_size": (sum(r["appends"] for r in results) / groups) if groups else None}


# -- floors ---------------------------------------------------------------------------------------


def sqlite_floor(directory: str, steps: int) -> float:
    """Steps/s of raw sqlite3: one INSERT + one synced COMMIT per step, one connection."""
    path = os.path.join(directory, f"floor-{uuid.uuid4().hex[:6]}.db")
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE t (run TEXT, seq INTEGER, payload BLOB, PRIMARY KEY (run, seq))")
        row = PAYLOAD.encode()
        t0 = time.perf_counter()
        for s in range(steps):
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t VALUES (?,?,?)", ("r", s, row))
            db.execute("COMMIT")
        return steps / (time.perf_counter() - t0)
    finally:
        db.close()
        for suffix in ("", "-wal", "-shm"):
            Path(path + suffix).unlink(missing_ok=True)


def pg_floor(url: str, steps: int) -> float:
    """Steps/s of psycopg 3: one INSERT + one COMMIT per step (synchronous_commit=on), one connection."""
    import psycopg

    table = f"bench_floor_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit TO on")
        conn.execute(f"CREATE TABLE {table} (run TEXT, seq INTEGER, payload BYTEA, PRIMARY KEY (run, seq))")
        try:
            row = PAYLOAD.encode()
            t0 = time.perf_counter()
            for s in range(steps):
                with conn.transaction():
                    conn.execute(f"INSERT INTO {table} VALUES (%s,%s,%s)", ("r", s, row))  # noqa: S608
            return steps / (time.perf_counter() - t0)
        finally:
            conn.execute(f"DROP TABLE {table}")


# -- journals -------------------------------------------------------------------------------------


class Journals:
    """A new journal per cell: a SQLite file, or a PostgreSQL schema (dropped at the end)."""

    def __init__(self, directory: str, pg: str) -> None:
        self.directory, self.pg = directory, pg
        self.schemas: list[str] = []

    def new(self, backend: str) -> str:
        if backend == "sqlite":
            url = f"sqlite:///{self.directory}/j-{uuid.uuid4().hex[:8]}.db"
        else:
            self.schemas.append(f"bench_tp_{uuid.uuid4().hex[:10]}")
            url = f"{self.pg}?schema={self.schemas[-1]}"
        open_journal(url).close()  # created before the workers open it
        return url

    def drop(self) -> None:
        if not self.schemas:
            return
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.pg, autocommit=True) as conn:
            for name in self.schemas:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


# -- the table ------------------------------------------------------------------------------------


def _median(cells: list[dict[str, Any]], key: str) -> float | None:
    values = [c[key] for c in cells if c.get(key) is not None]
    return statistics.median(values) if values else None


def measure(args: argparse.Namespace) -> dict[str, Any]:
    journals = Journals(args.dir, args.pg)
    report: dict[str, Any] = {"floors": {}, "cells": [], "load_before": os.getloadavg()}
    if args.ceiling:
        # The loop's own ceiling: the same runs on a store in memory (no SQL, no sync, nothing
        # durable). No durable store can make a step cheaper than this in one process.
        reps = [cell("memory://", "alone", m, 1, args.turns) for m in (max(args.runs),) for _ in range(args.repeats)]
        report["ceiling"] = {"M": max(args.runs), "steps_per_s": _median(reps, "steps_per_s"),
                             "repeats": [r["steps_per_s"] for r in reps]}
        print(f"ceiling (memory store, M={max(args.runs)}, P=1): {report['ceiling']['steps_per_s']:,.0f} steps/s",
              file=sys.stderr, flush=True)
    try:
        for backend in args.backends:
            floor = sqlite_floor if backend == "sqlite" else pg_floor
            where = args.dir if backend == "sqlite" else args.pg
            before = floor(where, args.floor_steps)
            print(f"{backend} floor: {before:,.0f} steps/s", file=sys.stderr, flush=True)
            for procs in args.procs:
                for m in args.runs:
                    if m < procs:
                        continue
                    for mode in args.modes:
                        reps = [cell(journals.new(backend), mode, m, procs, args.turns) for _ in range(args.repeats)]
                        row = {"backend": backend, "mode": mode, "M": m, "P": procs,
                               **{k: _median(reps, k) for k in ("steps_per_s", "p50_ms", "p99_ms", "group_size",
                                                                  "cpu_us_per_step")},
                               "repeats": [r["steps_per_s"] for r in reps]}
                        report["cells"].append(row)
                        print(f"{backend:8} {mode:6} M={m:<4} P={procs}: {row['steps_per_s']:8,.0f} steps/s  "
                              f"p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:7.2f} ms  CPU {row['cpu_us_per_step']:5.0f} us/step  "
                              f"group {row['group_size'] or 1:5.1f}", file=sys.stderr, flush=True)
            after = floor(where, args.floor_steps)
            report["floors"][backend] = {"before": before, "after": after}
    finally:
        journals.drop()
    report["load_after"] = os.getloadavg()
    return report


def render(report: dict[str, Any]) -> str:
    lines = []
    for backend, floor in report["floors"].items():
        ref = statistics.mean([floor["before"], floor["after"]])
        if "ceiling" in report:
            lines.append(f"\nthe loop's ceiling (memory store, nothing durable, M={report['ceiling']['M']}, one process): "
                         f"{report['ceiling']['steps_per_s']:,.0f} steps/s = "
                         f"{report['ceiling']['steps_per_s'] / ref:.2f}x the {backend} floor")
        lines.append(f"\n{backend}: raw driver floor {floor['before']:,.0f} / {floor['after']:,.0f} steps/s "
                     "(before / after the cells; ratios below use their mean)")
        lines.append("| mode | M | P | steps/s | x floor | p50 ms | p99 ms | mean group |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for c in report["cells"]:
            if c["backend"] != backend:
                continue
            lines.append(f"| {c['mode']} | {c['M']} | {c['P']} | {c['steps_per_s']:,.0f} | "
                         f"{c['steps_per_s'] / ref:.2f} | {c['p50_ms']:.2f} | {c['p99_ms']:.2f} | "
                         f"{c['group_size'] or 1:.1f} |")
    lines.append(f"\nload average before {report['load_before'][0]:.1f}, after {report['load_after'][0]:.1f} "
                 f"({os.cpu_count()} CPUs)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", default=None, help="M values, comma-separated (default 1,8,32,128)")
    ap.add_argument("--procs", default=None, help="worker processes, comma-separated (default 1,2,4)")
    ap.add_argument("--turns", type=int, default=None)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--modes", default="alone,default,group")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--floor-steps", type=int, default=None)
    ap.add_argument("--pg", default=os.environ.get("CUADERNO_TEST_PG", "postgresql://127.0.0.1:5432/test"))
    ap.add_argument("--dir", default=None, help="where the SQLite journals go (a temporary folder in it)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                    help="skip the loop's ceiling (the same runs on a store in memory)")
    args = ap.parse_args()
    quick = args.quick
    args.runs = [int(x) for x in (args.runs or ("1,8,32" if quick else "1,8,32,128")).split(",")]
    args.procs = [int(x) for x in (args.procs or ("1,2" if quick else "1,2,4")).split(",")]
    args.turns = args.turns or (10 if quick else 50)
    args.repeats = args.repeats or (1 if quick else 3)
    args.floor_steps = args.floor_steps or (500 if quick else 2000)
    args.backends = args.backends.split(",")
    args.modes = args.modes.split(",")
    args.dir = tempfile.mkdtemp(prefix="bench-throughput-", dir=args.dir)
    try:
        report = measure(args)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
