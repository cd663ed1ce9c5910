"""Prune throughput (closed runs removed per second) on SQLite and PostgreSQL, beside a floor, and
what giving the space back costs on SQLite (full ``VACUUM`` against ``incremental_vacuum``).

Usage: ``python benchmarks/bench_prune.py [--runs 2000] [--repeats 3] [--batch 200] [--pg URL]``

Each repeat builds the same journal twice (``--runs`` closed runs of 4 events each, 1.2 KB of
incompressible model text per turn, every other run aged past the bound) and removes the aged half:

- ``prune``: :func:`cuaderno.operations.prune` (the candidates' rows read and locked in the
  transaction, each run's holder probed, cleanup checked, the anchor's run kept, events and summary
  deleted, one transaction per ``--batch`` runs);
- ``floor``: the same deletes with plain SQL on the other copy, the same batches and commits, no
  checks (SQLite: ``DELETE ... WHERE run_id=?`` per run; PostgreSQL: ``run_id = ANY(batch)`` per
  table, as prune does): what removing the rows costs by itself.

Reported: medians of runs/s, and the median of ``prune / floor`` time computed within each repeat.
On SQLite also, on a third copy switched to ``auto_vacuum=INCREMENTAL`` before pruning: the time
and the bytes given back by ``PRAGMA incremental_vacuum`` after the prune, against a full
``VACUUM`` of the first copy after its prune.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cuaderno import open_journal, operations
from cuaderno.events import StepEvent

VERSIONS = {"schema": 1, "loop": "bench", "policy": "bench"}
DAY = 86_400.0


def _events(run_id: str, text: str) -> list[StepEvent]:
    start = StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", fingerprint="f",
                      payload={"task": "bench", "versions": VERSIONS})
    turns = [StepEvent(run_id=run_id, step_id=f"t{t:04d}.model", phase="result", kind="model", fingerprint=f"m{t}",
                       payload={"response": {"text": text}}) for t in range(2)]
    end = StepEvent(run_id=run_id, step_id="run", phase="end", kind="run", payload={"status": "completed"})
    return [start, *turns, end]


def _build(url: str, runs: int, pattern: str = "oldest") -> None:
    text = os.urandom(600).hex()
    store = open_journal(url)
    try:
        for i in range(runs):
            store.append(_events(f"r{i:06d}", text))
    finally:
        store.close()
    # Half the runs aged past the bound, so a full VACUUM has the kept half to rewrite (its cost grows
    # with what is kept). "oldest": the first half, as retention removes them (their rows fill whole
    # pages); "interleaved": every other run (the worst case for incremental_vacuum, which gives back
    # only pages left entirely empty).
    half = [f"r{i:06d}" for i in range(runs) if (i % 2 == 0 if pattern == "interleaved" else i < runs // 2)]
    db = _connect(url)
    try:
        p = "%s" if url.startswith("postgresql") else "?"
        statement = ("UPDATE cuaderno_runs SET updated_at = updated_at - 3 * 86400 WHERE run_id = %s" if p == "%s"
                     else "UPDATE cuaderno_runs SET updated_at = updated_at - 3 * 86400 WHERE run_id = ?")
        for run_id in half:
            db.execute(statement, (run_id,))
    finally:
        db.close()


def _connect(url: str) -> Any:
    if url.startswith("postgresql"):
        from urllib.parse import parse_qs, urlsplit

        import psycopg

        parts = urlsplit(url)
        conn = psycopg.connect(parts._replace(query="").geturl(), autocommit=True)
        conn.execute(f'SET search_path TO "{parse_qs(parts.query)["schema"][0]}"')
        return conn
    return sqlite3.connect(url, isolation_level=None)


def _sql(url: str, statement: str) -> None:
    db = _connect(url)
    try:
        db.execute(statement)
    finally:
        db.close()


def _floor(url: str, batch: int) -> float:
    """Every run removed with plain deletes, ``batch`` runs per transaction; seconds."""
    db = _connect(url)
    p = "%s" if url.startswith("postgresql") else "?"
    try:
        aged = ("SELECT run_id FROM cuaderno_runs WHERE updated_at < %s ORDER BY updated_at" if p == "%s" else
                "SELECT run_id FROM cuaderno_runs WHERE updated_at < ? ORDER BY updated_at")
        ids = [r[0] for r in db.execute(aged, (time.time() - DAY,)).fetchall()]
        started = time.perf_counter()
        for i in range(0, len(ids), batch):
            db.execute("BEGIN")
            if p == "%s":  # one statement per table and batch, as prune does (no round trip per run)
                db.execute("DELETE FROM cuaderno_events WHERE run_id = ANY(%s)", (ids[i:i + batch],))
                db.execute("DELETE FROM cuaderno_runs WHERE run_id = ANY(%s)", (ids[i:i + batch],))
            else:
                for run_id in ids[i:i + batch]:
                    db.execute("DELETE FROM cuaderno_events WHERE run_id=?", (run_id,))
                    db.execute("DELETE FROM cuaderno_runs WHERE run_id=?", (run_id,))
            db.execute("COMMIT")
        return time.perf_counter() - started
    finally:
        db.close()


def _prune(url: str, batch: int) -> tuple[float, int, operations.PruneReport]:
    store = open_journal(url)
    try:
        started = time.perf_counter()
        report = operations.prune(store, "1d", batch=batch)
        return time.perf_counter() - started, len(report.runs), report
    finally:
        store.close()


def _size(path: str) -> int:
    return sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s))


def _pg_urls(base: str, n: int) -> list[str]:
    import uuid

    return [f"{base}?schema=bench_prune_{uuid.uuid4().hex[:12]}" for _ in range(n)]


def _drop(url: str) -> None:
    from urllib.parse import parse_qs, urlsplit

    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(parts._replace(query="").geturl(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{parse_qs(parts.query)["schema"][0]}" CASCADE')


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--pg", default=os.environ.get("CUADERNO_TEST_PG", "postgresql://127.0.0.1:5432/test"))
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--pattern", choices=["oldest", "interleaved"], default="oldest")
    args = ap.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    vac: dict[str, list[float]] = {"full_s": [], "full_bytes_after": [], "incr_s": [], "incr_bytes_after": [],
                                   "bytes_before": [], "incr_prune_s": [], "prune_s": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            a, b, c = (os.path.join(tmp, f"{n}.db") for n in "abc")
            _build(a, args.runs, args.pattern)
            for dest in (b, c):
                shutil.copy(a, dest)
            db = sqlite3.connect(c, isolation_level=None)
            db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect with the VACUUM, on this connection
            db.execute("VACUUM")
            db.close()
            seconds, removed, _ = _prune(a, args.batch)  # not incremental: nothing given back here
            floor = _floor(b, args.batch)
            r = results.setdefault("sqlite", {"prune_runs_s": [], "floor_runs_s": [], "ratio": []})
            r["prune_runs_s"].append(removed / seconds)
            r["floor_runs_s"].append(removed / floor)
            r["ratio"].append(seconds / floor)
            vac["prune_s"].append(seconds)
            vac["bytes_before"].append(_size(a))
            db = sqlite3.connect(a, isolation_level=None)
            started = time.perf_counter()
            db.execute("VACUUM")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            vac["full_s"].append(time.perf_counter() - started)
            db.close()
            vac["full_bytes_after"].append(_size(a))
            seconds_c, _, report = _prune(c, args.batch)  # incremental: the prune gives its pages back
            assert report.vacuum is not None and report.vacuum["how"] == "incremental_vacuum", report.vacuum
            vac["incr_s"].append(float(report.vacuum["seconds"]))
            vac["incr_prune_s"].append(seconds_c)
            vac["incr_bytes_after"].append(_size(c))
        if not args.no_pg:
            urls = _pg_urls(args.pg, 2)
            try:
                for url in urls:
                    _build(url, args.runs, args.pattern)
                seconds, removed, _ = _prune(urls[0], args.batch)
                floor = _floor(urls[1], args.batch)
                r = results.setdefault("postgres", {"prune_runs_s": [], "floor_runs_s": [], "ratio": []})
                r["prune_runs_s"].append(removed / seconds)
                r["floor_runs_s"].append(removed / floor)
                r["ratio"].append(seconds / floor)
            finally:
                for url in urls:
                    _drop(url)
    med = statistics.median
    print(f"prune throughput, {args.runs} closed runs of 4 events (2.4 KB of text each), the {args.pattern} half "
          f"removed, batch {args.batch}, medians of {args.repeats}:")
    print(f"{'backend':10} {'prune runs/s':>13} {'floor runs/s':>13} {'prune/floor time':>17}")
    for backend, r in results.items():
        print(f"{backend:10} {med(r['prune_runs_s']):13,.0f} {med(r['floor_runs_s']):13,.0f} {med(r['ratio']):17.2f}")
    print("SQLite, space given back after removing half the runs (medians):")
    print(f"  before: {med(vac['bytes_before']):,.0f} bytes")
    print(f"  full VACUUM:        {med(vac['full_s']) * 1000:8.1f} ms -> {med(vac['full_bytes_after']):,.0f} bytes")
    print(f"  incremental_vacuum: {med(vac['incr_s']) * 1000:8.1f} ms -> {med(vac['incr_bytes_after']):,.0f} bytes "
          "(file switched to auto_vacuum=INCREMENTAL before the prune; run by the prune itself)")
    print(f"  the prune itself: {med(vac['prune_s']) * 1000:.1f} ms (auto_vacuum NONE), "
          f"{med(vac['incr_prune_s']) * 1000:.1f} ms (INCREMENTAL, its vacuum included)")


if __name__ == "__main__":
    main()
