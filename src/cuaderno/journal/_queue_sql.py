"""The queue's tables and statements, for both dialects (what :mod:`cuaderno.flow` stands on).

Three tables, next to the journal's own (created by one numbered migration of each backend):

- ``cuaderno_queue``: one row per submitted run, written before the run's first event and never
  changed after, except ``done`` (set once the run is seen closed, so claims stop reading it).
  It holds what a worker needs to pick the run (``priority``, ``start_at``, ``concurrency_key``,
  ``versions``) and what a submit needs to finish starting it if its submitter died between
  this row and the run's first event (``agent``, ``tenant``, ``task``).
- ``cuaderno_queue_keys``: an idempotency key and the last run submitted under it.
- ``cuaderno_queue_limits``: the most runs of a concurrency key in progress at once. In the
  journal, not on each worker: every worker then counts against the same K (two workers
  configured apart would each allow their own), and changing it needs no redeploy.
- ``cuaderno_schedules``: cron schedules (:mod:`cuaderno.flow.schedules`) and the last fire time
  each has started runs up to (``last_fire``, only ever moved forward).

*In progress* is never a counter: it is the set of the key's queued runs a live process holds
now (PostgreSQL's advisory locks, SQLite's hold file: the journal's own liveness). A worker
SIGKILLed with runs in hand frees their slots when the kernel (or the server) drops its locks;
nothing is left to decrement, so nothing can leak or be counted twice.

Claims do not race: a claim is made under one lock per journal (PostgreSQL:
a transaction-scoped advisory lock; SQLite: an exclusive ``flock`` on ``<journal>-queue``, one
host), which covers reading the candidates, the holds and the limits, and the takeover of the
runs picked (:mod:`._takeover`: all of them in one transaction, one synced commit per claim).
The next claimer starts after those takeovers hold their runs, so it never picks a run another
worker just picked: a claim is lost only to a process that takes a run outside the queue (an
application resuming it itself).

Crash points: ``queue.C0``, inside the takeovers' transaction (every run picked locked, rows
written, before COMMIT: a worker SIGKILLed there leaves them as they were before the claim);
``queue.C1``, a claim's runs taken over, its lock still held, none driven yet (a worker
SIGKILLed there leaves them to the next claim: its locks went with it).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

from cuaderno import faults
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import JournalError, SubmitConflict, UsageError, quoted
from cuaderno.journal._claims import held_by_lock
from cuaderno.journal._takeover import Takeovers, take_over
from cuaderno.journal.base import CLOSED_STATUSES, Checkpointer

if TYPE_CHECKING:
    from cuaderno.journal.postgres import PostgresCheckpointer
    from cuaderno.journal.sqlite import SqliteCheckpointer

__all__ = ["PG_TABLES", "SQLITE_TABLES", "Claim", "JournalQueue", "JournalSchedules", "QueueEntry", "canonical_versions",
           "queue_of", "schedules_of"]

SQLITE_TABLES: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS cuaderno_queue (
        run_id TEXT PRIMARY KEY, agent TEXT NOT NULL, versions TEXT NOT NULL, tenant TEXT NOT NULL,
        task TEXT NOT NULL, priority INTEGER NOT NULL, start_at REAL NOT NULL, submitted_at REAL NOT NULL,
        concurrency_key TEXT, idempotency_key TEXT, lock_key INTEGER NOT NULL DEFAULT 0,
        done INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS cuaderno_queue_next ON cuaderno_queue (done, priority DESC, submitted_at, run_id)",
    "CREATE INDEX IF NOT EXISTS cuaderno_queue_keyed ON cuaderno_queue (done, concurrency_key)",
    """CREATE TABLE IF NOT EXISTS cuaderno_queue_keys (
        idempotency_key TEXT PRIMARY KEY, run_id TEXT NOT NULL, submitted_at REAL NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS cuaderno_queue_limits (
        concurrency_key TEXT PRIMARY KEY, max_running INTEGER NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS cuaderno_schedules (
        name TEXT PRIMARY KEY, cron TEXT NOT NULL, agent TEXT NOT NULL, task TEXT NOT NULL, tenant TEXT NOT NULL,
        priority INTEGER NOT NULL, concurrency_key TEXT, catch_up INTEGER NOT NULL, created_at REAL NOT NULL,
        last_fire REAL NOT NULL
    ) WITHOUT ROWID""",
)

PG_TABLES: Final[tuple[str, ...]] = (
    """CREATE TABLE cuaderno_queue (
        run_id TEXT PRIMARY KEY, agent TEXT NOT NULL, versions TEXT NOT NULL, tenant TEXT NOT NULL,
        task TEXT NOT NULL, priority INTEGER NOT NULL, start_at DOUBLE PRECISION NOT NULL,
        submitted_at DOUBLE PRECISION NOT NULL, concurrency_key TEXT, idempotency_key TEXT,
        lock_key BIGINT NOT NULL DEFAULT 0, done BOOLEAN NOT NULL DEFAULT false
    )""",
    "CREATE INDEX cuaderno_queue_next ON cuaderno_queue (priority DESC, submitted_at, run_id) WHERE NOT done",
    "CREATE INDEX cuaderno_queue_keyed ON cuaderno_queue (concurrency_key) WHERE NOT done",
    """CREATE TABLE cuaderno_queue_keys (
        idempotency_key TEXT PRIMARY KEY, run_id TEXT NOT NULL, submitted_at DOUBLE PRECISION NOT NULL
    )""",
    "CREATE TABLE cuaderno_queue_limits (concurrency_key TEXT PRIMARY KEY, max_running INTEGER NOT NULL)",
    """CREATE TABLE cuaderno_schedules (
        name TEXT PRIMARY KEY, cron TEXT NOT NULL, agent TEXT NOT NULL, task TEXT NOT NULL, tenant TEXT NOT NULL,
        priority INTEGER NOT NULL, concurrency_key TEXT, catch_up INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, last_fire DOUBLE PRECISION NOT NULL
    )""",
)

_CANDIDATES: Final = 512
"""How many queued runs a claim reads, best first (held ones included: they are skipped)."""

_PICK = {False: "SELECT q.run_id, q.concurrency_key, q.lock_key, r.status, r.epoch, q.task FROM cuaderno_queue q "
                "LEFT JOIN cuaderno_runs r ON r.run_id = q.run_id WHERE q.done = 0 AND q.versions = ? "
                "AND q.start_at <= ? ORDER BY q.priority DESC, q.submitted_at, q.run_id LIMIT ?",
         True: "SELECT q.run_id, q.concurrency_key, q.lock_key, r.status, r.epoch, q.task FROM cuaderno_queue q "
               "LEFT JOIN cuaderno_runs r ON r.run_id = q.run_id WHERE NOT q.done AND q.versions = %s "
               "AND q.start_at <= %s ORDER BY q.priority DESC, q.submitted_at, q.run_id LIMIT %s"}
"""The best candidates first (by dialect: ``True`` for PostgreSQL)."""
# Only a run taken over at least once (epoch > 0) can be held: every hold starts with a takeover,
# which bumps the epoch. So the holds are probed for those only (on SQLite a probe per run).
_IN_PROGRESS = {False: "SELECT q.run_id, q.concurrency_key, q.lock_key FROM cuaderno_queue q "
                       "JOIN cuaderno_runs r ON r.run_id = q.run_id "
                       "WHERE q.done = 0 AND q.concurrency_key IS NOT NULL AND r.epoch > 0",
                True: "SELECT q.run_id, q.concurrency_key, q.lock_key FROM cuaderno_queue q "
                      "JOIN cuaderno_runs r ON r.run_id = q.run_id "
                      "WHERE NOT q.done AND q.concurrency_key IS NOT NULL AND r.epoch > 0"}
_KEY_IN_PROGRESS = {False: "SELECT q.run_id, q.concurrency_key, q.lock_key FROM cuaderno_queue q "
                           "JOIN cuaderno_runs r ON r.run_id = q.run_id "
                           "WHERE q.done = 0 AND q.concurrency_key = ? AND r.epoch > 0",
                    True: "SELECT q.run_id, q.concurrency_key, q.lock_key FROM cuaderno_queue q "
                          "JOIN cuaderno_runs r ON r.run_id = q.run_id "
                          "WHERE NOT q.done AND q.concurrency_key = %s AND r.epoch > 0"}
_HAS_WAITING = {False: "SELECT 1 FROM cuaderno_queue WHERE done = 0 AND versions = ? LIMIT 1",
                True: "SELECT 1 FROM cuaderno_queue WHERE NOT done AND versions = %s LIMIT 1"}
# What open_runs selects (journal._sql), less the running runs that have a queue row: those a
# worker claims through the queue only.
_OUTSIDE = {False: "SELECT 1 FROM cuaderno_runs r WHERE (r.status = 'running' AND NOT EXISTS "
                   "(SELECT 1 FROM cuaderno_queue q WHERE q.run_id = r.run_id)) "
                   "OR (r.status IN ('suspended', 'needs_human') AND r.checkpoint LIKE '%\"cancel_requested\":{%') "
                   "OR (r.status = 'cancelled' AND r.checkpoint LIKE '%\"cleanup\":[{%') LIMIT 1",
            True: "SELECT 1 FROM cuaderno_runs r WHERE (r.status = 'running' AND NOT EXISTS "
                  "(SELECT 1 FROM cuaderno_queue q WHERE q.run_id = r.run_id)) "
                  "OR (r.status IN ('suspended', 'needs_human') AND strpos(r.checkpoint, '\"cancel_requested\":{') > 0) "
                  "OR (r.status = 'cancelled' AND strpos(r.checkpoint, '\"cleanup\":[{') > 0) LIMIT 1"}
_PG_LOCKED: Final = ("SELECT classid::bigint, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
                     "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
# The same keys as one signed bigint each (classid the high half: the shift wraps as the bytes do),
# with the server's clock: a claim's first statement.
_PG_NOW_LOCKED: Final = ("SELECT extract(epoch FROM clock_timestamp())::float8, "
                         "ARRAY(SELECT (classid::bigint << 32) | objid::bigint FROM pg_locks WHERE locktype = 'advisory' "
                         "AND objsubid = 1 AND granted "
                         "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))")
_ENTRY = ("SELECT run_id, agent, versions, tenant, task, priority, start_at, submitted_at, concurrency_key, "
          "idempotency_key FROM cuaderno_queue WHERE run_id = ?")
_INSERT = ("INSERT INTO cuaderno_queue (run_id, agent, versions, tenant, task, priority, start_at, submitted_at, "
           "concurrency_key, idempotency_key, lock_key) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
           "ON CONFLICT (run_id) DO NOTHING")
_KEY_LAST = {False: "SELECT run_id, submitted_at FROM cuaderno_queue_keys WHERE idempotency_key = ?",
             # FOR UPDATE: submits of one key take turns (SQLite's BEGIN IMMEDIATE already does).
             True: "SELECT run_id, submitted_at FROM cuaderno_queue_keys WHERE idempotency_key = %s FOR UPDATE"}


def canonical_versions(versions: Mapping[str, object]) -> str:
    """The text a queued run's versions are stored and compared as (a worker claims only runs
    of its own versions, as :class:`~cuaderno.worker.Worker` resumes only those)."""
    return json.dumps(versions, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueEntry:
    """A submitted run as its queue row records it. Replay reads none of it: the run's journal
    starts with its own ``run.start`` event, written from ``agent``, ``versions``, ``tenant`` and
    ``task`` here, so a submit that finds the row without that event writes the same one."""

    run_id: str
    agent: str
    versions: str
    """:func:`canonical_versions` of the agent that submitted it."""
    tenant: str
    task: str
    priority: int = 0
    start_at: float = 0.0
    """Not claimed before (seconds since the epoch, on the journal's clock: the PostgreSQL
    server's ``clock_timestamp()``, this host's ``time.time()`` for SQLite)."""
    submitted_at: float = 0.0
    concurrency_key: str | None = None
    idempotency_key: str | None = None


@dataclass(kw_only=True, slots=True)
class Claim:
    """What one claim did: the runs it took over (with their epochs) and why others wait."""

    taken: list[tuple[str, int]] = field(default_factory=list[tuple[str, int]])
    keyed: set[str] = field(default_factory=set[str])
    """The runs taken that count against a concurrency key."""
    summaries: dict[str, Checkpoint] = field(default_factory=dict[str, Checkpoint])
    """PostgreSQL: the summary of each run taken, at the epoch it was taken at (read by the
    takeover with the run's row locked): the worker need not read it again. A run missing here
    (SQLite, or a summary that does not decode) is read by the worker as before."""
    tasks: dict[str, str] = field(default_factory=dict[str, str])
    """The task of each run taken, from its queue row (the one its ``run.start`` event records:
    submit writes both from one entry), so the worker need not read the run's events for it."""
    lost: int = 0
    """Runs picked that another process held at the takeover (one that took it outside the queue)."""
    stale: int = 0
    """Runs picked that ended between the claim's read and its takeover (their holder finished
    them meanwhile): refused by the takeover's own check, nothing written."""
    at_limit: dict[str, int] = field(default_factory=dict[str, int])
    """Concurrency keys with runs waiting because K of them are in progress: key -> waiting (among
    the candidates the claim read)."""


class _Exec(Protocol):
    def execute(self, query: Any, params: Any = ..., /) -> Any: ...


class _OnStore:
    """SQL on one open store's own connections (SQLite or PostgreSQL): what the queue and the
    schedules share."""

    def __init__(self, store: Checkpointer) -> None:
        self.store = store
        self._pg = type(store).__name__ == "PostgresCheckpointer"
        self._local = threading.Lock()

    # -- SQL on the store's own connections -----------------------------------------------------------

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self._pg else text

    @contextmanager
    def _write(self) -> Iterator[_Exec]:
        if self._pg:
            pg: PostgresCheckpointer = self.store  # type: ignore[assignment]
            with pg._txn() as cur:
                yield cur
        else:
            lite: SqliteCheckpointer = self.store  # type: ignore[assignment]
            with lite._txn() as db:
                yield db

    @contextmanager
    def _read(self) -> Iterator[_Exec]:
        if self._pg:
            pg: PostgresCheckpointer = self.store  # type: ignore[assignment]
            with pg._reading("*"), pg._conn() as conn:
                yield conn
        else:
            lite: SqliteCheckpointer = self.store  # type: ignore[assignment]
            with lite._reading("*"), lite._lock:
                yield lite._db

    def now(self) -> float:
        """The journal's clock (seconds since the epoch): the server's on PostgreSQL, so that
        workers on several hosts agree on when a ``start_at`` comes; this host's on SQLite."""
        if not self._pg:
            return time.time()
        with self._read() as db:
            return float(db.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0])

    def _has_tables(self) -> bool:
        try:
            with self._read() as db:
                if self._pg:
                    return bool(db.execute("SELECT to_regclass('cuaderno_queue') IS NOT NULL").fetchone()[0])
                return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'cuaderno_queue'").fetchone() is not None
        except JournalError:
            return False


class JournalQueue(_OnStore):
    """The queue of one open store (SQLite or PostgreSQL). Obtained through :func:`queue_of`."""

    def lock_key(self, run_id: str) -> int:
        """The run's advisory lock key (PostgreSQL; 0 on SQLite), stored so a claim can tell from
        ``pg_locks`` alone which queued runs are held."""
        return int(self.store._lock_key(run_id)) if self._pg else 0  # type: ignore[attr-defined]

    # -- submitting -------------------------------------------------------------------------------------

    def enqueue(self, entry: QueueEntry, *, debounce: float | None = None) -> tuple[QueueEntry, bool]:
        """Write ``entry``'s row (and its idempotency key's), in one transaction; return the
        entry the submit stands for and whether it is new. A key whose last run is open (or
        closed less than ``debounce`` seconds after it was submitted) answers that run."""
        now = entry.submitted_at
        with self._write() as db:
            if entry.idempotency_key is not None:
                db.execute(self._sql("INSERT INTO cuaderno_queue_keys (idempotency_key, run_id, submitted_at) "
                                     "VALUES (?, ?, ?) ON CONFLICT DO NOTHING"),
                           (entry.idempotency_key, entry.run_id, now))
                last, at = db.execute(_KEY_LAST[self._pg], (entry.idempotency_key,)).fetchone()
                if last != entry.run_id:
                    status = db.execute(self._sql("SELECT status FROM cuaderno_runs WHERE run_id = ?"),
                                        (last,)).fetchone()
                    if status is None or status[0] not in CLOSED_STATUSES or (
                            debounce is not None and now - float(at) < debounce):
                        found = self._entry(db, last)
                        if found is not None:
                            return found, False
                    db.execute(self._sql("UPDATE cuaderno_queue_keys SET run_id = ?, submitted_at = ? "
                                         "WHERE idempotency_key = ?"), (entry.run_id, now, entry.idempotency_key))
            existing = self._entry(db, entry.run_id)
            if existing is not None:
                return existing, False
            if db.execute(self._sql("SELECT 1 FROM cuaderno_runs WHERE run_id = ?"), (entry.run_id,)).fetchone():
                raise SubmitConflict(entry.run_id, "the run was started outside the queue; submit another run id")
            # ON CONFLICT: another submit of this run id (PostgreSQL: the same fire time of a
            # schedule, submitted by two workers at once) committed first; the row is then its.
            inserted = db.execute(self._sql(_INSERT),
                       (entry.run_id, entry.agent, entry.versions, entry.tenant, entry.task, entry.priority,
                        entry.start_at, entry.submitted_at, entry.concurrency_key, entry.idempotency_key,
                        self.lock_key(entry.run_id)))
            if inserted.rowcount == 0:
                raced = self._entry(db, entry.run_id)
                if raced is not None:
                    return raced, False
        return entry, True

    def _entry(self, db: _Exec, run_id: str) -> QueueEntry | None:
        row = db.execute(self._sql(_ENTRY),
                         (run_id,)).fetchone()
        if row is None:
            return None
        return QueueEntry(run_id=row[0], agent=row[1], versions=row[2], tenant=row[3], task=row[4],
                          priority=int(row[5]), start_at=float(row[6]), submitted_at=float(row[7]),
                          concurrency_key=row[8], idempotency_key=row[9])

    def entry(self, run_id: str) -> QueueEntry | None:
        """The queue row of a run, or ``None`` (never submitted, or a journal without the queue)."""
        try:
            with self._read() as db:
                return self._entry(db, run_id)
        except JournalError:
            if self._has_tables():
                raise
            return None

    def notify(self) -> None:
        """Wake the workers that listen (PostgreSQL ``NOTIFY``; nothing on SQLite, whose workers poll)."""
        if self._pg:
            with self._read() as db:
                db.execute("SELECT pg_notify(%s, '')", (self.channel,))

    def listen(self) -> Any:
        """A new connection that LISTENs on :attr:`channel` (PostgreSQL; ``None`` on SQLite, or
        when the server does not answer now). The caller reads its socket and closes it."""
        if not self._pg:
            return None
        import psycopg
        from psycopg import sql

        pg: PostgresCheckpointer = self.store  # type: ignore[assignment]
        try:
            conn = pg._connect()
        except psycopg.Error:
            return None
        try:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        except psycopg.Error:
            conn.close()
            return None
        return conn

    @property
    def channel(self) -> str:
        """The ``LISTEN`` channel of this journal's queue (PostgreSQL)."""
        return f"cuaderno_queue_{str(getattr(self.store, '_journal_id', ''))[:24]}"

    # -- limits -----------------------------------------------------------------------------------------

    def set_limit(self, key: str, limit: int | None) -> None:
        """At most ``limit`` runs of ``key`` in progress at once (``None``: no limit)."""
        with self._write() as db:
            db.execute(self._sql("DELETE FROM cuaderno_queue_limits WHERE concurrency_key = ?"), (key,))
            if limit is not None:
                db.execute(self._sql("INSERT INTO cuaderno_queue_limits (concurrency_key, max_running) VALUES (?, ?)"),
                           (key, limit))

    def limits(self) -> dict[str, int]:
        """Every concurrency limit the journal records."""
        try:
            with self._read() as db:
                return self._limits(db)
        except JournalError:
            if self._has_tables():
                raise
            return {}

    @staticmethod
    def _limits(db: _Exec) -> dict[str, int]:
        return {str(k): int(n) for k, n in db.execute("SELECT concurrency_key, max_running FROM cuaderno_queue_limits")}

    # -- claiming ---------------------------------------------------------------------------------------

    def claim(self, *, versions: str, owner: str, free: int, skip: set[str]) -> Claim:
        """Take over up to ``free`` queued runs of ``versions`` (best priority first, then oldest),
        none before its ``start_at``, none that would put its concurrency key over its limit,
        none in ``skip`` (this worker's own, or backing off). Each run returned is held by this
        store at the epoch given (``acquire``): the caller drives it and releases it."""
        out = Claim()
        if free <= 0:
            return out
        if self._pg:
            # A store that claims takes runs again and again: its lock connection stays open
            # between them instead of being opened again for nearly every claim.
            self.store._keep_holds = True  # type: ignore[attr-defined]
        with self._claim_lock() as db:
            # PostgreSQL: the holds are read before the candidates, so a run seen running and
            # unheld was unheld after it was last seen held (a holder that finished it meanwhile
            # closed it first: it is not a candidate).
            if self._pg:  # the server's clock and its advisory locks in one statement
                now, locked = self._pg_now_locked(db)
            else:
                now, locked = time.time(), None
            # The best candidates come first: the runs in progress (this worker's, which it
            # skips, and the other workers'), those ended since the last claim, then the waiting
            # ones. A few more than those are read first; all of them only when that was not enough.
            first = min(_CANDIDATES, 2 * (free + len(skip)) + 64)
            picked, live, closed, read = self._pick(db, out, versions, now, first, free, skip, locked)
            if len(picked) < free and read >= first and first < _CANDIDATES:
                out.at_limit.clear()
                out.keyed.clear()
                picked, live, closed, read = self._pick(db, out, versions, now, _CANDIDATES, free, skip, locked)
            if not picked:
                if closed:
                    self._mark_done(db, closed)
                return out
            # Under the claim lock: the next claimer reads the holds after these takeovers. All
            # of them in one transaction (one synced commit per claim, not one per run), with
            # the rows of the runs found ended marked done.
            took = take_over(self.store, picked, owner, done=closed)
            out.taken, out.lost, out.stale = took.taken, len(took.lost), len(took.stale)
            out.keyed.intersection_update(r for r, _ in took.taken)
            tasks = {r[0]: r[5] for r in live}
            out.tasks = {run_id: tasks[run_id] for run_id, _ in took.taken}
            if took.summaries:
                out.summaries = self._summaries(db, took)
            if out.taken:
                faults.point("queue.C1")  # runs taken over, the claim lock still held, none driven yet
        return out

    def _pick(self, db: _Exec, out: Claim, versions: str, now: float, limit: int, free: int, skip: set[str],
              locked: set[int] | None) -> tuple[list[str], list[Any], list[str], int]:
        """The runs to take (at most ``free``) of the best ``limit`` candidates, the live
        candidates read, the runs found ended (their rows to mark done) and how many rows were read."""
        rows = db.execute(_PICK[self._pg], (versions, now, limit)).fetchall()
        closed = [r[0] for r in rows if r[3] in CLOSED_STATUSES]
        live = [r for r in rows if r[3] == "running" and r[0] not in skip]
        picked: list[str] = []
        if not live:
            return picked, live, closed, len(rows)
        # A key's runs in progress count only against a key some candidate has: a queue without
        # keys is not asked for them (one statement less per claim).
        has_keys = any(r[1] is not None for r in live)  # asked once: a claim reads up to 512 candidates
        keyed = db.execute(_IN_PROGRESS[self._pg]).fetchall() if has_keys else []
        held = self._held(db, [(r[0], int(r[2])) for r in live if r[4]] + [(r[0], int(r[2])) for r in keyed], locked)
        limits = self._limits(db) if keyed or has_keys else {}
        running: dict[str, int] = {}
        for run_id, key, _ in keyed:
            if run_id in held:
                running[key] = running.get(key, 0) + 1
        for run_id, key, _, _, _, _ in live:
            if run_id in held:
                continue
            if key is not None and key in limits and running.get(key, 0) >= limits[key]:
                out.at_limit[key] = out.at_limit.get(key, 0) + 1
                continue
            if len(picked) < free:
                picked.append(run_id)
                if key is not None:
                    running[key] = running.get(key, 0) + 1
                    out.keyed.add(run_id)
        return picked, live, closed, len(rows)

    def _summaries(self, db: Any, took: Takeovers) -> dict[str, Checkpoint]:
        """The summaries a PostgreSQL takeover read, decoded (on the claim's connection, where a
        sealed one's run key is looked up), each at the epoch its run was taken at; one that does
        not decode is left out (the worker's own read then says what is wrong with it)."""
        pg: PostgresCheckpointer = self.store  # type: ignore[assignment]
        out: dict[str, Checkpoint] = {}
        for run_id, epoch in took.taken:
            try:
                cp = pg._summary_of(db, run_id, took.summaries[run_id])
            except (JournalError, ValueError, TypeError, KeyError):
                continue
            cp.epoch = epoch
            out[run_id] = cp
        return out

    def _mark_done(self, db: _Exec, run_ids: list[str]) -> None:
        # The run ended: its row no longer competes for a claim (its key stays, for debounce).
        if self._pg:
            db.execute("UPDATE cuaderno_queue SET done = true WHERE run_id = ANY(%s)", (run_ids,))
            return
        with self._write() as lite:  # the store's own write transaction (its file checks included)
            for run_id in run_ids:
                lite.execute("UPDATE cuaderno_queue SET done = 1 WHERE run_id = ?", (run_id,))

    @staticmethod
    def _pg_locked(db: _Exec) -> set[int]:
        """The run lock keys held now in this database (PostgreSQL: a session's advisory lock
        ends with its session, so a SIGKILLed holder's runs are free once the server sees it go)."""
        return {int.from_bytes(((high << 32) | low).to_bytes(8, "big"), "big", signed=True)
                for high, low in db.execute(_PG_LOCKED)}

    @staticmethod
    def _pg_now_locked(db: _Exec) -> tuple[float, set[int]]:
        """The server's clock and :meth:`_pg_locked`'s keys, read by one statement (a claim's
        first; the clock is read before the locks, as it was by two statements)."""
        row = db.execute(_PG_NOW_LOCKED).fetchone()
        return float(row[0]), {int(k) for k in row[1]}

    def _held(self, db: _Exec, runs: Sequence[tuple[str, int]], locked: set[int] | None = None) -> set[str]:
        """Which of these queued runs a live process holds now (the journal's liveness)."""
        if not runs:
            return set()
        if self._pg:
            locked = self._pg_locked(db) if locked is None else locked
            return {run_id for run_id, key in runs if key in locked}
        lite: SqliteCheckpointer = self.store  # type: ignore[assignment]
        wanted = [run_id for run_id, _ in runs]
        held = held_by_lock(lite.path, wanted)  # the lock bytes alone: no record read, no holder described
        return held if held is not None else set(lite.holders(wanted))

    @contextmanager
    def _claim_lock(self) -> Iterator[_Exec]:
        """One claimer at a time per journal, over the claim's reads and its takeovers."""
        with self._local:
            if self._pg:
                pg: PostgresCheckpointer = self.store  # type: ignore[assignment]
                # _reading: a server that does not answer (restarting) is a JournalError, which a
                # worker's poll waits out.
                with pg._reading("*"), pg._conn() as conn, conn.transaction():
                    # Transaction-scoped: a claimer that dies (or loses its connection) lets go with it.
                    conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (0x71756575, _int4(pg._journal_id)))
                    yield conn
                return
            lite: SqliteCheckpointer = self.store  # type: ignore[assignment]
            if lite.path == ":memory:":  # one connection of one process: nobody to race
                yield _Unlocked(lite)
                return
            fd = os.open(os.path.realpath(lite.path) + "-queue", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0),
                         0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # dropped by the kernel if this process dies
                yield _Unlocked(lite)
            finally:
                os.close(fd)

    # -- for people and for the worker's other path ------------------------------------------------------

    def queued(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs have a queue row (a worker claims them through :meth:`claim` only)."""
        wanted = list(dict.fromkeys(run_ids))
        if not wanted:
            return set()
        try:
            with self._read() as db:
                if self._pg:
                    return {r for (r,) in db.execute("SELECT run_id FROM cuaderno_queue WHERE run_id = ANY(%s)",
                                                     (wanted,))}
                return {r for r in wanted if db.execute("SELECT 1 FROM cuaderno_queue WHERE run_id = ?",
                                                        (r,)).fetchone()}
        except JournalError:
            if self._has_tables():
                raise
            return set()

    def work_outside(self) -> bool:
        """Whether an open run may need a worker outside the queue (``open_runs`` would return
        one that a claim does not take: a running run without a queue row, a cancellation to
        close, compensations to run). ``False`` lets a worker skip reading the open runs'
        summaries while every open run is the queue's."""
        try:
            with self._read() as db:
                return db.execute(_OUTSIDE[self._pg]).fetchone() is not None
        except JournalError:
            if self._has_tables():
                raise
            return True

    def has_waiting(self, versions: str) -> bool:
        """Whether a submitted run of ``versions`` is still waiting or in progress (its row not
        yet seen closed): a worker of those versions has work in this journal."""
        try:
            with self._read() as db:
                return db.execute(_HAS_WAITING[self._pg], (versions,)).fetchone() is not None
        except JournalError:
            if self._has_tables():
                raise
            return False

    def waiting_for(self, run_id: str) -> str | None:
        """Why a queued run that nobody holds is not being run, for people (``None``: nothing of
        the queue's holds it back: it waits for a worker)."""
        entry = self.entry(run_id)
        if entry is None:
            return None
        now = self.now()
        if entry.start_at > now:
            return f"its start time ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(entry.start_at))})"
        key = entry.concurrency_key
        if key is None:
            return None
        limit = self.limits().get(key)
        if limit is None:
            return None
        with self._read() as db:
            keyed = [(r, int(k)) for r, _, k in db.execute(_KEY_IN_PROGRESS[self._pg], (key,)).fetchall()]
            held = len(self._held(db, keyed))
        if held >= limit:
            return f"a slot of concurrency key {quoted(key)} ({held} of {limit} in progress)"
        return None


class JournalSchedules(_OnStore):
    """The cron schedules of one open store (``cuaderno_schedules``). Obtained through
    :func:`schedules_of`; :mod:`cuaderno.flow.schedules` fires them through the queue."""

    def add(self, row: tuple[Any, ...]) -> bool:
        """Insert a schedule (the columns of ``cuaderno_schedules`` in order); ``False``: the name
        is taken (nothing written)."""
        with self._write() as db:
            if db.execute(self._sql("SELECT 1 FROM cuaderno_schedules WHERE name = ?"), (row[0],)).fetchone():
                return False
            db.execute(self._sql("INSERT INTO cuaderno_schedules (name, cron, agent, task, tenant, priority, "
                                 "concurrency_key, catch_up, created_at, last_fire) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"),
                       row)
        return True

    def remove(self, name: str) -> bool:
        """Remove a schedule; ``False``: there was none of that name. Its runs stay."""
        with self._write() as db:
            if not db.execute(self._sql("SELECT 1 FROM cuaderno_schedules WHERE name = ?"), (name,)).fetchone():
                return False
            db.execute(self._sql("DELETE FROM cuaderno_schedules WHERE name = ?"), (name,))
        return True

    def rows(self) -> list[tuple[Any, ...]]:
        """Every schedule's row, by name (empty on a journal without the queue's tables)."""
        try:
            with self._read() as db:
                return [tuple(r) for r in db.execute(
                    "SELECT name, cron, agent, task, tenant, priority, concurrency_key, catch_up, created_at, "
                    "last_fire FROM cuaderno_schedules ORDER BY name").fetchall()]
        except JournalError:
            if self._has_tables():
                raise
            return []

    def fired(self, name: str, up_to: float) -> None:
        """Record that the schedule's runs up to fire time ``up_to`` are submitted (never backwards)."""
        with self._write() as db:
            db.execute(self._sql("UPDATE cuaderno_schedules SET last_fire = ? WHERE name = ? AND last_fire < ?"),
                       (up_to, name, up_to))


class _Unlocked:
    """The SQLite store's connection for a claim's reads, taken statement by statement: the
    store's lock must not be held across the claim's takeovers (each takes it itself)."""

    def __init__(self, store: SqliteCheckpointer) -> None:
        self._store = store

    def execute(self, query: Any, params: Any = (), /) -> Any:
        store = self._store
        with store._reading("*"), store._lock:
            return _Rows(store._db.execute(query, params).fetchall())


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows

    def fetchone(self) -> Any:
        return self._rows[0] if self._rows else None

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)


def _int4(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big", signed=True)


def queue_of(store: Checkpointer) -> JournalQueue:
    """The queue of an open SQLite or PostgreSQL store (a :class:`~cuaderno.journal.GroupCommit`
    is looked through).

    Raises:
        UsageError: another kind of store (the in-memory one has no queue).
    """
    inner = getattr(store, "store", store)
    if type(inner).__name__ not in ("SqliteCheckpointer", "PostgresCheckpointer"):
        raise UsageError(f"{type(inner).__name__} has no queue: submit runs to a SQLite or PostgreSQL journal")
    return JournalQueue(inner)


def schedules_of(store: Checkpointer) -> JournalSchedules:
    """The schedules of an open SQLite or PostgreSQL store (see :func:`queue_of`).

    Raises:
        UsageError: another kind of store (the in-memory one has no schedules).
    """
    return JournalSchedules(queue_of(store).store)
