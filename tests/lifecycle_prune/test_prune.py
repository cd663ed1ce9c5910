"""Retention (issue 35, part 1): ``prune`` removes closed runs past the bound, whole, in batches, on
both backends; never an open, held or uncompensated run; the rollback anchor keeps working."""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
from prune_journals import (
    DAY,
    age,
    cancelled_with_cleanup,
    closed_run,
    counts,
    half_runs,
    needs_human,
    open_run,
)

from cuaderno import faults, open_journal, operations
from cuaderno.errors import JournalRolledBack, RunNotFound, UsageError
from cuaderno.journal import MemoryCheckpointer
from cuaderno.journal.retention import parse_duration
from cuaderno.journal.sqlite import SqliteCheckpointer


def _world(url: str) -> list[str]:
    """Eight old closed runs of every closed status, and old runs that must stay."""
    store = open_journal(url)
    try:
        closed = [closed_run(store, f"done-{i}", status) for i, status in
                  enumerate(["completed", "failed", "cancelled"] * 2 + ["completed", "completed"])]
        open_run(store, "running-1")
        needs_human(store, "human-1")
        cancelled_with_cleanup(store, "cleanup-1")
        closed_run(store, "young-1")
        closed_run(store, "newest")  # young; holds the journal's last row (the anchor's, on SQLite)
    finally:
        store.close()
    age(url, 3 * DAY, [*closed, "running-1", "human-1", "cleanup-1"])
    return closed


def test_prune_removes_old_closed_runs_whole_and_nothing_else(journal_url: str) -> None:
    closed = _world(journal_url)
    before, _ = counts(journal_url)
    store = open_journal(journal_url)
    try:
        report = operations.prune(store, "2d", batch=3)
        assert sorted(report.runs) == sorted(closed)
        assert report.events == sum(before[r] for r in closed)
        assert report.batches == 3  # 8 runs, 3 per transaction
        assert "cleanup-1" in report.kept and "compensation" in report.kept["cleanup-1"]
        for run_id in closed:
            assert store.checkpoint(run_id) is None
            with pytest.raises(RunNotFound):
                store.load(run_id)
        left = {cp.run_id for cp in store.list_runs(limit=100)}
        assert left == {"running-1", "human-1", "cleanup-1", "young-1", "newest"}
        for run_id in left:
            store.load(run_id)  # every chain still checks
    finally:
        store.close()
    assert half_runs(journal_url) == []
    again = open_journal(journal_url)  # the next open does not take the prune for a rollback
    try:
        assert again.load("newest")
    finally:
        again.close()


def test_dry_run_writes_nothing(journal_url: str, tmp_path: Path) -> None:
    closed = _world(journal_url)
    before = counts(journal_url)
    store = open_journal(journal_url)
    try:
        report = operations.prune(store, "2d", dry_run=True)
    finally:
        store.close()
    assert sorted(report.runs) == sorted(closed) and report.events == 0
    assert counts(journal_url) == before


def test_a_held_run_is_kept_and_a_run_taken_before_the_batch_is_kept(journal_url: str) -> None:
    closed = _world(journal_url)
    store, other = open_journal(journal_url), open_journal(journal_url)
    try:
        other.acquire(closed[0], "someone")  # a live holder of a closed run (its loop still releasing)
        # Taken between the prune's start and its batch's transaction: the check is in the transaction.
        faults.on("prune.P0", lambda: other.acquire(closed[1], "late taker"))
        try:
            report = operations.prune(store, "2d")
        finally:
            faults.on("prune.P0", None)
        assert closed[0] in report.kept and "held by" in report.kept[closed[0]]
        assert closed[1] in report.kept and "held by" in report.kept[closed[1]]
        assert sorted(report.runs) == sorted(closed[2:])
        assert store.checkpoint(closed[0]) is not None and store.checkpoint(closed[1]) is not None
    finally:
        other.close()
        store.close()


def test_the_bound_is_respected_and_a_run_updated_since_the_listing_is_kept(journal_url: str) -> None:
    _world(journal_url)
    store = open_journal(journal_url)
    try:
        assert operations.prune(store, "4d").runs == []
        assert "young-1" not in operations.prune(store, "1h", dry_run=True).runs  # closed just now
    finally:
        store.close()


def test_two_pruners_at_once_do_not_conflict(journal_url: str) -> None:
    store = open_journal(journal_url)
    try:
        for i in range(60):
            closed_run(store, f"r{i:03d}", turns=1)
        closed_run(store, "newest")
    finally:
        store.close()
    age(journal_url, 3 * DAY, [f"r{i:03d}" for i in range(60)])
    reports: list[operations.PruneReport] = []
    errors: list[BaseException] = []

    def one() -> None:
        s = open_journal(journal_url)
        try:
            reports.append(operations.prune(s, "1d", batch=7))
        except BaseException as exc:
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    removed = [r for rep in reports for r in rep.runs]
    assert sorted(removed) == [f"r{i:03d}" for i in range(60)]  # each run removed once, by one of them
    assert half_runs(journal_url) == []


def test_a_fork_whose_origin_was_pruned_still_shows(journal_url: str) -> None:
    store = open_journal(journal_url)
    try:
        closed_run(store, "origin", turns=3)
        operations.fork(store, "origin", at="t0001.model", new_run_id="copy")
        closed_run(store, "newest")
        age(journal_url, 3 * DAY, ["origin"])
        assert operations.prune(store, "1d").runs == ["origin"]
        events = store.load("copy")  # the fork holds its own rows
        assert events[0].payload["forked_from"]["run_id"] == "origin"
        assert operations.run_state(store, store.checkpoint("copy"))  # type: ignore[arg-type]
    finally:
        store.close()


@pytest.mark.parametrize(("text", "seconds"), [("45s", 45), ("90m", 5400), ("12h", 43200), ("7d", 604800),
                                               ("2w", 1209600), ("30", 30), ("1.5h", 5400)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "7x", "-1d", "d", "inf", "nan", "1e999"])
def test_bad_durations_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError, match="duration"):
        parse_duration(bad)


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        closed_run(store, "a")
        for bad in ({"older_than": -1}, {"older_than": float("nan")}, {"older_than": True},
                    {"older_than": 1, "batch": 0}, {"older_than": 1, "batch": 2.5}):
            with pytest.raises(UsageError):
                operations.prune(store, **bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="SQLite or PostgreSQL"):
        operations.prune(MemoryCheckpointer(), 1)


# -- SQLite: the anchor, and space ----------------------------------------------------------------------


def test_prune_keeps_the_anchors_run_and_a_real_rollback_is_still_detected(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.db")
    with SqliteCheckpointer(db) as store:
        for i in range(5):
            closed_run(store, f"r{i}")
    age(db, 3 * DAY)
    with SqliteCheckpointer(db) as store:
        report = operations.prune(store, "1d")
        assert sorted(report.runs) == ["r0", "r1", "r2", "r3"]
        assert "r4" in report.kept and "anchor" in report.kept["r4"]  # its row is the last and the anchored one
    with SqliteCheckpointer(db) as store:  # no JournalRolledBack
        closed_run(store, "r5")
        assert store.load("r4")
    # r4 is no longer the last: the next prune takes it.
    age(db, 3 * DAY, ["r4"])
    with SqliteCheckpointer(db) as store:
        assert operations.prune(store, "1d").runs == ["r4"]
    # An older copy of the journal, restored over it after more commits: still refused.
    with SqliteCheckpointer(db) as store:
        store.close()
    shutil.copy(db, tmp_path / "old.db")
    with SqliteCheckpointer(db) as store:
        closed_run(store, "r6")
    for suffix in ("-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.unlink(db + suffix)
    shutil.copy(tmp_path / "old.db", db)
    with pytest.raises(JournalRolledBack):
        SqliteCheckpointer(db)


def test_the_anchor_named_row_is_kept_even_when_it_is_not_the_last(tmp_path: Path) -> None:
    """Another process's anchor may name an earlier row than the last (it wrote it last): that row's
    run is kept too."""
    db = str(tmp_path / "runs.db")
    with SqliteCheckpointer(db) as store:
        closed_run(store, "a")
        closed_run(store, "b")
    with sqlite3.connect(db) as conn:
        rowid, row_hash = conn.execute("SELECT rowid, row_hash FROM cuaderno_events WHERE run_id='a' "
                                       "ORDER BY rowid DESC LIMIT 1").fetchone()
    conn.close()
    from cuaderno.journal._anchor import Anchor

    anchor = Anchor(db)
    anchor.write(rowid, row_hash)  # as a slower process, committing a's end before b's rows, would
    anchor.close()
    age(db, 3 * DAY)
    with SqliteCheckpointer(db) as store:
        report = operations.prune(store, "1d")
        assert report.runs == [] and set(report.kept) == {"a", "b"}
    with SqliteCheckpointer(db) as store:
        assert store.load("a")


def _sizes(db: str) -> int:
    return sum(os.path.getsize(db + s) for s in ("", "-wal") if os.path.exists(db + s))


def test_vacuum_gives_space_back_and_switches_to_incremental(tmp_path: Path) -> None:
    # What a journal of the two kept runs takes anyway (its tables' and indexes' own pages, which
    # grow with the schema): space given back is measured above it.
    floor_db = str(tmp_path / "floor.db")
    with SqliteCheckpointer(floor_db) as store:
        closed_run(store, "newest")
        closed_run(store, "newest2")
    with SqliteCheckpointer(floor_db) as store:
        store.close()
    floor = _sizes(floor_db)
    db = str(tmp_path / "runs.db")
    with SqliteCheckpointer(db) as store:
        for i in range(200):
            closed_run(store, f"r{i:03d}", turns=3, text="x" * 2000 + str(i))
        closed_run(store, "newest")
    age(db, 3 * DAY)
    with SqliteCheckpointer(db) as store:
        report = operations.prune(store, "1d", batch=50)  # no vacuum asked: pages are freed, not returned
        assert len(report.runs) == 200 and report.vacuum is None
        full = _sizes(db)
        report = operations.prune(store, "1d", vacuum=True)
        assert report.vacuum is not None and report.vacuum["auto_vacuum"] == "incremental"
        assert report.vacuum["bytes_after"] - floor < (full - floor) / 4
    # Now incremental: the next prune gives its pages back by itself.
    with SqliteCheckpointer(db) as store:
        for i in range(100):
            closed_run(store, f"s{i:03d}", turns=3, text="y" * 2000 + str(i))
        closed_run(store, "newest2")
    age(db, 3 * DAY)
    with SqliteCheckpointer(db) as store:
        store.close()
    grown = _sizes(db)
    with SqliteCheckpointer(db) as store:
        report = operations.prune(store, "1d")
        assert len(report.runs) == 101 and report.vacuum is not None
        assert report.vacuum["how"] == "incremental_vacuum"
        assert report.vacuum["bytes_after"] - floor < (grown - floor) / 4
        assert store.load("newest2")
    with SqliteCheckpointer(db) as store:  # the anchor survived the rewrite
        assert store.load("newest2")


def test_a_worker_refuses_a_bad_prune_schedule(tmp_path: Path) -> None:
    from cuaderno import Agent, ScriptedGateway, Worker

    agent = Agent(instructions="x", tools=[], name="a")
    for bad in ({"prune_older_than": "soon"}, {"prune_older_than": -5}, {"prune_older_than": "1d", "prune_every": 0},
                {"prune_older_than": "1d", "prune_every": True}):
        with pytest.raises(UsageError):
            Worker(str(tmp_path / "runs.db"), agent, lambda: ScriptedGateway([]), **bad)  # type: ignore[arg-type]
    assert not (tmp_path / "runs.db").exists()  # nothing was created


def test_cli_dry_run_reads_only(tmp_path: Path) -> None:
    import hashlib
    import subprocess
    import sys

    db = str(tmp_path / "runs.db")
    with SqliteCheckpointer(db) as store:
        for i in range(3):
            closed_run(store, f"r{i}")
        closed_run(store, "newest")
    age(db, 3 * DAY, ["r0", "r1", "r2"])
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run([sys.executable, "-m", "cuaderno", "--db", db, "prune", "--older-than", "2d", "--dry-run"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "would remove 3 closed runs" in out.stdout, out.stderr
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir()}
    assert after["runs.db"] == before["runs.db"]  # the journal byte-identical (a read-only open, as `list`,
    assert os.path.getsize(db + "-wal") == 0  # may leave SQLite's empty -wal and its -shm index)
    out = subprocess.run([sys.executable, "-m", "cuaderno", "--db", db, "prune", "--older-than", "2d", "--batch", "2"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "removed 3 closed runs (12 events, 2 batches)" in out.stdout, out.stdout
