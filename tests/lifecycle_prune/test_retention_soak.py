"""Retention soak (issue 35): runs created and closed under a simulated clock with a 1-hour retention,
a prune every 10 simulated minutes; the journal's size must stop growing once the retention window is
full. The default run is small (1,000 runs); ``CUADERNO_SOAK=1`` runs the issue's 10,000 and prints
the size curve (SQLite: file bytes, db and -wal; PostgreSQL: ``pg_total_relation_size`` of the two
tables). Nothing sleeps: the journal's clock (the ``created_at`` an append stamps, which becomes a
run's ``updated_at``) and prune's ``now`` are the simulated time."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from prune_journals import end, model, start

from cuaderno import open_journal, operations
from cuaderno.journal import _append
from cuaderno.journal.base import Checkpointer

SOAK = os.environ.get("CUADERNO_SOAK") == "1"
RUNS = 10_000 if SOAK else 1_000
PER_HOUR = 1_000 if SOAK else 250  # runs started (and closed) per simulated hour
WAVE_S = 300.0  # runs are made in waves of 5 simulated minutes
PRUNE_EVERY_S = 600.0
RETENTION_S = 3600.0


class _Clock:
    """The simulated wall clock an append stamps rows with."""

    def __init__(self, t: float) -> None:
        self.t = t

    def time(self) -> float:
        return self.t


def _size(store: Checkpointer, url: str) -> int:
    if url.startswith("postgresql"):
        with store._conn() as conn:  # type: ignore[attr-defined]
            row = conn.execute("SELECT pg_total_relation_size('cuaderno_events') + "
                               "pg_total_relation_size('cuaderno_runs')").fetchone()
        return int(row[0])
    return sum(os.path.getsize(url + s) for s in ("", "-wal") if os.path.exists(url + s))


def _soak(url: str, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    import time as real_time

    clock = _Clock(real_time.time() - 30 * 86400)  # in the past: prune's settle guard is the real clock
    monkeypatch.setattr(_append, "time", clock)
    store = open_journal(url)
    curve: list[dict[str, Any]] = []
    made = 0
    since_prune = 0.0
    t0 = clock.t
    per_wave = int(PER_HOUR * WAVE_S / 3600)
    text = os.urandom(600).hex()  # 1.2 KB of model text per turn, not compressible
    try:
        while made < RUNS:
            for _ in range(min(per_wave, RUNS - made)):
                run_id = f"r{made:06d}"
                store.append([start(run_id), model(run_id, 0, text), model(run_id, 1, text), end(run_id)])
                made += 1
            clock.t += WAVE_S
            since_prune += WAVE_S
            if since_prune >= PRUNE_EVERY_S:
                since_prune = 0.0
                # vacuum=False: the cheap one (PostgreSQL: a plain VACUUM, which makes the dead rows'
                # space reusable without locking writers out; SQLite: nothing, its freed pages are
                # reused as they are). Without it PostgreSQL grew linearly here until autovacuum came.
                report = operations.prune(store, RETENTION_S, now=clock.t, batch=500, vacuum=False)
                curve.append({"sim_hours": round((clock.t - t0) / 3600, 2), "made": made,
                              "kept": len(store.list_runs(limit=100_000)), "pruned": len(report.runs),
                              "bytes": _size(store, url)})
    finally:
        store.close()
    return curve


def test_the_journal_stays_bounded_under_retention(journal_url: str, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    curve = _soak(journal_url, monkeypatch)
    backend = "postgres" if journal_url.startswith("postgresql") else "sqlite"
    print(f"\nretention soak ({backend}, {RUNS} runs, {PER_HOUR}/simulated hour, 1 h retention, prune every "
          "10 min):")
    for point in curve:
        print("  " + json.dumps(point))
    # The retention window holds about 1 h of runs (plus up to one prune interval, and a wave).
    window = PER_HOUR * (RETENTION_S + PRUNE_EVERY_S + WAVE_S) / 3600
    assert max(p["kept"] for p in curve) <= window + 1
    full = [p for p in curve if p["sim_hours"] >= 2.0]  # the window filled once, and pruned since
    assert full, curve
    plateau = full[0]["bytes"]
    # Bounded: after the window filled, the size never grows past 1.5x what it was then.
    assert max(p["bytes"] for p in full) <= 1.5 * plateau, curve
