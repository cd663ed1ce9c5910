"""The part of a SQL journal that is the same in every dialect (SQLite, PostgreSQL).

The two stores read the same tables with the same statements, differing only in how a parameter
is written (``?`` or ``%s``), in how a connection and one consistent snapshot are had (a lock and
``BEGIN`` on SQLite's one connection; a pooled connection and a ``REPEATABLE READ`` transaction in
PostgreSQL), and in which values they can hold. :class:`SqlJournal` is the shared reading:
``load``, ``load_tail`` (with the index it needs), ``checkpoint``, ``list_runs`` and ``open_runs``;
the writes are :mod:`._sql_write`'s. A backend supplies its :class:`Dialect` (every statement of
both algorithms written out, no SQL is built from strings, R12) and the few hooks that obtain a
connection (:meth:`SqlJournal._reader`, :meth:`SqlJournal._snapshot`, :meth:`SqlJournal._reading`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Self

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import JournalCorrupt, JournalError, RunNotFound, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import _claims
from cuaderno.journal._append import RawRow, check_chain, decode_row
from cuaderno.journal._compress import stored_payload
from cuaderno.journal._offload import inlined
from cuaderno.journal._rows import checked_epoch, decode_small_payloads, storable
from cuaderno.journal._sealing import RunKeys, Sealer, open_summary, opened
from cuaderno.journal.base import Tail, tail_base

__all__ = ["POSTGRES", "SQLITE", "SQLITE_UNKEYED", "Dialect", "SqlJournal"]


@dataclass(frozen=True)
class Dialect:
    """The statements the shared algorithm runs, as one dialect writes them."""

    head: str
    """``(epoch, checkpoint)`` of one run."""
    summary: str
    """``(checkpoint,)`` of one run."""
    run_events: str
    """Every row of one run (in ``seq`` order, or sorted by the reader)."""
    list_runs: str
    """``(run_id, epoch, checkpoint)`` of the runs with a status (or any), newest first."""
    open_runs: str
    """``(run_id, epoch, checkpoint)`` of the runs a worker may have to move on, oldest first."""
    has_step: str
    """Whether a run has a row of a step."""
    last_mark: str
    """The last row of a step of a run."""
    tail: str
    """The rows of a run after a ``seq``."""
    event: str
    """One row by its key ``(run_id, step_id, phase)`` (an append's lookups)."""
    insert: str
    """One new row of the events table (all thirteen columns)."""
    summaries: str
    """``(run_id, epoch, checkpoint)`` of several runs, named by one parameter (PostgreSQL: an
    array of their ids; SQLite: a JSON array of them): a group's summaries not cached, read in one
    statement."""
    upsert_run: str
    """The summary row an append writes, created or updated; a dialect that keeps a row version
    returns it (PostgreSQL's ``xmin``: the summary cache's key), else nothing."""
    rebuild_head: str
    """``(epoch, checkpoint, status)`` of one run, read by a rebuild (locked where the dialect
    locks rows; the summary as bytes where a summary that is not even text must read as damage)."""
    rewrite_summary: str
    """A rebuild's ``(status, checkpoint)`` of one run."""
    erase_row: str
    """Erases one row's content: ``(codec, payload, run_id, step_id, phase)``, its fingerprint
    and digest key set to NULL (see :mod:`._erase`)."""
    tail_index_found: str
    """A row when the ``(run_id, seq)`` index a tail read needs is there."""
    create_tail_index: tuple[str, ...]
    """Creates that index (not a schema step: a cuaderno without it reads and writes the tables as
    they are; the index only costs each insert one more b-tree entry)."""
    duplicate: tuple[type[Exception], ...] = ()
    """The driver's errors that mean an insert met a stored key (the backend names its driver's)."""
    insert_many: str | None = None
    """Several new rows of the events table in one statement, each column an array (the thirteen
    of ``insert``, in its order); ``None``: the dialect inserts them one statement per row."""


SQLITE = Dialect(
    head="SELECT epoch, checkpoint FROM cuaderno_runs WHERE run_id=?",
    summary="SELECT checkpoint FROM cuaderno_runs WHERE run_id=?",
    run_events=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
                "row_hash, salt FROM cuaderno_events WHERE run_id=?"),
    list_runs=("SELECT run_id, epoch, checkpoint FROM cuaderno_runs WHERE (? IS NULL OR status = ?) "
               "ORDER BY updated_at DESC LIMIT ?"),
    open_runs=("SELECT run_id, epoch, checkpoint FROM cuaderno_runs WHERE status = 'running' "
               "OR (status IN ('suspended', 'needs_human') AND checkpoint LIKE '%\"cancel_requested\":{%') "
               "OR (status = 'cancelled' AND checkpoint LIKE '%\"cleanup\":[{%') "
               "ORDER BY updated_at LIMIT ?"),
    has_step="SELECT 1 FROM cuaderno_events WHERE run_id=? AND step_id=? LIMIT 1",
    last_mark=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, "
               "created_at, row_hash, salt FROM cuaderno_events WHERE run_id=? AND step_id=? ORDER BY seq DESC "
               "LIMIT 1"),
    tail=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
          "row_hash, salt FROM cuaderno_events WHERE run_id=? AND seq>? ORDER BY seq"),
    event=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
           "row_hash, salt FROM cuaderno_events WHERE run_id=? AND step_id=? AND phase=?"),
    # name, decision and fingerprint: '' stands for NULL (see _sql_write.stored_rows: an event's
    # are never empty, and the driver binds a str at once where it looks None up in its adapters).
    insert=("INSERT INTO cuaderno_events (run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, "
            "payload, created_at, row_hash, salt) VALUES (?,?,?,?,?,NULLIF(?,''),NULLIF(?,''),NULLIF(?,''),?,?,?,?,?)"),
    summaries="SELECT run_id, epoch, checkpoint FROM cuaderno_runs WHERE run_id IN (SELECT value FROM json_each(?))",
    upsert_run=("INSERT INTO cuaderno_runs (run_id, status, epoch, updated_at, checkpoint) VALUES (?,?,?,?,?) "
                "ON CONFLICT (run_id) DO UPDATE SET status=excluded.status, updated_at=excluded.updated_at, "
                "checkpoint=excluded.checkpoint"),
    rebuild_head="SELECT epoch, CAST(checkpoint AS BLOB), status FROM cuaderno_runs WHERE run_id=?",
    rewrite_summary="UPDATE cuaderno_runs SET status=?, checkpoint=? WHERE run_id=?",
    erase_row=("UPDATE cuaderno_events SET codec=?, payload=?, fingerprint=NULL, salt=NULL WHERE run_id=? AND "
               "step_id=? AND phase=?"),
    tail_index_found="SELECT 1 FROM sqlite_master WHERE type='index' AND name='cuaderno_events_run_seq'",
    create_tail_index=("CREATE INDEX IF NOT EXISTS cuaderno_events_run_seq ON cuaderno_events (run_id, seq)",),
    duplicate=(sqlite3.IntegrityError,),
)

SQLITE_UNKEYED = replace(
    SQLITE,
    run_events=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
                "row_hash, NULL FROM cuaderno_events WHERE run_id=?"),
    last_mark=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, "
               "created_at, row_hash, NULL FROM cuaderno_events WHERE run_id=? AND step_id=? ORDER BY seq DESC "
               "LIMIT 1"),
    tail=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
          "row_hash, NULL FROM cuaderno_events WHERE run_id=? AND seq>? ORDER BY seq"),
    event=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
           "row_hash, NULL FROM cuaderno_events WHERE run_id=? AND step_id=? AND phase=?"),
)
"""SQLite's reads of a file before schema 4, which has no ``salt`` column (every row of it is of
the first chain version): what a read-only store, which cannot migrate the file, reads it with.
A store that may write migrates the file at open and never uses it."""

POSTGRES = Dialect(
    head="SELECT epoch, checkpoint FROM cuaderno_runs WHERE run_id=%s",
    summary="SELECT checkpoint FROM cuaderno_runs WHERE run_id=%s",
    run_events=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, "
                "created_at, row_hash, salt FROM cuaderno_events WHERE run_id=%s ORDER BY seq"),
    list_runs=("SELECT run_id, epoch, checkpoint FROM cuaderno_runs "
               "WHERE (%s::text IS NULL OR status = %s) ORDER BY updated_at DESC LIMIT %s"),
    open_runs=("SELECT run_id, epoch, checkpoint FROM cuaderno_runs "
               "WHERE status = 'running' OR (status IN ('suspended', 'needs_human') AND "
               "strpos(checkpoint, '\"cancel_requested\":{') > 0) "
               "OR (status = 'cancelled' AND strpos(checkpoint, '\"cleanup\":[{') > 0) "
               "ORDER BY updated_at LIMIT %s"),
    has_step="SELECT 1 FROM cuaderno_events WHERE run_id=%s AND step_id=%s LIMIT 1",
    last_mark=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, "
               "created_at, row_hash, salt FROM cuaderno_events WHERE run_id=%s AND step_id=%s ORDER BY seq DESC "
               "LIMIT 1"),
    tail=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
          "row_hash, salt FROM cuaderno_events WHERE run_id=%s AND seq>%s ORDER BY seq"),
    event=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
           "row_hash, salt FROM cuaderno_events WHERE run_id=%s AND step_id=%s AND phase=%s"),
    insert=("INSERT INTO cuaderno_events (run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, "
            "payload, created_at, row_hash, salt) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"),
    insert_many=("INSERT INTO cuaderno_events (run_id, step_id, phase, seq, kind, name, decision, fingerprint, "
                 "codec, payload, created_at, row_hash, salt) SELECT * FROM unnest(%b::text[], %b::text[], "
                 "%b::text[], %b::bigint[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], "
                 "%b::bytea[], %b::float8[], %b::text[], %b::bytea[])"),
    summaries="SELECT run_id, epoch, checkpoint FROM cuaderno_runs WHERE run_id = ANY(%b)",
    upsert_run=("INSERT INTO cuaderno_runs (run_id, status, epoch, updated_at, checkpoint) VALUES (%s,%s,%s,%s,%s) "
                "ON CONFLICT (run_id) DO UPDATE SET status=excluded.status, updated_at=excluded.updated_at, "
                "checkpoint=excluded.checkpoint RETURNING xmin::text"),
    rebuild_head="SELECT epoch, checkpoint, status FROM cuaderno_runs WHERE run_id=%s FOR UPDATE",
    rewrite_summary="UPDATE cuaderno_runs SET status=%s, checkpoint=%s WHERE run_id=%s",
    erase_row=("UPDATE cuaderno_events SET codec=%s, payload=%s, fingerprint=NULL, salt=NULL WHERE run_id=%s "
               "AND step_id=%s AND phase=%s"),
    tail_index_found="SELECT 1 WHERE to_regclass('cuaderno_events_run_seq') IS NOT NULL",
    # The lock is the migrations' (_pg_server._MIGRATE_LOCK, "migr"): one creator at a time.
    create_tail_index=("SELECT pg_advisory_xact_lock(1835624306)",
                       "CREATE INDEX IF NOT EXISTS cuaderno_events_run_seq ON cuaderno_events (run_id, seq)"),
)
"""PostgreSQL's statements; :mod:`.postgres` adds its driver's duplicate-key error."""


def plain_loads(run_id: str, text: Any) -> Checkpoint:
    """A stored summary as SQLite hands it back."""
    return Checkpoint.loads(text)


def text_loads(run_id: str, text: object) -> Checkpoint:
    """A stored summary, refused unless it is text (as PostgreSQL hands it back)."""
    if not isinstance(text, str):
        raise JournalCorrupt(f"run {run_id!r}: its stored summary is not text")
    return Checkpoint.loads(text)


def _limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise UsageError("limit must be an integer")
    return limit


class SqlJournal:
    """The shared reads and append entry points of a SQL journal (see the module)."""

    _dialect: Dialect
    _id_ok = staticmethod(storable)
    """Whether a run id, step id or status could have been stored (anything else is not found,
    never sent to SQL): one check for every backend."""
    _loads: Callable[[str, Any], Checkpoint] = staticmethod(plain_loads)
    """A stored summary's text as a :class:`Checkpoint`."""
    _readonly: bool
    _taken: dict[str, int]
    _tail_ready = False
    _sealer: Sealer | None = None
    """The store's keys when it encrypts at rest (see :mod:`._sealing`), else ``None``."""

    # -- encryption at rest (journal._sealing's) ------------------------------------------------------

    def _keys(self, db: Any) -> RunKeys | None:
        """The data keys of runs, looked up on ``db``; ``None`` when the store does not encrypt."""
        return None if self._sealer is None else self._sealer.bind(db)

    def _summary_of(self, db: Any, run_id: str, text: Any) -> Checkpoint:
        """A stored summary read back on ``db``, its sealed content opened."""
        return open_summary(lambda: self._keys(db), run_id, text, self._loads)

    def _opened_text(self, db: Any, run_id: str, text: Any) -> Any:
        """A stored summary's text with its sealed content opened (as an unsealed summary is
        stored), for a reader of the text; the text as it is when it does not open."""
        try:
            return self._summary_of(db, run_id, text).dumps()
        except JournalCorrupt:
            return text  # the reader says how it is damaged

    def stored_content(self, run_id: str, step_id: str, phase: str, codec: str, payload: bytes) -> dict[str, Any]:
        """A row's payload as read from the events table by a reader of its own (the page's
        index), as shown to people: opened with the run's data key if it is sealed.

        Raises:
            JournalCorrupt: it does not decode or open. KeyInvalid: its run's key cannot be had.
        """
        with self._reader(run_id) as db:
            codec, raw = opened(self._keys(db), run_id, step_id, phase, codec, bytes(payload))
        return stored_payload(codec, raw)

    def _drop_keys(self, run_ids: list[str]) -> None:
        """Forget the cached data keys of runs whose write failed or whose key was destroyed."""
        if self._sealer is not None:
            self._sealer.forget(run_ids)

    # -- what a backend supplies --------------------------------------------------------------------

    def _reading(self, run_id: str) -> AbstractContextManager[None]:
        """What a failed read means, named (damage: JournalCorrupt)."""
        raise NotImplementedError

    def _reader(self, run_id: str, *, check: bool = True) -> AbstractContextManager[Any]:
        """A connection to read one statement or a few on (inside :meth:`_reading`), the schema
        checked first (unless not ``check``)."""
        raise NotImplementedError

    def _snapshot(self, run_id: str) -> AbstractContextManager[Any]:
        """A connection in one read transaction (all its statements see one snapshot), the schema
        checked first, inside :meth:`_reading`."""
        raise NotImplementedError

    def _txn(self) -> AbstractContextManager[Any]:
        """A write transaction (for the tail index)."""
        raise NotImplementedError

    def _may_index(self) -> bool:
        """Whether the tail index may be created now (a store that may not write, or not yet,
        reads whole journals instead: a tail read is not worth the write)."""
        return not self._readonly

    # -- reads ------------------------------------------------------------------------------------------

    def load(self, run_id: str) -> list[StepEvent]:
        if not self._id_ok(run_id):
            raise RunNotFound(run_id)
        # One snapshot for both statements: read apart, a writer committing between them would
        # leave rows past the head the summary named, which looks exactly like a tampered journal.
        with self._snapshot(run_id) as db:
            head = db.execute(self._dialect.summary, (run_id,)).fetchone()
            rows: list[RawRow] = [] if head is None else db.execute(self._dialect.run_events, (run_id,)).fetchall()
            keys = None if self._sealer is None or head is None else self._sealer.preload(db, run_id)
            rows = inlined(rows, keys)  # offloaded payloads read in this snapshot
        if head is None:
            raise RunNotFound(run_id)
        with self._reading(run_id):
            rows.sort(key=lambda r: r[3])
            summary = open_summary(lambda: keys, run_id, head[0], self._loads)
            events = check_chain(run_id, rows, summary.last_hash, summary.last_seq, keys)
            decode_small_payloads(events)
        return events

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        if not self._id_ok(run_id):
            return None
        with self._reader(run_id) as db:
            row = db.execute(self._dialect.head, (run_id,)).fetchone()
            if row is None:
                return None
            cp = self._summary_of(db, run_id, row[1])
            cp.epoch = checked_epoch(run_id, row[0])
            return cp

    def list_runs(self, *, status: str | None = None, limit: int = 100) -> list[Checkpoint]:
        if _limit(limit) <= 0 or (status is not None and not self._id_ok(status)):
            return []
        # min: "no limit" for SQLite, whose integers have 64 bits
        return self._runs(self._dialect.list_runs, (status, status, min(limit, 2**62)))

    def open_runs(self, *, limit: int = 1000) -> list[Checkpoint]:
        """Runs a worker may have to move on, least recently updated first (see
        :class:`~cuaderno.journal.base.SupportsClaims`). A run waiting for a person is read only
        when its summary holds a cancellation request (``"cancel_requested":{``), a cancelled one
        only when it holds a cleanup entry (``"cleanup":[{``): that is how they are written, and a
        quote can be a raw ``"`` there only in a key. So the runs nothing but a person moves on
        are not decoded on every poll, and do not fill the window of the oldest ``limit`` runs."""
        if _limit(limit) <= 0:
            return []
        return [cp for cp in self._runs(self._dialect.open_runs, (min(limit, 2**62),))
                if _claims.work_for(cp) is not None]

    def _runs(self, statement: str, params: tuple[object, ...]) -> list[Checkpoint]:
        """The summaries ``statement`` selects as ``(run_id, epoch, checkpoint)``."""
        with self._reader("*") as db:
            rows = db.execute(statement, params).fetchall()
            out = []
            for run_id, epoch, text in rows:
                cp = self._summary_of(db, run_id, text)
                cp.epoch = checked_epoch(run_id, epoch)
                out.append(cp)
            return out

    # -- tails (SupportsTail): a resume reads the latest snapshot and the rows after it ------------

    def load_tail(self, run_id: str, step_id: str) -> Tail | None:
        """See :meth:`~cuaderno.journal.base.SupportsTail.load_tail`. Needs the index on
        ``(run_id, seq)``, created by the first tail read of a writable store; a store that may
        not write answers ``None`` without it (the whole journal is read)."""
        if not self._id_ok(run_id) or not self._id_ok(step_id):
            raise RunNotFound(run_id)
        if not self._tail_ready:
            # The index is created only for a run that has a snapshot (a resume of a short run,
            # or one refused, leaves the journal as it was), found by the primary key alone.
            with self._reader(run_id, check=False) as db:
                found = db.execute(self._dialect.has_step, (run_id, step_id)).fetchone()
            if found is None or not self._tail_index():
                return None
        with self._snapshot(run_id) as db:
            head = db.execute(self._dialect.head, (run_id,)).fetchone()
            snap = None if head is None else db.execute(self._dialect.last_mark, (run_id, step_id)).fetchone()
            base = None if snap is None else tail_base(snap[2])
            rows: list[RawRow] = [] if base is None else db.execute(self._dialect.tail, (run_id, base)).fetchall()
            keys = None if self._sealer is None or head is None else self._sealer.preload(db, run_id)
            rows = inlined(rows, keys)  # offloaded payloads read in this snapshot
        if head is None:
            raise RunNotFound(run_id)
        if snap is None or base is None:
            return None
        with self._reading(run_id):
            summary = open_summary(lambda: keys, run_id, head[1], self._loads)
            summary.epoch = checked_epoch(run_id, head[0])
            return Tail(summary, decode_row(snap, keys), [decode_row(r, keys) for r in rows])

    def prepare_tail(self) -> None:
        """See :meth:`~cuaderno.journal.base.SupportsTail.prepare_tail` (once per store)."""
        self._tail_index()

    def _tail_index(self) -> bool:
        """Whether the ``(run_id, seq)`` index is there, creating it when this store may write.
        It lets a resume read the rows after a snapshot without reading the run's others."""
        if self._tail_ready:
            return True
        with self._reader("*", check=False) as db:
            found = db.execute(self._dialect.tail_index_found).fetchone()
        if found is None:
            if not self._may_index():
                return False
            with self._reading("*"), self._txn() as db:
                for statement in self._dialect.create_tail_index:
                    db.execute(statement)
        self._tail_ready = True
        return True

    # -- closing ------------------------------------------------------------------------------------

    def _release_all(self) -> None:
        """Release the runs this store took over and did not release (a loop not closed yet when
        the store is, say at the end of a ``with`` block), or this process, still alive, would
        keep them from every other process."""
        for run_id, epoch in list(self._taken.items()):
            try:
                self.release(run_id, epoch)
            except JournalError:
                pass

    def release(self, run_id: str, epoch: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
