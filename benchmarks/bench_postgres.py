"""Append and step latency: PostgresCheckpointer beside SqliteCheckpointer, in one run.

Usage: ``python benchmarks/bench_postgres.py [--repeats 5] [--appends 200] [--turns 50]
[--url postgresql://127.0.0.1:5432/test]``

What is measured, one process, one run at a time (so one commit at a time: this is latency, not
throughput; issue 21 part 5 measures throughput with concurrent runs):

- ``append``: one event appended per call (an intent-sized payload), ``--appends`` calls, each
  its own durable commit. Beside each store, its driver's floor on the same server or disk: one
  INSERT and one synced COMMIT per call (``sqlite3`` in WAL with ``synchronous=FULL``; psycopg
  with ``synchronous_commit=on``), so the store's overhead is the ratio.
- ``step``: the bench_journal agent (a scripted model asking for one tool call per turn, a
  400-byte English-like tool result) for ``--turns`` turns: wall time per durable step (a model
  call or a tool call, each an intent and a result).

Medians over ``--repeats``; every repeat uses a new SQLite file and a new PostgreSQL schema
(dropped afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_journal import run_agent

from cuaderno.events import StepEvent
from cuaderno.journal import SqliteCheckpointer
from cuaderno.journal.postgres import PostgresCheckpointer

INTENT = {"arguments": {"to": "acct-9", "amount": 100}, "request": "x" * 120}


def _appends(store: object, n: int) -> float:
    append = store.append  # type: ignore[attr-defined]
    append([StepEvent(run_id="a", step_id="run", phase="start", kind="run", payload={})])
    t0 = time.perf_counter()
    for i in range(n):
        append([StepEvent(run_id="a", step_id=f"t{i:05d}.tool00", phase="intent", kind="tool", name="pay",
                          fingerprint=f"f{i}", payload=INTENT)])
    return (time.perf_counter() - t0) / n


def sqlite_floor(path: str, n: int) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB)")
    payload = repr(INTENT).encode()
    t0 = time.perf_counter()
    for i in range(n):
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t VALUES (?, ?)", (f"k{i:08d}", payload))
        db.execute("COMMIT")
    elapsed = (time.perf_counter() - t0) / n
    db.close()
    return elapsed


def pg_floor(url: str, schema: str, n: int) -> float:
    payload = repr(INTENT).encode()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit TO on")
        conn.execute(sql.SQL("CREATE TABLE {}.t (k TEXT PRIMARY KEY, v BYTEA)").format(sql.Identifier(schema)))
        insert = sql.SQL("INSERT INTO {}.t VALUES (%s, %s)").format(sql.Identifier(schema))
        t0 = time.perf_counter()
        for i in range(n):
            with conn.transaction():
                conn.execute(insert, (f"k{i:08d}", payload))
        return (time.perf_counter() - t0) / n


def one_repeat(url: str, tmp: Path, appends: int, turns: int) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    out: dict[str, float] = {}
    try:
        with SqliteCheckpointer(tmp / f"{schema}-a.db") as s:
            out["sqlite append"] = _appends(s, appends)
        out["sqlite3 floor"] = sqlite_floor(str(tmp / f"{schema}-floor.db"), appends)
        with SqliteCheckpointer(tmp / f"{schema}-s.db") as s:
            out["sqlite step"] = asyncio.run(run_agent(s, turns)) / (2 * turns + 1)
        with PostgresCheckpointer(url, schema=schema) as p:
            out["postgres append"] = _appends(p, appends)
        out["psycopg floor"] = pg_floor(url, schema, appends)
        with PostgresCheckpointer(url, schema=f"{schema}_s") as p:
            out["postgres step"] = asyncio.run(run_agent(p, turns)) / (2 * turns + 1)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for name in (schema, f"{schema}_s"):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--appends", type=int, default=200)
    ap.add_argument("--turns", type=int, default=50)
    ap.add_argument("--url", default="postgresql://127.0.0.1:5432/test")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        reps = [one_repeat(a.url, Path(d), a.appends, a.turns) for _ in range(a.repeats)]
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    ratio = {k: statistics.median(r[f"{k} append"] / r[f"{f} floor"] for r in reps)
             for k, f in (("sqlite", "sqlite3"), ("postgres", "psycopg"))}
    print(f"medians of {a.repeats} repeats; {a.appends} appends, {a.turns} turns ({2 * a.turns + 1} durable steps)")
    print(f"{'':22}{'SQLite':>12}{'PostgreSQL':>14}")
    print(f"{'driver floor / commit':22}{med['sqlite3 floor'] * 1e3:>10.2f}ms{med['psycopg floor'] * 1e3:>12.2f}ms")
    print(f"{'append':22}{med['sqlite append'] * 1e3:>10.2f}ms{med['postgres append'] * 1e3:>12.2f}ms")
    print(f"{'append / floor':22}{ratio['sqlite']:>11.2f}x{ratio['postgres']:>13.2f}x")
    print(f"{'step (agent loop)':22}{med['sqlite step'] * 1e3:>10.2f}ms{med['postgres step'] * 1e3:>12.2f}ms")


if __name__ == "__main__":
    main()
