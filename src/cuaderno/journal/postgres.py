"""A journal in PostgreSQL, shared by workers on several hosts.

What it keeps, and why:

- ``synchronous_commit=on``, set on every connection (a server or role default of ``off`` would
  acknowledge a commit before its WAL is flushed, and an intent lost that way may already have
  been acted on);
- ``(run_id, step_id, phase)`` is the events table's primary key: the dedup key is a constraint
  of the table, not a check two workers could race;
- every write transaction first locks the run's summary row (``SELECT ... FOR UPDATE``), checks
  the fencing epoch there, writes the rows and then the summary, in that one transaction. The
  first append of a run has no row to lock: it takes a transaction-scoped advisory lock on the
  run instead, so two workers creating one run serialise too;
- the rows and their hash chain, the codecs and compression are exactly SQLite's (the append
  algorithm of :mod:`._append`, the row helpers of :mod:`._rows`, :mod:`._compress`): a payload of
  256 bytes and more is stored ``json+zstd`` unless the journal says ``compress=off`` (TOAST would
  compress only values over 2 KB, with pglz, which saves less on JSON text);
- numbered, append-only migrations of this dialect (:data:`._pg_server._MIGRATIONS`, list index = version,
  recorded one row per step in ``cuaderno_migrations``); SQLite's are its own. A database whose
  recorded version is newer than this cuaderno's is refused (:class:`~cuaderno.errors.SchemaTooNew`)
  before anything is written.

Liveness across hosts. A holder's process may die on another machine, so no check of a PID can
say it is gone. The holder instead takes a *session-level advisory lock* (``pg_try_advisory_lock``
on a 64-bit hash of the journal's id and the run id) on a connection of its own, kept open while it
holds runs: the server drops the lock when that connection ends, whatever ended it (the process
killed, the host gone, ``pg_terminate_backend``). A host that vanishes without closing its socket
is noticed by the server's TCP keepalives, which this store sets short on that connection
(``dead_peer_after_s``, about 30 s) instead of the system's two hours. While the lock is held,
``acquire`` by anyone else is :class:`~cuaderno.errors.RunBusy`; once it is gone the run is taken
over at once. The fencing epoch, checked in every transaction that writes, is still what refuses a
stale holder's next write (:class:`~cuaderno.errors.FencedOut`).

A holder that is stopped (SIGSTOP, a frozen VM) but whose connection lives keeps the lock: the
kernel answers keepalives for it. That is the safe side, as with SQLite's lock file: a lease
with expiry would let another worker take such a run over after the lease ran out, and when the
stopped holder woke, its step in flight (a tool call already sent) would complete a second time;
only its next write would be refused. Take such a run over with ``force`` when you know it is stuck.

The lock is the store's (one connection per store), not the process's: two stores in one process
are two workers, like two hosts.

The server may also end a lock session while its holder lives: ``pg_terminate_backend``, an idle
timeout, a proxy. Against the timeouts, the lock session sets ``idle_session_timeout``,
``idle_in_transaction_session_timeout`` and ``statement_timeout`` to 0 for itself (and the pooled
sessions ``idle_session_timeout``). Against the rest (R23), two rules:

- the holder notices at once: before every write for a run it holds (an intent, so before any
  tool body), and after its commit, it checks its lock session without a round trip (an ended
  session has the server's goodbye waiting on its idle socket). If it was ended, it takes its
  locks back first; a run whose lock someone else has now is refused (``FencedOut``): the worker
  writes nothing more for it, and an intent just committed is not acted on;
- the taker does not believe a lookup blindly: a free lock proves nothing about a holder the
  server cut off, so a takeover from a holder that had not let go and whose death this host
  cannot prove (another host, or alive here) is recorded in the claim, kept through later
  takeovers and releases while that holder may live (:meth:`earlier_holder`), and the loop
  then takes a tool step that holder had started, and whose lookup finds nothing, as uncertain
  (``needs_human``, with the evidence), instead of sending it again while the holder may be about
  to. A found receipt still settles the step. No tool declares a bound on its body's duration, so
  there is no bound to wait out instead.

A server restart ends every session, so it frees every run's lock, the live holders' too. A holder
takes its locks again at its first write after the lost connection; until ``dead_peer_after_s``
after the server started, a takeover of a run whose holder took it under the previous server start
is ``RunBusy`` (the claim records that start). A write whose connection dies, even after the
server committed it, is not a failure: the store asks the journal on a new connection whether it
landed, and writes it once if not (R19; :class:`~cuaderno.errors.ConnectionLost` when the server
stays away).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import psycopg
from psycopg_pool import ConnectionPool

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import (
    ConnectionLost,
    FencedOut,
    JournalCorrupt,
    JournalError,
    RunBusy,
    RunClosed,
    RunNotFound,
    UsageError,
)
from cuaderno.events import StepEvent
from cuaderno.journal import _lease
from cuaderno.journal._erase import SqlEraser
from cuaderno.journal._offload import reading
from cuaderno.journal._open import _masked
from cuaderno.journal._pg_server import SCHEMA_VERSION as SCHEMA_VERSION
from cuaderno.journal._pg_server import (
    PgServer,
    _HoldLost,
    _idle_alive,
    _int4,
    _NoServer,
    _one,
    _readable_schema,
)
from cuaderno.journal._rows import Duplicate as _Duplicate
from cuaderno.journal._rows import checked_epoch
from cuaderno.journal._rows import storable as _storable
from cuaderno.journal._sealing import Sealer
from cuaderno.journal._sql import POSTGRES
from cuaderno.journal._sql import text_loads as _loads
from cuaderno.journal._sql_write import Lost as _Lost
from cuaderno.journal._sql_write import first_line as _first_line
from cuaderno.journal._sql_write import next_epoch
from cuaderno.journal.base import CLOSED_STATUSES
from cuaderno.journal.keys import KeyProvider

__all__ = ["PostgresCheckpointer"]

# Whole statements, written out: no SQL is built from strings here (R12, checked by a test).
_LOCK_RUN = "SELECT epoch, xmin::text FROM cuaderno_runs WHERE run_id=%s FOR UPDATE"
_LOCK_NEW_RUN_NOWAIT = "SELECT epoch, xmin::text FROM cuaderno_runs WHERE run_id=%s FOR UPDATE NOWAIT"
_LOCK_RUNS = ('SELECT run_id, epoch, xmin::text FROM cuaderno_runs WHERE run_id = ANY(%b) ORDER BY run_id COLLATE "C" '
              "FOR UPDATE")
"""A group's summary rows, locked in one statement in the order of their run ids' code points (the
``C`` collation compares UTF-8 bytes: the order of Python's ``sorted``, whatever the database's
collation). PostgreSQL locks the rows as the sort hands them out (the locking clause is applied
after ``ORDER BY``), so every writer locks runs in one order and two groups cannot deadlock."""
_UPSERT_RUNS = ("INSERT INTO cuaderno_runs (run_id, status, epoch, updated_at, checkpoint) SELECT * FROM "
                "unnest(%b::text[], %b::text[], %b::bigint[], %b::float8[], %b::text[]) "
                "ON CONFLICT (run_id) DO UPDATE SET status=excluded.status, updated_at=excluded.updated_at, "
                "checkpoint=excluded.checkpoint RETURNING run_id, xmin::text")
"""The append's summary upsert (``POSTGRES.upsert_run``) for several runs (each once) in one
statement. Its arrays are sent in binary: in text, every quote of every summary's JSON would be
escaped (by a regular expression, in Python)."""
_HEAD_CHECKED = ("SELECT (SELECT max(version) FROM cuaderno_migrations), r.epoch, r.checkpoint FROM (SELECT 1) AS one "
                 "LEFT JOIN cuaderno_runs r ON r.run_id = %s")
"""A run's summary row with the journal's schema version, in one statement (one row whether the
run exists or not: ``epoch`` is ``NULL`` only when it does not, the column being ``NOT NULL``):
what :meth:`PostgresCheckpointer.checkpoint` reads, where the schema check took a round trip of
its own before every read of a summary (five per run a worker drives)."""
_INSERT_EVENTS = POSTGRES.insert_many or ""
"""Several new rows in one statement (the dialect's, each column an array): one statement to plan
and run where ``executemany`` sent one per row."""
_INSERT_EVENTS_UPSERT_RUNS = "WITH inserted AS (" + _INSERT_EVENTS + ") " + _UPSERT_RUNS
"""A group's new rows and its summaries in one statement (one round trip, not two): the rows
inserted by a data-modifying ``WITH``, which runs to its end whether or not the rest reads it.
A stored key fails the whole statement, as it failed the insert alone."""
_NEW_RUN_LOCK = 0x63756164  # "cuad": the class of the transaction locks a run's first append takes
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_OUR_PARAMS = {"schema", "compress"}


class PostgresCheckpointer(PgServer, SqlEraser):
    """A :class:`~cuaderno.journal.base.Checkpointer` in a PostgreSQL database.

    Args:
        conninfo: a libpq connection string or URL (``postgresql://user@host:5432/db``).
        schema: the schema holding the journal's tables (created if missing, when ``create``);
            ``None``: the connection's current schema (``public`` by default).
        create: ``False`` opens only an existing journal: a database without the cuaderno tables
            is refused (:class:`~cuaderno.errors.JournalError`) and nothing is created.
        readonly: read only: nothing is migrated or written, every write is a
            :class:`~cuaderno.errors.UsageError`, and the connections are read-only sessions.
        compress: ``True``/``False`` records the journal's compression setting (as SQLite's does);
            ``None`` follows the recorded one (compressed, if nobody said).
        pool_size: the most connections appends and reads use at once (plus one for run locks).
        dead_peer_after_s: about how long the server takes to notice that a lock holder's host
            vanished (TCP keepalives on the lock connection).
        connect_timeout_s: how long to wait for the server when opening.
        keys: encrypt at rest with this :class:`~cuaderno.journal.keys.KeyProvider` (as
            :class:`~cuaderno.journal.sqlite.SqliteCheckpointer`'s ``keys``; recorded in
            ``cuaderno_meta``, so a store without the key is refused at open).
        accept_rollback: open a journal whose tables were created anew since it recorded them (a
            ``pg_restore`` of a dump), which is otherwise refused with
            :class:`~cuaderno.errors.JournalRolledBack` before anything is written; say what
            happens to its runs with :func:`cuaderno.operations.mark_restored`, which records the
            restored tables as the journal's own.
    """

    def __init__(self, conninfo: str, *, schema: str | None = None, create: bool = True, readonly: bool = False,
                 compress: bool | None = None, pool_size: int = 8, dead_peer_after_s: int = 30,
                 connect_timeout_s: int = 10, keys: KeyProvider | None = None, accept_rollback: bool = False) -> None:
        if not isinstance(conninfo, str) or not conninfo:
            raise UsageError("a PostgreSQL journal needs a connection string or URL")
        if schema is not None and (not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema)):
            raise UsageError(f"schema must be a plain SQL name (letters, digits, _), got {schema!r:.80}")
        if compress is not None and not isinstance(compress, bool):
            raise UsageError(f"compress must be True, False or None, got {compress!r:.40}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise UsageError("pool_size must be a positive integer")
        self._sealer = None if keys is None else Sealer(keys, "%s")
        self._conninfo = conninfo
        self.url = _masked(conninfo)
        self._label = f"journal {self.url}"
        self.schema = schema
        if not isinstance(accept_rollback, bool):
            raise UsageError(f"accept_rollback must be True or False, got {accept_rollback!r:.40}")
        self._readonly = bool(readonly)
        self._accept_rollback = accept_rollback
        self._create = create and not self._readonly
        self._keepalive = max(1, int(dead_peer_after_s) // 3)
        self._connect_timeout = int(connect_timeout_s)
        self._closed = False
        self._cache: dict[str, tuple[str, Checkpoint]] = {}
        """Per run, the summary this store last wrote and the row version (``xmin``) it wrote it
        as: an append that finds the same version under its row lock need not decode it again."""
        self._cache_lock = threading.Lock()
        self._taken: dict[str, int] = {}
        """Runs this store took over (acquire) and has not released, with their epochs."""
        self._locked: set[str] = set()
        """Runs whose advisory lock this store's lock connection holds."""
        self._group = _GroupTxn()
        """Per thread, the group transaction in progress and its rows held back (see :meth:`_insert_rows`)."""
        self._records: dict[str, tuple[int, str]] = {}
        """Runs this store took over, with the epoch and the holder record it wrote then (what
        a release of that epoch marks let go: see :meth:`_release_known`)."""
        self._earlier: dict[str, list[_lease.Holder]] = {}
        """Runs this store took over with earlier holders that may still be executing a step (see
        :meth:`earlier_holder`), with their records (as the claim keeps them)."""
        self._holds: psycopg.Connection[Any] | None = None
        self._holds_lock = threading.Lock()
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        try:
            with self._connect() as conn:
                if self.schema is None:
                    self.schema = _one(conn.execute("SELECT current_schema()"))[0]
                    if self.schema is None:
                        raise JournalError(f"{self.url}: the connection has no current schema (its search_path "
                                           "names none that exists); give schema=; nothing was changed")
                self._journal_id, self._compress = self._migrate(conn, compress)
            self._pool = ConnectionPool(conninfo, min_size=1, max_size=pool_size, open=True,
                                        kwargs=self._connect_kwargs(), configure=self._configure, check=_idle_alive,
                                        name=f"cuaderno-{self.schema}", timeout=max(30.0, self._connect_timeout))
        except psycopg.Error as exc:
            self._close_quietly()
            raise JournalError(f"journal {self.url}: cannot open it: {_first_line(exc)}; nothing was changed") from None
        except BaseException:
            self._close_quietly()
            raise

    def side_connection(self) -> psycopg.Connection[Any]:
        """A new connection of the caller's own to this journal's database and schema (autocommit),
        for what keeps its own table beside the journal (the shared rate limiter,
        :mod:`cuaderno.flow.ratelimit`). The caller closes it."""
        return self._connect()

    @classmethod
    def from_url(cls, url: str, *, create: bool = True, readonly: bool = False,
                 keys: KeyProvider | None = None, accept_rollback: bool = False) -> PostgresCheckpointer:
        """Open the journal a ``postgresql://`` URL names. Besides libpq's own query parameters
        (``sslmode``, ``connect_timeout``, ...; libpq refuses unknown ones), the URL may carry
        ``schema=NAME`` and ``compress=on|off``."""
        parts = urlsplit(url)
        mine: dict[str, str] = {}
        rest: list[tuple[str, str]] = []
        try:
            pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:
            raise UsageError(f"journal URL {_masked(url)!r}: its query {parts.query!r} is not name=value pairs") from None
        for name, value in pairs:
            if name in _OUR_PARAMS:
                if name in mine:
                    raise UsageError(f"journal URL {_masked(url)!r}: parameter {name!r} is given twice")
                mine[name] = value
            else:
                rest.append((name, value))
        if "compress" in mine and mine["compress"] not in ("on", "off"):
            raise UsageError(f"journal URL {_masked(url)!r}: compress={mine['compress']!r} is not one of on, off")
        compress = None if "compress" not in mine else mine["compress"] == "on"
        conninfo = parts._replace(scheme="postgresql", query=urlencode(rest)).geturl()
        return cls(conninfo, schema=mine.get("schema"), create=create, readonly=readonly, compress=compress, keys=keys,
                   accept_rollback=accept_rollback)

    # -- writes (the algorithm is journal._sql_write's) -------------------------------------------

    _dialect = replace(POSTGRES, duplicate=(psycopg.errors.UniqueViolation,))
    _loads = staticmethod(_loads)

    @contextmanager
    def _write_txn(self) -> Iterator[psycopg.Cursor[Any]]:
        """An append's transaction. A group's rows held back to go with its summaries (see
        :meth:`_insert_rows`) are sent before COMMIT if nothing sent them yet: no row is ever
        left out of the transaction that planned it."""
        with self._txn() as cur:
            try:
                yield cur
                if self._group.cursor is cur and self._group.rows:
                    _insert_events(cur, self._group.rows, lookups=False, label=self._label)
            finally:
                if self._group.cursor is cur:
                    self._group.cursor = self._group.rows = None

    def _insert_rows(self, db: Any, rows: list[tuple[Any, ...]], held: Any, *, lookups: bool) -> None:
        """An append's new rows: several by one statement (:data:`_INSERT_EVENTS`); a group's
        (several runs' appends) held back and sent with its summaries' upsert, one statement for
        both (:meth:`_upsert_summaries`). Rows to blobs, a single row, or rows whose payloads are
        not bytes go as the dialect's ``insert`` does."""
        if held is not None or len(rows) < 2 or not all(_binary(r) for r in rows):
            super()._insert_rows(db, rows, held, lookups=lookups)
            return
        if not lookups and self._group.cursor is db:
            self._group.rows = rows
            return
        try:
            _insert_events(db, rows, lookups=lookups, label=self._label)
        finally:
            if self._group.cursor is db:
                self._group.rows = None

    def _after_lost(self, run_id: str, events: Sequence[StepEvent], epoch: int | None, expect_seq: int | None,
                    lost: _Lost, unheld: bool) -> list[StepEvent]:
        """The append again after a lost connection, looking up every key first: it is how the
        journal says whether the lost commit landed. If it did, every key is found and nothing is
        written again; if not, the rows are written now, once. A lost acknowledgement is never
        taken for a failure (a caller told "nothing was committed" could redo a step whose intent
        is durable). New connections are tried until ``connect_timeout_s`` (a server restarting);
        past it, :class:`ConnectionLost`."""
        why = str(lost)
        deadline = time.monotonic() + max(self._connect_timeout, 1)
        pause = 0.05
        while True:
            if self._pool is not None:
                try:
                    self._pool.check()  # drop the pool's other connections to a server that went away
                except Exception:
                    pass  # a server still down: the append below says so
            try:
                # The runs' locks may have died with the server (a restart ends every session): take
                # them all again (see _restart_grace). This run's taken by another worker meanwhile:
                # it may be running the step this write belongs to.
                lost_runs = [held for held in list(self._taken) if not self._lock_run(held)]
                if run_id in lost_runs:
                    raise ConnectionLost(f"journal {self.url}, run {run_id!r}: the connection was lost while "
                                         f"writing ({why}) and with it this worker's hold, which another worker "
                                         "has taken since; this worker stops (the journal says what landed)")
                return self._append(run_id, events, epoch, expect_seq, lookups=True)
            except (_Lost, psycopg.OperationalError) as exc:
                why = _first_line(exc)
            except _NoServer as exc:  # the pool waited for a connection already
                why, deadline = str(exc), 0.0
            if time.monotonic() + pause > deadline:
                raise ConnectionLost(f"journal {self.url}, run {run_id!r}: the connection was lost while writing "
                                     f"({why}), and the server has not answered since; whether the last write "
                                     "committed is unknown, so nothing may act on it: resume the run once the "
                                     "server is back (its journal says)")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _upsert_summaries(self, cur: psycopg.Cursor[Any], done: list[tuple[str, Checkpoint, float, Any]]) -> None:
        """A group's summaries in one statement (:data:`_UPSERT_RUNS`), each cached under the row
        version (``xmin``) the upsert returns for it."""
        params = ([r for r, _, _, _ in done], [cp.status for _, cp, _, _ in done], [cp.epoch for _, cp, _, _ in done],
                  [at for _, _, at, _ in done], [text for _, _, _, text in done])
        rows = self._group.rows if self._group.cursor is cur else None
        if rows:  # the group's rows, held back by _insert_rows: sent with the summaries
            self._group.rows = None
            try:
                xmins = dict(cur.execute(_INSERT_EVENTS_UPSERT_RUNS, (*_columns(rows), *params)).fetchall())
            except psycopg.errors.UniqueViolation:
                raise _Duplicate from None  # a stored key: the group goes batch by batch (see append_group)
        else:
            xmins = dict(cur.execute(_UPSERT_RUNS, params).fetchall())
        if set(xmins) != {r for r, _, _, _ in done}:
            raise JournalCorrupt(f"journal {self.url}: the database stored other summaries than the ones written")
        with self._cache_lock:
            for run_id, cp, _, _ in done:
                self._cache[run_id] = (str(xmins[run_id]), cp)

    def _group_summaries(self, cur: psycopg.Cursor[Any], runs: list[str]) -> dict[str, Checkpoint]:
        """:meth:`_locked_summary` of each of ``runs`` (distinct, in code-point order), in a few
        statements: every existing row locked by one (:data:`_LOCK_RUNS`), the summaries this
        store has not cached (or whose row another writer changed since) read by one more.

        A run with no row yet is taken as :meth:`_locked_summary` takes it (its creation lock,
        then its row looked up again), after the rows. If a locked row's run sorts after it, that
        is out of the order every writer locks in: the creation lock and the row are then only
        taken if free (held by another writer, the group fails and is appended batch by batch),
        so that this transaction never waits for a lock while holding a later one."""
        # This transaction is a group's: its rows may wait for its summaries (see _insert_rows).
        self._group.cursor, self._group.rows = cur, None
        found = {run_id: (epoch, xmin) for run_id, epoch, xmin in cur.execute(_LOCK_RUNS, (runs,)).fetchall()}
        out: dict[str, Checkpoint] = {}
        misses: dict[str, int] = {}
        for run_id in runs:
            if run_id not in found:
                continue
            epoch = checked_epoch(run_id, found[run_id][0])
            with self._cache_lock:  # taken out, not read (see _locked_summary)
                cached = self._cache.pop(run_id, None)
            if cached is not None and cached[0] == found[run_id][1]:
                cached[1].epoch = epoch
                out[run_id] = cached[1]
            else:
                misses[run_id] = epoch
        if misses:
            self._drop_keys(list(misses))
            texts = {r: text for r, _, text in cur.execute(self._dialect.summaries, (list(misses),)).fetchall()}
            for run_id, epoch in misses.items():
                cp = self._summary_of(cur, run_id, texts.get(run_id))
                cp.epoch = epoch
                out[run_id] = cp
        last = max(found) if found else None
        for run_id in runs:
            if run_id not in found:
                in_order = last is None or run_id > last  # no row locked after it
                out[run_id] = self._new_run_summary(cur, run_id, use_cache=True, wait=in_order)
        return out

    def _write_summary(self, cur: psycopg.Cursor[Any], run_id: str, epoch: int | None, *, fresh: bool,
                       unheld: bool) -> Checkpoint:
        """:meth:`_locked_summary`. ``unheld``: this store lost the run's lock and could not take it
        back (:meth:`_hold_lost`): with the run's row locked it is tried once more; if another holds
        the run now (its epoch moved, or its lock is another session's) nothing is written,
        :class:`FencedOut` or :class:`_HoldLost`."""
        cp = self._locked_summary(cur, run_id, use_cache=not fresh)
        if unheld:
            if epoch is not None and cp.epoch != epoch:
                raise FencedOut(run_id, epoch, cp.epoch)
            # The epoch is this worker's and the run's row is locked: nobody can take the run over
            # until this transaction ends, so the lock, if free now, is this worker's again.
            if not self._retake(run_id):
                raise _HoldLost(run_id, -1 if epoch is None else epoch, cp.epoch)
        return cp

    def _keep(self, run_id: str, cp: Checkpoint, upserted: psycopg.Cursor[Any], text: Any) -> None:
        xmin = _one(upserted)[0]  # the row version the upsert left
        with self._cache_lock:
            self._cache[run_id] = (xmin, cp)

    def _forget(self, run_ids: Iterable[str]) -> None:
        with self._cache_lock:
            for run_id in run_ids:
                self._cache.pop(run_id, None)

    def _locked_summary(self, cur: psycopg.Cursor[Any], run_id: str, *, use_cache: bool) -> Checkpoint:
        """The run's summary with its row locked for this transaction (or, for a run with no row
        yet, the run's creation lock taken), its epoch the column's."""
        row = cur.execute(_LOCK_RUN, (run_id,)).fetchone()
        if row is None:
            return self._new_run_summary(cur, run_id, use_cache=use_cache, wait=True)
        return self._summary(cur, run_id, row, use_cache=use_cache)

    def _new_run_summary(self, cur: psycopg.Cursor[Any], run_id: str, *, use_cache: bool,
                         wait: bool) -> Checkpoint:
        """:meth:`_locked_summary` of a run whose row was not there: nothing to lock yet, so
        serialise the run's creators, then look again (read committed: the new statement sees a
        row another creator committed while this one waited). Not ``wait``: the lock and the row
        only if free, else :class:`_Contended` (see :meth:`_group_summaries`)."""
        key = (_NEW_RUN_LOCK, _int4(self._journal_id + run_id))
        if wait:
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", key)
            row = cur.execute(_LOCK_RUN, (run_id,)).fetchone()
        else:
            if not _one(cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", key))[0]:
                raise _Contended(run_id)
            try:
                row = cur.execute(_LOCK_NEW_RUN_NOWAIT, (run_id,)).fetchone()
            except psycopg.errors.LockNotAvailable:
                raise _Contended(run_id) from None
        if row is None:
            self._drop_keys([run_id])  # a new run: a key cached for an earlier one of that id is not its own
            return Checkpoint(run_id=run_id)
        return self._summary(cur, run_id, row, use_cache=use_cache)

    def _summary(self, cur: psycopg.Cursor[Any], run_id: str, row: tuple[Any, ...], *,
                 use_cache: bool) -> Checkpoint:
        """The summary of a run whose row ``(epoch, xmin)`` this transaction has locked."""
        epoch = checked_epoch(run_id, row[0])
        with self._cache_lock:
            # Taken out, not read: this append folds events into it in place, and if it then
            # fails, its rollback frees the row before the entry could be dropped; a next writer
            # must not find a summary holding events that were never committed.
            cached = self._cache.pop(run_id, None)
        if use_cache and cached is not None and cached[0] == row[1]:
            cp = cached[1]  # the row is still the version this store wrote
        else:
            self._drop_keys([run_id])  # nor is its key vouched for (a run pruned and started again has another)
            text = _one(cur.execute("SELECT checkpoint FROM cuaderno_runs WHERE run_id=%s", (run_id,)))[0]
            cp = self._summary_of(cur, run_id, text)
        cp.epoch = epoch  # a takeover writes only the column
        return cp

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        """The run's summary (``None``: no such run), the schema checked by the same statement
        (:data:`_HEAD_CHECKED`), before anything read is decoded."""
        if not self._id_ok(run_id):
            return None
        with self._reader(run_id, check=False) as conn:
            version, epoch, text = _one(conn.execute(_HEAD_CHECKED, (run_id,)))
            _readable_schema(version)
            if epoch is None:
                return None
            cp = self._summary_of(conn, run_id, text)
            cp.epoch = checked_epoch(run_id, epoch)
            return cp

    @contextmanager
    def _reader(self, run_id: str, *, check: bool = True) -> Iterator[psycopg.Connection[Any]]:
        with self._reading(run_id), self._conn() as conn, reading(conn):
            if check:
                self._schema_of(conn)
            yield conn

    @contextmanager
    def _snapshot(self, run_id: str) -> Iterator[psycopg.Connection[Any]]:
        """A read transaction whose statements all see one snapshot (repeatable read), opened by
        one statement: ``conn.transaction()``'s BEGIN and then ``SET TRANSACTION`` took two round
        trips. It ends as the pool ends a connection's block: COMMIT when the block ends, ROLLBACK
        when it raises (nothing in it writes)."""
        with self._reading(run_id), self._conn() as conn, reading(conn):
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            self._schema_of(conn)
            yield conn

    # -- holding runs -----------------------------------------------------------------------------

    def acquire(self, run_id: str, owner: str, *, force: bool = False, open_only: bool = False) -> int:
        if not _storable(run_id):
            raise RunNotFound(run_id)
        took = False
        try:
            with self._txn() as cur:
                self._schema_of(cur)
                row = cur.execute("SELECT epoch, owner, status, checkpoint FROM cuaderno_runs WHERE run_id=%s FOR UPDATE",
                                  (run_id,)).fetchone()
                if row is None:
                    raise RunNotFound(run_id)
                if open_only and row[2] in CLOSED_STATUSES:  # before the lock: nothing to give back
                    raise RunClosed(run_id, row[2])
                # Taken with the run's row locked: two takers cannot both find the run free.
                held_before = run_id in self._locked
                took = self._lock_run(run_id) and not held_before
                holder = _lease.parse(row[1])
                if run_id not in self._locked and not force:
                    who = _lease.describe(holder) if holder is not None else "another worker"
                    raise RunBusy(run_id, f"{who}, whose connection to the journal is still open")
                server, up_s = _one(cur.execute("SELECT pg_postmaster_start_time()::text, "
                                                "extract(epoch FROM now() - pg_postmaster_start_time())::float8"))
                if not (held_before or force):
                    self._restart_grace(run_id, holder, server, float(up_s))
                mine = run_id in self._taken
                unsettled = self._unsettled(run_id, holder, row[3], force=force or mine)
                epoch = next_epoch(run_id, row[0])
                record = _lease.claim(owner, server=server, unsettled=unsettled)
                cur.execute("UPDATE cuaderno_runs SET epoch=%s, owner=%s WHERE run_id=%s", (epoch, record, run_id))
                with self._cache_lock:
                    self._cache.pop(run_id, None)
        except BaseException:
            if took:
                self._unlock_run(run_id)
            raise
        self._taken[run_id] = epoch
        self._records[run_id] = (epoch, record)
        if unsettled:
            self._earlier[run_id] = unsettled
        else:
            self._earlier.pop(run_id, None)
        return epoch

    @staticmethod
    def _unsettled(run_id: str, holder: _lease.Holder | None, summary: object, *,
                   force: bool) -> list[_lease.Holder]:
        """The earlier holders a takeover of the run must reckon with (R23): each one that had not
        let go and whose death this host cannot prove may still be executing a step whose intent
        it wrote, that is, one up to the run's last row when it was taken from it.

        Kept in every claim and through releases, so that a holder that dies (or lets go) before
        it settled such a step does not take the knowledge with it; dropped once provably gone.
        The holder taken from now is added unless it let go, is gone, or this store's own loops
        held it (they take turns), or ``force`` says it is stuck, not executing."""
        kept = [e for e in (holder or {}).get("unsettled") or []
                if isinstance(e, dict) and isinstance(e.get("process"), dict) and isinstance(e.get("seq"), int)
                and _lease.liveness(e) != "gone"]
        if holder is not None and holder.get("held") and not force and _lease.liveness(holder) != "gone":
            kept.append({"owner": holder.get("owner"), "process": holder["process"],
                         "seq": _loads(run_id, summary).last_seq})
        return kept[-8:]  # bounded: the most recent ones (older intents were settled since, or are among them)

    def earlier_holder(self, run_id: str, seq: int | None = None) -> dict[str, Any] | None:
        """An earlier holder of the run that may still be executing the step whose (first) intent
        is row ``seq`` (``None``: any step); ``None`` when none can be: each let the run go before
        anyone took it, or is provably gone (on this host, by the kernel), or the intent is newer
        than everything it wrote, or the takeover was forced. Earlier holders are kept across
        takeovers (see :meth:`_unsettled`): a taker that died before settling such a step does
        not make it safe.

        A holder's lock is a session the *server* may end while the holder lives
        (``pg_terminate_backend``, a server's or a proxy's timeout, a restart), so a free lock
        proves nothing about the holder. For a step whose intent it committed, a lookup that finds
        no effect then proves nothing either: the holder may be about to make the call. The loop
        takes such a step as uncertain (:mod:`cuaderno.loop._tool_steps`). Asked again each time:
        a holder on this host that has died since is gone."""
        for holder in reversed(self._earlier.get(run_id) or []):
            if seq is not None and seq > holder["seq"]:
                continue  # written after that holder lost the run: not its step
            state = _lease.liveness(holder)
            if state != "gone":
                return {"holder": _lease.describe(holder), "liveness": state, "its_rows_up_to": holder["seq"],
                        "why": "its lock session ended while it may still run (another host, or alive on this one): "
                               "a lookup that finds nothing does not prove that it will not make the call"}
        return None

    def release(self, run_id: str, epoch: int) -> None:
        if not _storable(run_id) or self._readonly:
            return
        if not self._release_known(run_id, epoch):
            with self._txn() as cur:
                row = cur.execute("SELECT epoch, owner FROM cuaderno_runs WHERE run_id=%s FOR UPDATE",
                                  (run_id,)).fetchone()
                if row is not None and row[0] == epoch:
                    cur.execute("UPDATE cuaderno_runs SET owner=%s WHERE run_id=%s AND epoch=%s",
                                (_lease.released(row[1]), run_id, epoch))
        # Released, or taken over since (with force): either way this store stops holding it, or
        # the run would look held until this store closed. After the commit, so that nobody
        # finds the run free while the row still names this holder.
        if self._taken.get(run_id) == epoch:
            del self._taken[run_id]
            self._earlier.pop(run_id, None)
            self._unlock_run(run_id)

    def _release_known(self, run_id: str, epoch: int) -> bool:
        """The release of a run this store took at ``epoch``, by one statement (its own
        transaction, committed before this returns) instead of four round trips (BEGIN, the row
        locked and read, the update, COMMIT): the holder record this store wrote at that epoch
        is known, so its released form is too. It is written only if the row still holds that
        very record at that epoch, which is what the locked read would have found (nobody
        changes the record without moving the epoch, except a release of it); ``False`` (nothing
        written) when the record is not known or the row holds another: the caller reads it."""
        known = self._records.pop(run_id, None)
        if known is None or known[0] != epoch:
            return False
        record = known[1]
        released = _lease.released(record)
        if released is None or released == record:
            return False
        with self._txn(single=True) as cur:
            cur.execute("UPDATE cuaderno_runs SET owner=%s WHERE run_id=%s AND epoch=%s AND owner=%s",
                        (released, run_id, epoch, record))
            return cur.rowcount == 1

    def _scrub(self, thorough: bool) -> tuple[bool, str]:
        """VACUUM the tables an erasure rewrote (events, runs, and the blobs it released), so that the old row versions (dead tuples,
        their TOAST chunks included) leave the table files; ``thorough``: VACUUM FULL, which
        writes each table into a new file and drops the old one (exclusive lock meanwhile). What
        neither reaches: the server's WAL (``pg_wal``, until its segments are recycled), its
        archive and replicas, and backups."""
        statement = ("VACUUM FULL cuaderno_events, cuaderno_runs, cuaderno_blobs, cuaderno_blob_refs" if thorough
                     else "VACUUM cuaderno_events, cuaderno_runs, cuaderno_blobs, cuaderno_blob_refs")
        try:
            with self._conn() as conn:
                conn.execute(statement)
        except psycopg.Error as exc:
            return False, f"{statement} failed ({_first_line(exc)}); run erase again"
        return True, f"{statement} done; the server's WAL and backups still hold the old rows until recycled"

    def close(self) -> None:
        if self._closed:
            return
        self._release_all()
        self._closed = True
        self._close_quietly()

    # -- SupportsClaims (what a worker polls) ----------------------------------------------------

    def holders(self, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The live holder of each run that has one (see
        :class:`~cuaderno.journal.base.SupportsClaims`): a run is held while some session holds its
        advisory lock (the server's ``pg_locks``; the lock ends with its holder's connection),
        and the holder is described from the journal's record."""
        wanted = [r for r in dict.fromkeys(run_ids) if _storable(r)]
        if not wanted:
            return {}
        keys = {self._lock_key(r): r for r in wanted}
        with self._reading("*"), self._conn() as conn:
            self._schema_of(conn)
            # A bigint advisory lock shows its key split in two: classid (high half), objid (low).
            locked = conn.execute("SELECT classid::bigint, objid::bigint, pid FROM pg_locks WHERE locktype = "
                                  "'advisory' AND objsubid = 1 AND granted AND database = (SELECT oid FROM "
                                  "pg_database WHERE datname = current_database())").fetchall()
            held: dict[str, int] = {}
            for high, low, pid in locked:
                key = int.from_bytes(((high << 32) | low).to_bytes(8, "big"), "big", signed=True)
                if key in keys:
                    held[keys[key]] = int(pid)
            if not held:
                return {}
            owners = dict(conn.execute("SELECT run_id, owner FROM cuaderno_runs WHERE run_id = ANY(%s)",
                                       (list(held),)).fetchall())
        found: dict[str, dict[str, Any]] = {}
        for run_id, backend in held.items():
            holder = _lease.parse(owners.get(run_id)) or {"owner": None, "process": {}}
            found[run_id] = {**holder, "backend_pid": backend}
        return found


class _GroupTxn(threading.local):
    """The cursor of the group transaction this thread is writing (``None``: none) and the rows
    it holds back to send with the group's summaries."""

    cursor: Any = None
    rows: list[tuple[Any, ...]] | None = None


def _insert_events(cur: psycopg.Cursor[Any], rows: list[tuple[Any, ...]], *, lookups: bool, label: str) -> None:
    """Several new rows by one statement (:data:`_INSERT_EVENTS`). A stored key: with ``lookups``
    (every key was looked up first) another writer's row committed since, a JournalError; without,
    :class:`~cuaderno.journal._rows.Duplicate` (the append is redone with lookups)."""
    try:
        cur.execute(_INSERT_EVENTS, _columns(rows))
    except psycopg.errors.UniqueViolation as exc:
        if lookups:
            raise JournalError(f"{label}: write failed, nothing was committed: {_first_line(exc)}") from None
        raise _Duplicate from None


def _binary(row: tuple[Any, ...]) -> bool:
    """Whether a new row's payload and digest key go in ``bytea`` arrays as they are (bytes, or no key)."""
    return isinstance(row[9], (bytes, bytearray, memoryview)) and (row[12] is None or isinstance(
        row[12], (bytes, bytearray, memoryview)))


def _columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """The new rows as the thirteen arrays of :data:`_INSERT_EVENTS`."""
    return [list(column) for column in zip(*rows, strict=True)]


class _Contended(Exception):
    """A group met a run another writer is creating (or locking) where waiting for it could
    deadlock (see ``_group_summaries``): the group is appended batch by batch instead."""


