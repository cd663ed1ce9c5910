"""Retention: remove closed runs older than a bound, whole, in bounded batches.

What is removed: a run whose status is ``completed``, ``failed`` or ``cancelled`` and whose summary
was last updated before the cutoff: its events and its summary row, in one transaction, so a kill
at any point leaves either the whole run or none of it (never a summary without its rows, which a
load would refuse as a tampered journal, nor rows without their summary).

What is never removed, checked *inside* the deleting transaction (a run can be resumed, forked,
taken or settled between a listing and the delete):

- a run that is not closed: ``running``, ``suspended``, ``needs_human``;
- a run a live process holds (SQLite: the run's lock byte in ``<journal>-holds``, probed while the
  prune holds the journal's write lock, under which every ``acquire`` takes it; PostgreSQL: the
  run's advisory lock, taken for the transaction with ``pg_try_advisory_xact_lock``, which fails
  while another session holds it and makes a concurrent ``acquire`` fail while the prune holds it);
- a cancelled run whose cancellation record scheduled compensations not all journaled yet
  (``cleanup_left`` over its journal, read in the transaction);
- a run updated since the listing (the cutoff is compared again in the ``WHERE`` of the
  transaction's own select, which also locks the rows on PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so
  a run an append is writing is skipped, never waited for);
- on SQLite, the run holding the journal's last event row and the run holding the row the anchor
  names (see :mod:`cuaderno.journal._anchor`): removing the last row would let SQLite give its
  rowid to the next insert, and the anchor would then name a row with another hash (a false
  :class:`~cuaderno.errors.JournalRolledBack`); removing the anchored row would make the next
  open find it missing (the same). Such a run is kept for a later prune, once newer rows exist.
  A real rollback (an older copy restored) is still detected: the anchor still names a row the
  journal this machine wrote holds.

The cutoff is also never later than :data:`SETTLE_S` seconds before the wall clock: a process
that committed a run's last row writes the anchor just after its commit, so a run closed a moment
ago may be named by an anchor write still to come.

Space: removed rows free pages inside the file (SQLite) or dead tuples (PostgreSQL), which later
appends reuse, so a journal pruned on a schedule stops growing at about its retention window's
size. Giving the space back to the file system is :func:`vacuum` (SQLite); PostgreSQL's
autovacuum makes dead tuples reusable, and only ``VACUUM FULL`` shrinks the table files.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Required, TypedDict

from cuaderno import faults
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import JournalCorrupt, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import _anchor, _claims
from cuaderno.journal._append import check_chain
from cuaderno.journal._claims import cleanup_scheduled
from cuaderno.journal._offload import release
from cuaderno.journal.base import CLOSED_STATUSES, Checkpointer

__all__ = ["DEFAULT_BATCH", "SETTLE_S", "PeriodicPrune", "PruneReport", "VacuumReport", "incremental", "parse_duration", "prune",
           "vacuum"]

DEFAULT_BATCH = 200
"""Runs removed per transaction: a batch's write lock (SQLite's, the whole journal's) lasts as long
as deleting this many runs' rows takes (measured with ``benchmarks/bench_prune.py``)."""

SETTLE_S = 10.0
"""A run updated less than this many seconds ago (wall clock) is never removed, whatever the bound:
see the module's note on the anchor."""

CleanupLeft = Callable[[Checkpoint, Sequence[StepEvent]], int]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or a plain number of seconds).

    Raises:
        UsageError: anything else.
    """
    if not isinstance(text, str):
        raise UsageError(f"a duration must be text like '7d', got {text!r:.40}")
    t = text.strip().lower()
    m = _DURATION.fullmatch(t)
    if m is not None:
        return float(m.group(1)) * _UNITS[m.group(2)]
    try:
        value = float(t)
    except ValueError:
        raise UsageError(f"{text!r:.40} is not a duration; write a number and a unit: 45s, 90m, 12h, 7d, 2w") \
            from None
    if not value >= 0 or value == float("inf"):
        raise UsageError(f"{text!r:.40} is not a duration; write a number and a unit: 45s, 90m, 12h, 7d, 2w")
    return value


@dataclass
class PruneReport:
    """What a prune removed (or, with ``dry_run``, would remove)."""

    cutoff: float
    """Runs last updated before this time (seconds since the epoch) were candidates."""
    dry_run: bool
    runs: list[str] = field(default_factory=list)
    """The runs removed, oldest first."""
    events: int = 0
    """Their event rows."""
    batches: int = 0
    """Transactions that removed at least one run."""
    kept: dict[str, str] = field(default_factory=dict)
    """Closed runs older than the cutoff that were kept, with why (held, compensations left, the
    anchor's, damaged)."""
    vacuum: VacuumReport | None = None
    """What :func:`vacuum` gave back, when asked."""

    def as_json(self) -> dict[str, object]:
        return {"cutoff": self.cutoff, "dry_run": self.dry_run, "pruned_runs": len(self.runs), "events": self.events,
                "batches": self.batches, "kept": dict(sorted(self.kept.items())), "vacuum": self.vacuum}


class VacuumReport(TypedDict, total=False):
    """What :func:`vacuum` did, as ``prune --json`` prints it. ``how``, ``bytes_before``,
    ``bytes_after`` and ``seconds`` always; SQLite adds ``free_pages_before`` and the file's
    ``auto_vacuum`` mode after it (``none``, ``full``, ``incremental``)."""

    how: Required[str]
    bytes_before: Required[int]
    bytes_after: Required[int]
    seconds: Required[float]
    free_pages_before: int
    auto_vacuum: str | None


def _backend(store: Checkpointer) -> Literal["sqlite", "postgres"]:
    from cuaderno.journal.sqlite import SqliteCheckpointer

    if isinstance(store, SqliteCheckpointer):
        return "sqlite"
    try:
        from cuaderno.journal.postgres import PostgresCheckpointer
    except ImportError:  # psycopg not installed: this store cannot be one
        PostgresCheckpointer = None  # type: ignore[assignment,misc]
    if PostgresCheckpointer is not None and isinstance(store, PostgresCheckpointer):
        return "postgres"
    raise UsageError(f"prune needs a SQLite or PostgreSQL journal, not a {type(store).__name__}")


def prune(store: Checkpointer, older_than: float, *, cleanup_left: CleanupLeft, batch: int = DEFAULT_BATCH,
          dry_run: bool = False, now: float | None = None, max_batches: int | None = None,
          on_batch: Callable[[list[str]], None] | None = None) -> PruneReport:
    """Remove the closed runs last updated more than ``older_than`` seconds before ``now``.

    Args:
        cleanup_left: counts a cancelled run's compensations not yet journaled
            (:func:`cuaderno.operations.cleanup_left`; passed in, the journal layer does not import
            the operations).
        batch: runs per transaction.
        dry_run: only list what would be removed (the journal is not written).
        now: the clock (seconds since the epoch; default the wall clock): a test's simulated time.
        max_batches: stop after this many transactions (a worker's slice of work).
        on_batch: called with each batch's run ids after its commit.

    Raises:
        UsageError: a bound or batch size that is not a number, or a store that cannot prune.
    """
    if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) or not 0 <= older_than < float("inf"):
        raise UsageError(f"older_than must be a number of seconds >= 0, got {older_than!r:.40}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UsageError(f"batch must be a positive integer, got {batch!r:.40}")
    kind = _backend(store)
    clock = time.time() if now is None else float(now)
    cutoff = min(clock - older_than, time.time() - SETTLE_S)
    report = PruneReport(cutoff=cutoff, dry_run=dry_run)
    after: tuple[float, str] = (float("-inf"), "")
    while max_batches is None or report.batches < max_batches:
        faults.point("prune.P0")  # between batches: nothing of the next one written
        if kind == "sqlite":
            took, last = _sqlite_batch(store, cutoff, after, batch, dry_run, cleanup_left, report)
        else:
            took, last = _pg_batch(store, cutoff, after, batch, dry_run, cleanup_left, report)
        if last is None:
            break
        after = last
        if took:
            report.batches += 1
            faults.point("prune.P2")  # a batch committed
            if on_batch is not None:
                on_batch(took)
    return report


def _why_kept(cp: Checkpoint, holder: dict[str, Any] | None, events: Callable[[], Sequence[StepEvent]],
              cleanup_left: CleanupLeft) -> str | None:
    if cp.status not in CLOSED_STATUSES:
        return f"its summary says {cp.status}"  # the status column and the summary disagree: leave it
    if holder is not None:
        return f"held by {_claims.describe_holder(holder)}"
    if cleanup_scheduled(cp):
        try:
            left = cleanup_left(cp, events())
        except JournalCorrupt as exc:
            return f"its journal does not verify ({str(exc)[:120]})"
        if left:
            return f"{left} compensation{'s' if left != 1 else ''} left to run"
    return None


def _sqlite_batch(store: Any, cutoff: float, after: tuple[float, str], batch: int, dry_run: bool,
                  cleanup_left: CleanupLeft, report: PruneReport) -> tuple[list[str], tuple[float, str] | None]:
    """One batch in one ``BEGIN IMMEDIATE`` transaction of the store's connection (the journal's
    write lock, so no ``acquire`` and no append lands between the checks and the delete)."""
    from contextlib import AbstractContextManager

    txn: AbstractContextManager[sqlite3.Connection] = store._reader("*") if dry_run else store._txn()
    took: list[str] = []
    with txn as db:
        store._schema_of(db)
        rows = db.execute(_SQLITE_CANDIDATES, (cutoff, after[0], after[0], after[1], batch)).fetchall()
        if not rows:
            return [], None
        keep = _sqlite_anchored(db, store)
        holders = {r[0]: _claims.live_holder(store.path, r[0], r[2]) for r in rows}
        for run_id, _updated, _owner, text in rows:
            why = "it holds the journal's last row, or the row its anchor names" if run_id in keep else None
            if why is None:
                cp = store._summary_of(db, run_id, text)
                why = _why_kept(cp, holders[run_id], partial(_events, db, store, run_id, cp), cleanup_left)
            if why is not None:
                report.kept[run_id] = why
                continue
            report.kept.pop(run_id, None)
            if not dry_run:
                n = db.execute("DELETE FROM cuaderno_events WHERE run_id=?", (run_id,)).rowcount
                db.execute("DELETE FROM cuaderno_runs WHERE run_id=?", (run_id,))
                db.execute("DELETE FROM cuaderno_keys WHERE run_id=?", (run_id,))  # its data key, if encrypted
                release(db, [run_id])  # its blobs no kept run uses
                report.events += n
            took.append(run_id)
        if took and not dry_run:
            faults.point("prune.P1")  # the batch's runs deleted, before COMMIT
    if not dry_run:
        store._drop_keys(took)
        for run_id in took:
            store._cache.pop(run_id, None)
    report.runs.extend(took)
    return took, (float(rows[-1][1]), str(rows[-1][0]))


_SQLITE_CANDIDATES = (
    "SELECT run_id, updated_at, owner, checkpoint FROM cuaderno_runs WHERE status IN ('completed', 'failed', "
    "'cancelled') AND updated_at < ? AND (updated_at > ? OR (updated_at = ? AND run_id > ?)) "
    "ORDER BY updated_at, run_id LIMIT ?")


def _sqlite_anchored(db: sqlite3.Connection, store: Any) -> set[str]:
    """The runs of the journal's last row and of the row the anchor names (read under the write
    lock: no commit lands meanwhile)."""
    runs = set()
    last = db.execute("SELECT run_id FROM cuaderno_events ORDER BY rowid DESC LIMIT 1").fetchone()
    if last is not None:
        runs.add(str(last[0]))
    anchor = store._anchor
    mark = anchor.read() if anchor is not None else None
    if mark is not None:
        row = db.execute("SELECT run_id FROM cuaderno_events WHERE rowid=?", (mark[0],)).fetchone()
        if row is not None:
            runs.add(str(row[0]))
    return runs


def _events(db: Any, store: Any, run_id: str, cp: Checkpoint) -> list[StepEvent]:
    """The run's events, read in the prune's transaction, chain checked (for its cleanup count)."""
    rows = db.execute(store._dialect.run_events, (run_id,)).fetchall()
    rows.sort(key=lambda r: r[3])
    return check_chain(run_id, rows, cp.last_hash, cp.last_seq, store._keys(db))


_PG_CANDIDATES = (
    "SELECT run_id, updated_at, owner, checkpoint FROM cuaderno_runs WHERE status IN ('completed', 'failed', "
    "'cancelled') AND updated_at < %s AND (updated_at > %s OR (updated_at = %s AND run_id > %s)) "
    "ORDER BY updated_at, run_id LIMIT %s FOR UPDATE SKIP LOCKED")


def _pg_batch(store: Any, cutoff: float, after: tuple[float, str], batch: int, dry_run: bool,
              cleanup_left: CleanupLeft, report: PruneReport) -> tuple[list[str], tuple[float, str] | None]:
    """One batch in one transaction: the candidates' rows locked (skipping those a writer has
    locked), each run's advisory lock tried for the transaction (a live holder keeps it)."""
    took: list[str] = []
    with (store._reader("*") if dry_run else store._txn()) as cur:
        store._schema_of(cur)
        # The listing moves on past skipped rows too (the keyset), so a batch of skipped runs never
        # stops a prune, and a run kept is met once per prune.
        rows = cur.execute(_PG_CANDIDATES.replace(" FOR UPDATE SKIP LOCKED", "") if dry_run else _PG_CANDIDATES,
                           (cutoff, after[0], after[0], after[1], batch)).fetchall()
        if not rows:
            return [], None
        # Every candidate's run lock tried in one statement (one round trip, not one per run).
        tried = cur.execute("SELECT pg_try_advisory_xact_lock(k) FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(k, i) "
                            "ORDER BY i", ([store._lock_key(r[0]) for r in rows],)).fetchall()
        for (run_id, _updated, owner, text), (free,) in zip(rows, tried, strict=True):
            holder = None if free else (_parse_owner(owner) or {"owner": None, "process": {}})
            cp = store._summary_of(cur, run_id, text)
            why = _why_kept(cp, holder, partial(_events, cur, store, run_id, cp), cleanup_left)
            if why is not None:
                report.kept[run_id] = why
                continue
            report.kept.pop(run_id, None)
            took.append(run_id)
        if took and not dry_run:
            report.events += cur.execute("DELETE FROM cuaderno_events WHERE run_id = ANY(%s)", (took,)).rowcount
            cur.execute("DELETE FROM cuaderno_runs WHERE run_id = ANY(%s)", (took,))
            cur.execute("DELETE FROM cuaderno_keys WHERE run_id = ANY(%s)", (took,))  # their data keys, if encrypted
            release(cur, took)  # their blobs no kept run uses
            faults.point("prune.P1")  # the batch's runs deleted, before COMMIT
    if not dry_run:
        store._drop_keys(took)
        with store._cache_lock:
            for run_id in took:
                store._cache.pop(run_id, None)
    report.runs.extend(took)
    return took, (float(rows[-1][1]), str(rows[-1][0]))


def _parse_owner(owner: str | None) -> dict[str, Any] | None:
    from cuaderno.journal import _lease

    return _lease.parse(owner)


def incremental(store: Checkpointer) -> bool:
    """Whether the store is a SQLite file in ``auto_vacuum=INCREMENTAL`` mode (a prune then gives
    its pages back at once, cheaply: see :func:`vacuum`)."""
    if _backend(store) != "sqlite":
        return False
    with store._reader("*") as db:  # type: ignore[attr-defined]
        return int(db.execute("PRAGMA auto_vacuum").fetchone()[0]) == 2


def vacuum(store: Checkpointer, *, full: bool) -> VacuumReport:
    """Give the space removed runs left back to the file system (SQLite), or say what PostgreSQL does.

    SQLite, ``full=False``: ``PRAGMA incremental_vacuum`` when the file is in
    ``auto_vacuum=INCREMENTAL`` mode (free pages moved to the end and cut off, in a short write
    transaction); otherwise nothing (the free pages are reused by later appends). ``full=True``:
    ``VACUUM`` (the whole file rewritten: it holds the journal's write lock for as long as that takes,
    about as long as copying the file, and needs as much free disk again), switching the file to
    ``auto_vacuum=INCREMENTAL`` on the way, so that every later prune gives its space back
    incrementally; then the ``-wal`` is truncated, and the anchor re-read (a rewrite keeps each row's
    rowid, but the anchor is moved to the journal's last row anyway, in the same hold of the lock).

    PostgreSQL: ``VACUUM`` of the two tables (dead tuples made reusable; the files shrink only when
    their last pages are empty). ``VACUUM FULL`` is not run: it locks the tables out of every worker.
    """
    if _backend(store) == "postgres":
        return _pg_vacuum(store)
    return _sqlite_vacuum(store, full)


def _sqlite_vacuum(store: Any, full: bool) -> VacuumReport:
    def size() -> int:
        return sum(os.stat(store.path + s).st_size for s in ("", "-wal") if os.path.exists(store.path + s))

    before = size()
    with store._lock:
        if store._writer is not None:
            store._start_writing()
        db = store._db
        mode = int(db.execute("PRAGMA auto_vacuum").fetchone()[0])
        freed = int(db.execute("PRAGMA freelist_count").fetchone()[0])
        started = time.perf_counter()
        if full:
            if mode != 2:
                db.execute("PRAGMA auto_vacuum=INCREMENTAL")  # takes effect with the VACUUM below
            db.execute("VACUUM")
            last = _anchor.last_row(db)
            if last is not None and store._anchor is not None:
                store._anchor.write(*last)
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            how = "VACUUM"
        elif mode == 2:
            # One page per step of the statement, and the driver's execute steps it once (it returns no
            # row): executescript steps it to its end (there is no open transaction to commit first).
            db.executescript("PRAGMA incremental_vacuum;")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            how = "incremental_vacuum"
        else:
            how = "none (auto_vacuum is not INCREMENTAL: run prune --vacuum once to switch the file; free " \
                  "pages are reused by later appends meanwhile)"
        elapsed = time.perf_counter() - started
        mode_after = int(db.execute("PRAGMA auto_vacuum").fetchone()[0])
    return {"how": how, "free_pages_before": freed, "bytes_before": before, "bytes_after": size(),
            "seconds": round(elapsed, 4), "auto_vacuum": {0: "none", 1: "full", 2: "incremental"}.get(mode_after)}


def _pg_vacuum(store: Any) -> VacuumReport:
    with store._conn() as conn:  # autocommit: VACUUM cannot run inside a transaction
        def size() -> int:
            return int(conn.execute("SELECT pg_total_relation_size('cuaderno_events') + "
                                    "pg_total_relation_size('cuaderno_runs') + "
                                    "pg_total_relation_size('cuaderno_blobs')").fetchone()[0])

        before = size()
        started = time.perf_counter()
        conn.execute("VACUUM cuaderno_events")
        conn.execute("VACUUM cuaderno_runs")
        conn.execute("VACUUM cuaderno_blobs")
        elapsed = time.perf_counter() - started
        return {"how": "VACUUM", "bytes_before": before, "bytes_after": size(), "seconds": round(elapsed, 4)}


class PeriodicPrune:
    """A worker's prune on a schedule (``Worker(prune_older_than=...)``, ``cuaderno worker
    --prune-older-than``): every ``every`` seconds, one :func:`prune` in a thread (the event loop
    keeps driving runs) on the worker's own store. Not on a second store of the same SQLite file:
    SQLite shares a file's ``-shm`` mapping among the connections of one process, and a worker's
    store opened on a ``-wal`` with commits reads through a read-only mapping until its first
    write, so a second store's writer in that process was refused ("attempt to write a readonly
    database") for as long as the worker had claimed nothing. A SQLite batch holds the store's lock
    while it runs (bounded by the batch size): the worker's commits wait for it, as they would for
    the journal's write lock. Several workers pruning one journal do not conflict: SQLite runs their
    batches one after the other (each under the write lock), PostgreSQL's skip the rows another has
    locked. A prune that fails is said and tried again at the next interval."""

    def __init__(self, older_than: float, every: float, cleanup_left: CleanupLeft, say: Callable[[str], None],
                 batch: int = DEFAULT_BATCH) -> None:
        self.older_than, self.every, self.batch = older_than, every, batch
        self._cleanup_left, self._say = cleanup_left, say
        self.pruned = 0
        """Runs this schedule removed."""
        self._wake: Any = None

    def _once(self, store: Checkpointer) -> PruneReport:
        report = prune(store, self.older_than, cleanup_left=self._cleanup_left, batch=self.batch)
        if report.runs and incremental(store):
            report.vacuum = vacuum(store, full=False)
        return report

    async def run(self, store: Checkpointer, stopping: Callable[[], bool]) -> None:
        """Prune, then sleep ``every`` seconds, until ``stopping()`` (woken by :meth:`stop`). A prune in
        flight is let finish (its batch commits or rolls back whole either way)."""
        import asyncio

        from cuaderno.errors import CuadernoError

        self._wake = asyncio.Event()
        while not stopping():
            try:
                report = await asyncio.to_thread(self._once, store)
            except CuadernoError as exc:
                self._say(f"prune failed: {str(exc)[:300]}; trying again in {self.every:g} s")
            else:
                self.pruned += len(report.runs)
                if report.runs:
                    self._say(f"pruned {len(report.runs)} closed run(s) older than {self.older_than:g} s "
                              f"({report.events} events)")
            try:
                await asyncio.wait_for(self._wake.wait(), self.every)
            except TimeoutError:
                pass

    def stop(self) -> None:
        """Wake the schedule's sleep (from the worker's event loop) so :meth:`run` returns."""
        if self._wake is not None:
            self._wake.set()
