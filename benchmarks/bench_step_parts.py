"""Where a durable step's time goes beyond the raw commit, measured side by side in one run.

Usage: ``python benchmarks/bench_step_parts.py [--repeats 7] [--turns 500]``

``bench_journal.py`` compares a durable step with a raw FULL-synced commit. This script splits
the difference into parts, each measured per commit, as medians over ``--repeats``:

- ``floor``: a raw ``sqlite3`` commit (as in ``bench_journal.py``).
- ``sql``: the exact statements of a durable step (``BEGIN IMMEDIATE``, ``PRAGMA data_version``,
  two event rows, the checkpoint upsert, ``COMMIT``), replayed from the rows a real run wrote,
  with no Python work between commits. This is the storage cost of the schema.
- ``sql + essential``: the same, plus the work any implementation of this journal format must do
  per step (build and encode two events, chain their row hashes, fingerprint one message into
  the request chain, encode the checkpoint). The least a Python step can cost here.
- ``loop cpu``: the durable loop on ``SqliteCheckpointer(":memory:")``, so no sync and no
  file: the CPU one step costs, SQLite included.
- ``cpu alone`` / ``cpu between commits``: a fixed amount of pure-Python work, timed alone and
  then added between raw commits. On a virtual machine the same work can take longer right after
  a commit's sync (cold caches, a rescheduled vCPU). Their ratio shows how much this machine
  inflates any work done between commits.
- ``sqlite``: the real durable step, ``(T(N) - T(1)) / (2N - 2)`` as in ``bench_journal.py``.
- ``sqlite cpu`` / ``floor cpu``: the CPU time (user + system, from ``getrusage``) the process
  spends per durable step and per raw commit, waiting for the disk excluded. Against ``loop cpu``
  (the same work with no sync) this shows what the sync does to the work around it: measured on
  this machine, the loop's CPU per step about doubles (0.08 -> 0.17 ms user time) and a raw
  commit's user time grows tenfold (3 -> 30 us), so every microsecond of Python in a step costs
  about two next to a synced commit.

Tried on this kind of machine (2 vCPUs, CPython 3.11.7 built by pyenv) to shrink ``loop cpu``,
measured, and not adopted, so nobody needs to try them again without a new reason:

- compiling the journal modules (events, checkpoint, fingerprint, JSON, append, SQLite backend)
  with mypyc: no change beyond the noise. Their time is already spent in C (the JSON encoder,
  SQLite, sha256); the loop itself cannot be compiled (mypyc has no async generators and no
  multiple inheritance of native classes);
- Debian's own CPython 3.11.2 instead of the pyenv build: about 10% less ``loop cpu`` (a
  property of the interpreter a user runs, not something cuaderno can choose);
- CPython 3.13.0 (pyenv): no better than 3.11;
- OpenSSL's sha256 from a copied context, or the built-in ``_sha256``: no faster (the cost is
  the hash object, about 1 µs, not the bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_journal import PAYLOAD, floor, run_agent

from cuaderno import SqliteCheckpointer
from cuaderno.events import StepEvent, encode_payload, row_hash
from cuaderno.fingerprint import chain, fingerprint
from cuaderno.journal._append import RawRow, decode_row
from cuaderno.journal._compress import pack
from cuaderno.journal.sqlite import _COLUMNS, _UPSERT_RUN
from cuaderno.plainjson import compact


def captured_commits(tmp: Path, turns: int) -> tuple[list[list[RawRow]], str]:
    """The event rows of a real run, paired the way the loop commits them, and its checkpoint."""
    path = str(tmp / "source.db")
    store = SqliteCheckpointer(path)
    asyncio.run(run_agent(store, turns, "x"))
    store.close()
    db = sqlite3.connect(path)
    rows = db.execute(f"SELECT {_COLUMNS} FROM cuaderno_events ORDER BY seq").fetchall()  # noqa: S608
    checkpoint = db.execute("SELECT checkpoint FROM cuaderno_runs").fetchone()[0]
    db.close()
    return [rows[i:i + 2] for i in range(1, len(rows) - 1, 2)], checkpoint


def replay_commits(path: str, commits: list[list[RawRow]], checkpoint: str, *,
             essential: bool = False) -> float:
    """Seconds per commit of the captured statements; with ``essential``, each commit also does the
    work no implementation of this journal format can skip (see :func:`essential_work`)."""
    store = SqliteCheckpointer(path)  # the real schema and settings
    db = store._db
    insert = f"INSERT INTO cuaderno_events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"  # noqa: S608
    decoded = [[(row, decode_row(row).payload) for row in rows] for rows in commits]
    cp = json.loads(checkpoint)
    t0 = time.perf_counter()
    for rows in decoded:
        if essential:
            essential_work(rows, cp)
        db.execute("BEGIN IMMEDIATE")
        db.execute("PRAGMA data_version").fetchone()
        db.executemany(insert, [row for row, _ in rows])
        db.execute(_UPSERT_RUN, ("x", "running", 1, rows[-1][0][10], checkpoint))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    store.close()
    return elapsed / len(commits)


def essential_work(rows: list[tuple[RawRow, dict[str, Any]]], cp: dict[str, Any]) -> None:
    """What one durable step must compute whatever the code around it looks like: its two events
    (objects, payload encoding, chained row hashes, compression of the large ones), one conversation
    message's fingerprint chained into the request fingerprint, one key derived from it, and the
    checkpoint's encoding.
    With the SQL, the least a Python step can cost in this journal format."""
    prev = str(cp["last_hash"])
    for row, payload in rows:
        ev = StepEvent(run_id=row[0], step_id=row[1], phase=row[2], kind=row[4], name=row[5], decision=row[6],
                       fingerprint=row[7], payload=payload)
        data = encode_payload(payload)
        prev = row_hash(prev, ev, row[3], data)
        pack(data)  # the store compresses large payloads (the default)
    message = {"role": "tool", "tool_call_id": "c1", "name": "work", "content": PAYLOAD, "is_error": False}
    request = chain(prev, fingerprint(message))
    fingerprint(["x", "t0001.model", request])  # the step's idempotency or effect key
    compact(cp)


def busy(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def cpu_alone(work: int, times: int) -> float:
    t0 = time.perf_counter()
    for _ in range(times):
        busy(work)
    return (time.perf_counter() - t0) / times


def cpu_seconds() -> float:
    """User plus system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def durable_step(tmp: Path, tag: str, turns: int, path: str | None = None) -> tuple[float, float]:
    """Marginal seconds per durable step, wall and CPU; ``path=":memory:"`` takes the sync out."""
    def once(n: int, name: str) -> tuple[float, float]:
        store = SqliteCheckpointer(path or str(tmp / f"{tag}-{name}.db"))
        try:
            cpu = cpu_seconds()
            wall = asyncio.run(run_agent(store, n, name))
            return wall, cpu_seconds() - cpu
        finally:
            store.close()
    (wall_n, cpu_n), (wall_1, cpu_1) = once(turns, "n"), once(1, "one")
    return (wall_n - wall_1) / (2 * turns - 2), (cpu_n - cpu_1) / (2 * turns - 2)


def floor_cpu(path: str, commits: int) -> float:
    """CPU seconds per raw commit (the floor's own work around its syncs)."""
    cpu = cpu_seconds()
    floor(path, commits, b"y" * (len(PAYLOAD) + 60))
    return (cpu_seconds() - cpu) / commits


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--turns", type=int, default=500)
    ap.add_argument("--work", type=int, default=3000, help="loop iterations of the fixed CPU work")
    args = ap.parse_args()
    parts: dict[str, list[float]] = {k: [] for k in ("floor", "sql", "sql + essential", "loop cpu", "cpu alone",
                                                     "cpu between commits", "sqlite", "sqlite cpu",
                                                     "floor cpu")}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as d:
        tmp = Path(d)
        commits, checkpoint = captured_commits(tmp, args.turns)
        n = len(commits)
        for rep in range(args.repeats):
            parts["floor"].append(floor(str(tmp / f"floor-{rep}.db"), n, b"y" * (len(PAYLOAD) + 60)) / n)
            parts["sql"].append(replay_commits(str(tmp / f"sql-{rep}.db"), commits, checkpoint))
            parts["sql + essential"].append(replay_commits(str(tmp / f"ess-{rep}.db"), commits, checkpoint,
                                                     essential=True))
            parts["loop cpu"].append(durable_step(tmp, f"mem-{rep}", args.turns, ":memory:")[0])
            parts["cpu alone"].append(cpu_alone(args.work, n))
            work_floor = floor(str(tmp / f"work-{rep}.db"), n, b"y" * (len(PAYLOAD) + 60),
                               between=lambda: busy(args.work)) / n
            parts["cpu between commits"].append(work_floor - parts["floor"][-1])
            wall, cpu = durable_step(tmp, f"disk-{rep}", args.turns)
            parts["sqlite"].append(wall)
            parts["sqlite cpu"].append(cpu)
            parts["floor cpu"].append(floor_cpu(str(tmp / f"floor-cpu-{rep}.db"), n))
    med = {k: statistics.median(v) * 1e3 for k, v in parts.items()}

    def ratio(top: str, bottom: str) -> float:  # within each repeat, then the median
        return statistics.median(a / b for a, b in zip(parts[top], parts[bottom], strict=True))

    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, {args.repeats} repeats, "
          f"{n} commits each, medians in ms per commit")
    for k, v in med.items():
        print(f"{k:>24} {v:8.3f}")
    inflation = ratio("cpu between commits", "cpu alone")
    print(f"{'sql / floor':>24} {ratio('sql', 'floor'):8.2f}")
    print(f"{'sql + essential / floor':>24} {ratio('sql + essential', 'floor'):8.2f}  (the least a Python step "
          "can cost in this format)")
    print(f"{'sqlite / floor':>24} {ratio('sqlite', 'floor'):8.2f}")
    print(f"{'work inflation':>24} {inflation:8.2f}  (cpu between commits / cpu alone)")
    loop_inflation = statistics.median((a - f) / b for a, f, b in zip(parts["sqlite cpu"], parts["floor cpu"],
                                                                     parts["loop cpu"], strict=True))
    print(f"{'loop cpu inflation':>24} {loop_inflation:8.2f}  ((sqlite cpu - floor cpu) / loop cpu: the loop's "
          "own CPU next to a sync, against the same loop with none)")
    print(f"{'sqlite - sql':>24} {med['sqlite'] - med['sql']:8.3f}  (what the loop adds on the I/O path; "
          f"its CPU alone is loop cpu)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
