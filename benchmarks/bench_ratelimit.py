"""What the shared rate limiter costs per model call, on SQLite and PostgreSQL, side by side.

Usage: ``python benchmarks/bench_ratelimit.py [--runs 200] [--rounds 5] [--pg URL | --no-pg]``

One run = one agent run of one model call (a scripted gateway: no network), on a journal of
each backend. In one process, the variants alternate run by run (so a busy machine, or a
journal that grows, slows every variant alike); each round times ``--runs`` runs of each
variant; the figures are the medians of the per-run times over all rounds:

- ``none``: the gateway declares no limit (``rate_gate`` returns ``None`` after one attribute
  read): the floor the others are compared with.
- ``rpm``: ``RateLimit(requests_per_minute=1e9)``: one turn taken per call (one short
  transaction on the limiter's own connection), never a wait.
- ``rpm+tpm``: requests and tokens: the turn, and the token count set right after the answer
  (a second statement).
- ``rpm, no re-check``: ``rpm`` without the look at the row between the intent's commit and
  the send (:meth:`RateGate.ready` made a no-op for these runs): the gate as it was before that
  look, so that its cost is measured in the same process, alternating with the others.
- ``reserve alone``: the limiter's turn by itself, in a loop, and the empty transaction of the
  same connection kind (``BEGIN IMMEDIATE; COMMIT`` / ``BEGIN; SELECT 1; COMMIT``): the floor of
  any shared state kept in the journal's database.
- ``re-check alone``: the look itself (:meth:`SharedLimits.still_due`, one plain read), in a loop.

Ratios are against ``none`` in the same run. Each variant's figure is wall time; ``cpu`` is this
process's CPU time (``time.process_time``) per run, median too.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuaderno import Agent, RateLimit, ScriptedGateway, Session, SqliteCheckpointer
from cuaderno.flow.ratelimit import RateGate, SharedLimits

AGENT = Agent(instructions="answer", name="bench-rl")
LIMITS: dict[str, RateLimit | None] = {
    "none": None,
    "rpm": RateLimit(requests_per_minute=1e9),
    "rpm, no re-check": RateLimit(requests_per_minute=1e9),
    "rpm+tpm": RateLimit(requests_per_minute=1e9, tokens_per_minute=1e12),
}
_READY = RateGate.ready


async def _no_recheck(self: RateGate, *, bounded: bool = True) -> None:
    """:meth:`RateGate.ready` as it was before it looked at the row: nothing."""


async def _runs(store: Any, n: int, tag: str) -> dict[str, list[float]]:
    """``n`` runs of each variant, alternating run by run (a drift of the machine or of the
    journal's size then weighs on every variant alike)."""
    out: dict[str, list[float]] = {key: [] for key in LIMITS}
    for key in LIMITS:
        out[f"{key} cpu"] = []
    for i in range(n):
        for key, limit in LIMITS.items():
            RateGate.ready = _no_recheck if key == "rpm, no re-check" else _READY  # type: ignore[method-assign]
            gateway = ScriptedGateway([ScriptedGateway.text("done")], rate_limit=limit)
            cpu, start = time.process_time(), time.perf_counter()
            await AGENT.run_to_end("q", session=Session(f"{tag}-{key}-{i}", gateway, store))
            out[key].append(time.perf_counter() - start)
            out[f"{key} cpu"].append(time.process_time() - cpu)
    RateGate.ready = _READY  # type: ignore[method-assign]
    return out


def _loop(body: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        body()
        out.append(time.perf_counter() - start)
    return out


def bench(name: str, store: Any, empty_txn: Callable[[], object], runs: int, rounds: int) -> None:
    per: dict[str, list[float]] = {k: [] for k in LIMITS}
    per |= {f"{k} cpu": [] for k in LIMITS}
    per |= {k: [] for k in ("reserve alone", "re-check alone", "empty transaction")}
    limits = SharedLimits.of(store)
    reserve_limit = RateLimit(requests_per_minute=1e9)
    for r in range(rounds):
        for key, values in asyncio.run(_runs(store, runs, f"{r}-{uuid.uuid4().hex[:6]}")).items():
            per[key] += values
        per["reserve alone"] += _loop(lambda: limits.reserve("bench", reserve_limit, 0), runs)
        per["re-check alone"] += _loop(lambda: limits.still_due("bench", reserve_limit, 0.0), runs)
        per["empty transaction"] += _loop(empty_txn, runs)
    floor, cpu_floor = statistics.median(per["none"]), statistics.median(per["none cpu"])
    print(f"\n{name}: medians of {runs * rounds} each (ms); ratio to 'none'")
    for key, values in per.items():
        med = statistics.median(values)
        base = floor if key in LIMITS else cpu_floor if key.endswith(" cpu") else None
        extra = f"  x{med / base:.3f}  (+{(med - base) * 1e3:.3f} ms per call)" if base else ""
        print(f"  {key:22s} {med * 1e3:8.3f}{extra}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg", default=os.environ.get("CUADERNO_TEST_PG", "postgresql://127.0.0.1:5432/test"))
    parser.add_argument("--no-pg", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteCheckpointer(Path(tmp) / "j.db")
        import sqlite3

        side = sqlite3.connect(Path(tmp) / "j.db", isolation_level=None)
        side.execute("PRAGMA synchronous=NORMAL")

        def sqlite_empty() -> None:
            side.execute("BEGIN IMMEDIATE")
            side.execute("COMMIT")

        bench("SQLite (WAL, synchronous=FULL journal)", store, sqlite_empty, args.runs, args.rounds)
        side.close()
        store.close()
    if args.no_pg:
        return
    try:
        import psycopg
        from psycopg import sql

        from cuaderno.journal.postgres import PostgresCheckpointer
    except ImportError:
        print("PostgreSQL: not run (psycopg missing)", file=sys.stderr)
        return
    schema = f"bench_rl_{uuid.uuid4().hex[:10]}"
    try:
        store = PostgresCheckpointer(args.pg, schema=schema)
    except Exception as exc:  # no server: say so, never a figure
        print(f"PostgreSQL: not run ({exc})", file=sys.stderr)
        return
    conn = psycopg.connect(args.pg, autocommit=True)
    try:
        def pg_empty() -> None:
            with conn.transaction():
                conn.execute("SELECT 1")

        bench("PostgreSQL (loopback)", store, pg_empty, args.runs, args.rounds)
    finally:
        store.close()
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        conn.close()


if __name__ == "__main__":
    main()
