"""CPU per journal row with encryption at rest on against off, 1 KB and 100 KB payloads: at
the codec, and per step through a real store (SQLite, PostgreSQL).

Usage: ``python benchmarks/bench_encryption.py [--rounds 15] [--rows 500] [--steps 40] [--pg URL]``

What is timed, per row, for each payload size, in one process and in interleaved rounds (so
that load coming and going on a shared machine falls on every variant alike), medians over the
rounds:

- ``floor``: what every row costs anyway: the payload encoded as the journal stores it and the
  row stamped (its keyed digest and hash-chain link);
- ``off``: the floor, then the row packed as a store packs it (Zstandard when it pays), and read
  back (unpacked);
- ``on``: ``off`` plus sealing with the run's data key (AES-256-GCM, the row's identity as
  associated data) and opening it again.

The second table is the same comparison through a store: CPU time of this process
(``time.process_time``: the SQLite library's work included, PostgreSQL's server not) per step, a
step being one tool step's two appends (its intent, small, and its result holding the payload) to
a run, each its own transaction, then per row of reading the run back (``load``: the chain
checked, every row opened). ``memory`` is the floor (the same appends with no storage at all);
``off`` and ``on`` are the same store opened without and with ``keys=``, in interleaved rounds, a
fresh run each round. The payloads are English-like text, as a tool result or a model answer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from cuaderno.events import StepEvent, encode_payload
from cuaderno.journal import MemoryCheckpointer, SqliteCheckpointer, _crypto
from cuaderno.journal._compress import pack, unpack
from cuaderno.journal.base import Checkpointer
from cuaderno.journal.keys import StaticKeys, master_key

_PROSE = ("The customer asked whether the invoice of last month was paid twice; the ledger shows one "
          "payment and one refund, both on the 14th. ")


def _payload(size: int) -> dict[str, str]:
    text = (_PROSE * (size // len(_PROSE) + 1))[:size]
    return {"result": text}


def _variants(size: int) -> dict[str, Callable[[], object]]:
    payload = _payload(size)
    ev = StepEvent(run_id="bench", step_id="t0001.tool00", phase="result", kind="tool", name="lookup",
                   fingerprint="f" * 64, payload=payload)
    dek = _crypto.new_data_key()

    def floor() -> bytes:
        data = encode_payload(payload)
        ev.stamped(seq=7, created_at=1.0, prev_hash="0" * 32, payload_bytes=data, salt=b"s" * 16)
        return data

    def off() -> object:
        codec, stored = pack(floor())
        return unpack(codec, stored, "bench")

    def on() -> object:
        codec, stored = pack(floor())
        codec, sealed = _crypto.seal_row(dek, "bench", "t0001.tool00", "result", codec, stored)
        codec, stored = _crypto.open_row(dek, "bench", "t0001.tool00", "result", codec, sealed)
        return unpack(codec, stored, "bench")

    return {"floor": floor, "off": off, "on": on}


def _time(fn: Callable[[], object], rows: int) -> float:
    start = time.perf_counter()
    for _ in range(rows):
        fn()
    return (time.perf_counter() - start) / rows * 1e6


def _steps(store: Checkpointer, payload: dict[str, str], steps: int) -> tuple[float, float]:
    """CPU microseconds per step appended (intent + result) to a new run, and per row loaded."""
    run_id = f"bench-{uuid.uuid4().hex}"
    store.append([StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", payload={"task": "bench"})])
    start = time.process_time()
    for i in range(steps):
        step = f"t{i:04d}.tool00"
        store.append([StepEvent(run_id=run_id, step_id=step, phase="intent", kind="tool", name="lookup",
                                fingerprint="f" * 64, payload={"arguments": {"customer": f"c{i}"}})])
        store.append([StepEvent(run_id=run_id, step_id=step, phase="result", kind="tool", name="lookup",
                                fingerprint="f" * 64, payload=payload)])
    written = (time.process_time() - start) / steps * 1e6
    start = time.process_time()
    events = store.load(run_id)
    for ev in events:
        ev.payload  # noqa: B018 - every row decoded, as a resume that replays them does
    return written, (time.process_time() - start) / len(events) * 1e6


def _stores(pg: str | None, folder: Path) -> dict[str, tuple[Checkpointer, Checkpointer]]:
    """Per backend, a store without and one with encryption (two journals, side by side)."""
    keys = StaticKeys(master_key(os.urandom(32)))
    out: dict[str, tuple[Checkpointer, Checkpointer]] = {
        "sqlite": (SqliteCheckpointer(folder / "off.db"), SqliteCheckpointer(folder / "on.db", keys=keys))}
    if pg:
        try:
            from cuaderno.journal.postgres import PostgresCheckpointer

            tag = uuid.uuid4().hex[:8]
            out["postgres"] = (PostgresCheckpointer(pg, schema=f"bench_off_{tag}"),
                               PostgresCheckpointer(pg, schema=f"bench_on_{tag}", keys=keys))
        except Exception as exc:  # no server here: the SQLite figures still stand
            print(f"(postgres skipped: {type(exc).__name__}: {exc})")
    return out


def _drop(store: Checkpointer) -> None:
    schema = getattr(store, "schema", None)
    if schema is None:
        return
    import psycopg
    from psycopg import sql

    with psycopg.connect(store._conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def through_stores(rounds: int, steps: int, pg: str | None) -> None:
    print(f"\nThrough a store: CPU microseconds of this process per step (intent + result appended) and per "
          f"row loaded, median of {rounds} interleaved rounds of {steps} steps")
    print(f"{'backend':>9} {'payload':>8}  {'floor':>8}  {'off':>8}  {'on':>8}  {'on/off':>7}  "
          f"{'load off':>9}  {'load on':>8}")
    with tempfile.TemporaryDirectory() as folder:
        stores = _stores(pg, Path(folder))
        try:
            for backend, (off, on) in stores.items():
                for size in (1_000, 100_000):
                    payload = _payload(size)
                    n = steps if size <= 10_000 else max(5, steps // 4)
                    times: dict[str, list[tuple[float, float]]] = {"floor": [], "off": [], "on": []}
                    for _ in range(rounds):
                        times["floor"].append(_steps(MemoryCheckpointer(), payload, n))
                        times["off"].append(_steps(off, payload, n))
                        times["on"].append(_steps(on, payload, n))
                    w = {k: statistics.median(t[0] for t in v) for k, v in times.items()}
                    r = {k: statistics.median(t[1] for t in v) for k, v in times.items()}
                    print(f"{backend:>9} {size // 1000:>6}KB  {w['floor']:8.1f}  {w['off']:8.1f}  {w['on']:8.1f}  "
                          f"{w['on'] / w['off']:7.2f}  {r['off']:9.1f}  {r['on']:8.1f}")
        finally:
            for off, on in stores.values():
                for store in (off, on):
                    _drop(store)
                    store.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--pg", default=os.environ.get("CUADERNO_TEST_PG", "postgresql://127.0.0.1:5432/test"),
                        help="a PostgreSQL server to measure on too ('' to skip)")
    args = parser.parse_args()
    print(f"CPU per row, microseconds, median of {args.rounds} interleaved rounds of {args.rows} rows")
    print(f"{'payload':>8}  {'floor':>8}  {'off':>8}  {'on':>8}  {'on/off':>7}  {'(on-off)/row':>12}")
    for size in (1_000, 100_000):
        variants = _variants(size)
        rows = max(20, args.rows if size <= 10_000 else args.rows // 20)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(_time(fn, rows))
        med = {name: statistics.median(values) for name, values in times.items()}
        print(f"{size // 1000:>6}KB  {med['floor']:8.1f}  {med['off']:8.1f}  {med['on']:8.1f}  "
              f"{med['on'] / med['off']:7.2f}  {med['on'] - med['off']:12.1f}")
    through_stores(args.rounds, args.steps, args.pg or None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
