"""PostgreSQL's own side of :class:`~cuaderno.journal.postgres.PostgresCheckpointer`: its
connections (the pool, and the lock session kept apart from it), the schema and its migrations,
the runs' advisory locks, and noticing that the server ended the lock session (R23). Why each
is as it is: :mod:`cuaderno.journal.postgres`. The journal algorithm itself is
:mod:`cuaderno.journal._sql`."""

from __future__ import annotations

import hashlib
import select
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from cuaderno import faults
from cuaderno.errors import (
    FencedOut,
    JournalCorrupt,
    JournalError,
    JournalRolledBack,
    RunBusy,
    SchemaTooNew,
    UsageError,
    quoted,
)
from cuaderno.journal import _lease, _offload, _queue_sql
from cuaderno.journal._anchor import INCARNATION_META
from cuaderno.journal._offload import reading
from cuaderno.journal._rows import checked_epoch, schema_version
from cuaderno.journal._sealing import ENCRYPTION_META, KEYS_TABLE_PG, Sealer, check_journal
from cuaderno.journal._sql_write import Lost as _Lost
from cuaderno.journal._sql_write import first_line as _first_line

__all__ = ["SCHEMA_VERSION", "PgServer"]


# Numbered, append-only: index i migrates version i to i+1, and version i+1 is recorded in
# cuaderno_migrations in the same transaction. Never edit an applied step; add one.
_MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE cuaderno_events (
            run_id TEXT NOT NULL, step_id TEXT NOT NULL, phase TEXT NOT NULL,
            seq BIGINT NOT NULL, kind TEXT NOT NULL, name TEXT, decision TEXT, fingerprint TEXT,
            codec TEXT NOT NULL, payload BYTEA NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            row_hash TEXT NOT NULL,
            PRIMARY KEY (run_id, step_id, phase)
        )""",
        """CREATE TABLE cuaderno_runs (
            run_id TEXT PRIMARY KEY, status TEXT NOT NULL, epoch BIGINT NOT NULL, owner TEXT,
            updated_at DOUBLE PRECISION NOT NULL, checkpoint TEXT NOT NULL
        )""",
        "CREATE INDEX cuaderno_runs_updated ON cuaderno_runs (updated_at)",
        "CREATE TABLE cuaderno_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        # The journal's identity: run locks are keyed on it, so that two journals in one database
        # (two schemas) never share a run's lock.
        "INSERT INTO cuaderno_meta (key, value) VALUES ('journal_id', md5(random()::text || clock_timestamp()::text))",
    ),
    # The queue (cuaderno.flow): submitted runs, idempotency keys and concurrency limits,
    # three tables of their own; the events and runs tables are unchanged.
    _queue_sql.PG_TABLES,
    # Version 3 (erasure): each row's digest key. A row with one chains over its keyed
    # content digest (row hash version 2), so that erasing its content (codec ``erased``, the
    # payload replaced by that digest, the key set to NULL) leaves a chain that still verifies.
    # Rows written before keep NULL and their version-1 hash.
    ("ALTER TABLE cuaderno_events ADD COLUMN salt BYTEA",),
    # Version 4 (encryption at rest): each run's data key, wrapped by a master key (see
    # journal._sealing); empty in a journal that is not encrypted.
    (KEYS_TABLE_PG,),
    # Version 5 (large payloads): payloads over the offload threshold, stored once per content
    # in chunks, and which runs use each (see cuaderno.journal._offload); rows refer to them
    # with the storage codec ``json+blob``.
    _offload.BLOB_TABLES_PG,
    # Version 6 (large payloads under encryption): an encrypted run's blob is its own, keyed and
    # sealed (see cuaderno.journal._offload; rows with the storage codec ``json+blob+aesgcm``).
    # No table changes: the number is what makes a cuaderno of version 5, which would take such
    # a row for damage, refuse the journal.
    (),
    # Version 7 (keyed BLAKE2b digests): a new row's content digest is keyed BLAKE2b under a
    # 32-byte key, where rows of versions 3 to 6 hold HMAC-SHA256 under a 16-byte one (the key's
    # length says which, see cuaderno.events.content_digest; both stay readable). No table
    # changes: the number is what makes a cuaderno of version 6, which would take the longer key
    # for damage, refuse the journal.
    (),
]


SCHEMA_VERSION = len(_MIGRATIONS)
"""The schema this cuaderno writes in PostgreSQL (this dialect's own count)."""


_MIGRATE_LOCK = 0x6D696772  # "migr"


_ON_OFF = {True: "on", False: "off"}


class _HoldLost(FencedOut):
    """This store lost the run's lock (the server ended its lock session) and another session
    holds it now, but the epoch has not moved (yet): this worker stops driving the run, as if
    fenced out, without writing anything more for it."""

    def __init__(self, run_id: str, epoch: int, current: int) -> None:
        super().__init__(run_id, epoch, current)
        JournalError.__init__(self, f"run {quoted(run_id)}: this worker's lock on it was lost (the server ended its "
                                    "lock session) and another session holds it now; stopping, nothing more was "
                                    "written")


class _NoServer(JournalError):
    """The pool found no connection to the server in its wait."""


def _idle_alive(conn: psycopg.Connection[Any]) -> None:
    """The pool's check of a connection it is about to hand out, without a round trip.

    A pooled connection is idle: nothing may be waiting on its socket (its queries' answers were
    all read, and nothing here LISTENs). When the server ends a session (a restart, a crash,
    ``pg_terminate_backend``, an idle timeout) it sends its goodbye to the idle socket, and libpq
    notices only at the next query, which would then fail. Raising here makes the pool drop that
    connection and hand out another (or open a new one), so a read after a restart is answered
    instead of failing once per stale connection. A message that is not a goodbye costs only a
    new connection."""
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    if select.select([conn.pgconn.socket], [], [], 0)[0]:
        conn.close()  # closed, the pool replaces it (one it takes back open, it would hand out again)
        raise psycopg.OperationalError("the server sent something to an idle connection (it ended the session)")


@contextmanager
def _in_transaction(conn: psycopg.Connection[Any], on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    with conn.transaction():
        yield


def _readable_schema(recorded: object) -> int:
    """The schema version ``max(version)`` of ``cuaderno_migrations`` read (``None``: none recorded,
    0), refusing one newer than this cuaderno's (:class:`SchemaTooNew`)."""
    version = 0 if recorded is None else schema_version(recorded)
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(version, SCHEMA_VERSION)
    return version


def _int4(text: str) -> int:
    """A signed 32-bit key from text (the two-key advisory lock form)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:4], "big", signed=True)


def _one(cur: psycopg.Cursor[Any]) -> Any:
    """The one row a statement returns (every caller's statement returns exactly one)."""
    row = cur.fetchone()
    if row is None:
        raise JournalCorrupt("the journal's database returned no row where one is always returned")
    return row



class PgServer:
    """The connections, schema and run locks a PostgreSQL store is built on (a mixin)."""

    _conninfo: str
    url: str
    schema: str | None
    _readonly: bool
    _accept_rollback: bool
    _create: bool
    _sealer: Sealer | None
    _keepalive: int
    _connect_timeout: int
    _closed: bool
    _taken: dict[str, int]
    _records: dict[str, tuple[int, str]]
    _locked: set[str]
    _holds: psycopg.Connection[Any] | None
    _holds_lock: threading.Lock
    _pool: ConnectionPool[psycopg.Connection[Any]] | None
    _journal_id: str

    def _connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": self._connect_timeout}
        return kwargs

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Every connection: durable commits, this journal's schema, read-only when asked; never
        ended by the server for idling (the pool closes its own idle connections, ``max_idle``):
        a short ``idle_session_timeout`` ends pooled sessions faster than the pool replaces them,
        and a write then waits for a connection until it gives up."""
        conn.execute("SET synchronous_commit TO on")
        if conn.info.server_version >= 140000:  # idle_session_timeout is PostgreSQL 14's
            conn.execute("SET idle_session_timeout TO 0")
        if self.schema is not None:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        if self._readonly:
            conn.execute("SET default_transaction_read_only TO on")

    def _connect(self, *, holds: bool = False) -> psycopg.Connection[Any]:
        kwargs = self._connect_kwargs()
        if holds:
            # This side notices a dead server (or a path that went away) too, not only the server
            # a dead client: the lock connection's socket then reports an error (see _hold_lost).
            k = self._keepalive
            kwargs.update(keepalives=1, keepalives_idle=k, keepalives_interval=k, keepalives_count=3)
        conn = psycopg.connect(self._conninfo, **kwargs)
        try:
            conn.execute("SET synchronous_commit TO on")
            if self.schema is not None:
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[Any]]:
        if self._closed or self._pool is None:
            raise UsageError(f"journal {self.url} was closed; open a new PostgresCheckpointer")
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout as exc:
            raise _NoServer(f"journal {self.url}: no connection to the server ({exc}); nothing was committed") from None

    @contextmanager
    def _txn(self, *, single: bool = False) -> Iterator[psycopg.Cursor[Any]]:
        """A write transaction on a pooled connection, committed when the block ends. ``single``:
        the block sends one statement, which is its own transaction (the pool's connections
        are in autocommit: no BEGIN and COMMIT round trips), committed before it returns."""
        if self._readonly:
            raise UsageError(f"journal {self.url} was opened read-only; nothing was written")
        conn: psycopg.Connection[Any] | None = None
        try:
            with self._conn() as conn, _in_transaction(conn, not single), conn.cursor() as cur, reading(cur):
                yield cur
        except (psycopg.errors.UniqueViolation, psycopg.errors.SerializationFailure):
            raise
        except psycopg.Error as exc:
            if conn is not None and (conn.broken or conn.closed):
                # The connection died: perhaps after the server committed, before its reply came
                # back (R19). Whether it landed is for the journal to say (see _after_lost).
                raise _Lost(f"journal {self.url}: the connection was lost during a write ({_first_line(exc)}); "
                            "whether it committed is unknown until the journal is read again") from None
            # A full disk, a constraint, a refused statement: the transaction did not commit.
            raise JournalError(f"journal {self.url}: write failed, nothing was committed: {_first_line(exc)}") from None

    def _migrate(self, conn: psycopg.Connection[Any], compress: bool | None) -> tuple[str, bool]:
        """Check, create or migrate the schema; return the journal's id and whether to compress."""
        with conn.transaction():
            if not self._readonly:
                # Two workers opening one new database at once: one creates, the other waits and reads.
                conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_MIGRATE_LOCK, _int4(self.schema or "")))
            exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)).fetchone()
            tables = _one(conn.execute("SELECT to_regclass('cuaderno_migrations') IS NOT NULL, count(*) FROM pg_tables "
                                  "WHERE schemaname = %s AND tablename LIKE 'cuaderno\\_%%'",
                                  (self.schema,))) if exists else (False, 0)
            if not tables[0]:
                if not self._create:
                    raise JournalError(f"{self.url} (schema {self.schema!r}) is not a cuaderno journal (no cuaderno "
                                       "tables); nothing was changed")
                if tables[1]:
                    raise JournalCorrupt(f"{self.url} (schema {self.schema!r}) has cuaderno tables but no migration "
                                         "record; nothing was changed")
                if not exists:
                    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema or "")))
                conn.execute("CREATE TABLE cuaderno_migrations (version INTEGER PRIMARY KEY, "
                             "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
                version = 0
            else:
                version = self._schema_of(conn)
                if self._readonly and version < SCHEMA_VERSION:
                    raise JournalError(f"{self.url} has journal schema {version}; this cuaderno reads "
                                       f"{SCHEMA_VERSION}. Open it once for writing to migrate it; nothing was changed")
            for number, step in enumerate(_MIGRATIONS[version:], start=version + 1):
                for statement in step:
                    conn.execute(statement)  # constant SQL of this module
                conn.execute("INSERT INTO cuaderno_migrations (version) VALUES (%s)", (number,))
            # An encrypted journal without a key, or a wrong key: refused here, and the
            # transaction (migrations included) rolled back: nothing was written.
            check_journal(conn, self._sealer, f"journal {self.url}", has_tables=True)
            if self._sealer is not None and not self._readonly:
                conn.execute("INSERT INTO cuaderno_meta (key, value) VALUES (%s, 'aesgcm') ON CONFLICT (key) "
                             "DO NOTHING", (ENCRYPTION_META,))
            if compress is not None and not self._readonly:
                conn.execute("INSERT INTO cuaderno_meta (key, value) VALUES ('compress', %s) ON CONFLICT (key) "
                             "DO UPDATE SET value = excluded.value", (_ON_OFF[compress],))
            meta = dict(conn.execute("SELECT key, value FROM cuaderno_meta").fetchall())
            self._check_incarnation(conn, meta.get(INCARNATION_META))
            faults.point("open.M1")
        faults.point("open.M2")
        setting = meta.get("compress")
        if setting not in (None, "on", "off"):
            raise JournalCorrupt(f"{self.url}: the journal's compress setting is {setting!r:.40}, not 'on' or 'off'")
        if "journal_id" not in meta:
            raise JournalCorrupt(f"{self.url}: the journal records no id (cuaderno_meta); nothing was changed")
        return str(meta["journal_id"]), setting != "off"

    def _check_incarnation(self, conn: psycopg.Connection[Any], seen: str | None) -> None:
        """Inside the open's transaction: refuse a journal whose tables are not the ones it
        recorded (:data:`INCARNATION_META`) unless ``accept_rollback``; record them when it
        recorded none (a journal created, or first opened by this cuaderno, for writing).

        What it catches: a ``pg_restore`` of a ``pg_dump`` (into this database, ``--clean``, or
        a new one) creates the tables anew, with new object ids, and restores the rows, this
        record included: the ids differ, and resuming from the dump would repeat the effects its
        runs made after it was taken. Dumps and restores keep every row; only the tables'
        identity tells. A journal restored before any cuaderno recorded its tables cannot be told
        from the original (say so with ``cuaderno mark-restored``). Read-only stores read it as
        it is (reading repeats nothing), as SQLite's do a rolled-back file."""
        now = str(_one(conn.execute("SELECT to_regclass('cuaderno_events')::oid::bigint"))[0])
        if seen is None:
            if not self._readonly:
                conn.execute("INSERT INTO cuaderno_meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
                             (INCARNATION_META, now))
            return
        if seen == now or self._readonly or self._accept_rollback:
            return
        raise JournalRolledBack(
            f"journal {self.url} (schema {self.schema!r}): its tables were created anew since this journal last "
            "recorded them (a pg_restore of a dump, or a copy of the journal): its runs may have gone on after the "
            "dump, and resuming them from it would repeat effects that already happened. Nothing was changed. Say "
            "what happens to them before any worker starts: cuaderno mark-restored --runs-after-backup "
            "needs-human|accept (or open the journal with accept_rollback=True)", path=self.url)

    def _schema_of(self, conn: psycopg.Connection[Any] | psycopg.Cursor[Any]) -> int:
        """The recorded schema version, refusing one newer than this cuaderno's."""
        row = conn.execute("SELECT max(version) FROM cuaderno_migrations").fetchone()
        return _readable_schema(None if row is None else row[0])

    @contextmanager
    def _reading(self, run_id: str) -> Iterator[None]:
        """Damage found while reading is JournalCorrupt; a server that cannot answer, JournalError."""
        try:
            yield
        except (JournalError, UsageError):
            raise
        except psycopg.Error as exc:
            raise JournalError(f"journal {self.url}, run {run_id!r}: read failed: {_first_line(exc)}") from None
        except (ValueError, TypeError, KeyError, UnicodeError) as exc:
            raise JournalCorrupt(f"journal {self.url}, run {run_id!r}: unreadable ({type(exc).__name__}: {exc}); "
                                 "nothing was changed") from exc

    def _hold_lost(self, run_ids: Sequence[str]) -> set[str]:
        """Of ``run_ids`` (runs a write with an epoch is for), those this store took over and whose
        lock it has lost and cannot take back (R23): another session holds it, or the lock
        connection cannot be opened again. Empty when the lock connection is intact, which is
        known without a round trip: an idle session the server ended (``pg_terminate_backend``,
        an idle timeout, a shutdown) or whose socket failed has something to read.

        A lost lock connection lost every run's lock: all of this store's runs are taken back
        at once (``pg_try_advisory_lock``). One taken back is safe to write for: whoever took it
        meanwhile bumped its epoch (refused by the write's own check), and from now on nobody
        can take it. One not taken back belongs to someone else; its writes are refused. A server
        that does not answer (restarting) is asked again until ``connect_timeout_s``."""
        mine = [r for r in run_ids if r in self._taken]
        if not mine:
            return set()
        with self._holds_lock:
            if self._holds_intact(mine):
                return set()
            self._drop_holds()
        deadline = time.monotonic() + max(self._connect_timeout, 1)
        pause = 0.05
        while True:
            try:
                return {held for held in list(self._taken) if not self._lock_run(held)}.intersection(mine)
            except psycopg.Error:
                if time.monotonic() + pause > deadline:
                    return set(mine)  # no lock connection: nothing proves this worker holds the run
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _retake(self, run_id: str) -> bool:
        """Take the run's lock back now (``False``: another session holds it, or no server)."""
        try:
            return self._lock_run(run_id)
        except psycopg.Error:
            return False

    def _holds_intact(self, runs: Sequence[str]) -> bool:
        """Whether the lock connection is open, has nothing to read, and holds ``runs``."""
        conn = self._holds
        if conn is None or conn.closed or conn.broken or any(r not in self._locked for r in runs):
            return False
        try:
            return not select.select([conn.pgconn.socket], [], [], 0)[0]
        except (OSError, ValueError, psycopg.Error):
            return False

    def confirm_hold(self, run_id: str, epoch: int | None) -> None:
        """Raise :class:`FencedOut` unless this store still holds ``run_id`` at ``epoch``: called
        just before an effect's body starts, after its intent is durable, so that a worker whose
        lock session the server ended meanwhile (and that cannot take it back) starts no body
        (R23). One poll of the lock connection's socket when the lock is intact; no round trip."""
        lost = self._moved(run_id, epoch)
        if lost is not None:
            raise lost

    def _moved(self, run_id: str, epoch: int | None) -> FencedOut | None:
        """After a commit for a run this store holds: if its lock connection went meanwhile, the
        lock is taken back, and the error to raise if someone else has the run now (its epoch
        moved, or its lock is another session's); ``None`` when this worker still holds it."""
        if epoch is None or run_id not in self._taken:
            return None
        with self._holds_lock:
            if self._holds_intact([run_id]):
                return None
        lost = run_id in self._hold_lost([run_id])
        current = epoch
        try:
            with self._conn() as conn:
                row = conn.execute("SELECT epoch FROM cuaderno_runs WHERE run_id=%s", (run_id,)).fetchone()
            if row is not None:
                current = checked_epoch(run_id, row[0])
        except (psycopg.Error, JournalError):
            lost = True  # the server does not answer: nothing proves this worker still holds the run
        if current != epoch:
            return FencedOut(run_id, epoch, current)
        return _HoldLost(run_id, epoch, current) if lost else None

    def _restart_grace(self, run_id: str, holder: _lease.Holder | None, server: str, up_s: float) -> None:
        """The run's lock was free, but a server restart ends every session's locks, the living
        holders' too: a holder that took the run before the server last started may be inside a
        step (a tool body) and has not written since, so it had no chance to take its lock again.
        It keeps the run until ``dead_peer_after_s`` after the start (as long as a dead peer's
        lock would have lasted); a holder alive by then has taken its lock again at its next
        write (see :meth:`_after_lost`), and one that has not is taken for dead. So a step that
        outlasts a restart by more than that (a tool body without a write) may be taken over, as
        with a holder whose connection the server dropped: its next write is then FencedOut, and
        the taker, which cannot prove that holder dead, takes its step in flight as uncertain when
        the lookup finds nothing (:meth:`earlier_holder`), never sends it again."""
        if holder is None or not holder.get("held") or holder.get("server") in (None, server):
            return
        grace = 3 * self._keepalive
        if up_s < grace:
            raise RunBusy(run_id, f"{_lease.describe(holder)}, whose lock the server's restart {up_s:.0f} s ago "
                                  f"ended; it has {grace - up_s:.0f} s more to take it again")

    _keep_holds = False
    """Keep the lock connection open while no run is held (a worker's store, set by its queue's
    claims: it takes runs again and again, and would otherwise open the connection again for
    nearly every claim). Closed with the store."""

    def _lock_key(self, run_id: str) -> int:
        digest = hashlib.sha256(f"{self._journal_id}\x00{run_id}".encode("utf-8", "surrogatepass")).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def _lock_run(self, run_id: str) -> bool:
        """Take the run's advisory lock on this store's lock connection; ``False``: someone holds it."""
        with self._holds_lock:
            for attempt in (1, 2):
                conn = self._holds_connection()
                try:
                    if run_id in self._locked:  # held already (locks stack): is the connection still alive?
                        conn.execute("SELECT 1")
                        return True
                    got = _one(conn.execute("SELECT pg_try_advisory_lock(%s)", (self._lock_key(run_id),)))[0]
                except psycopg.OperationalError:
                    # The lock connection died (and with it every lock it held): open a new one.
                    self._drop_holds()
                    if attempt == 2:
                        raise
                    continue
                if got:
                    self._locked.add(run_id)
                return bool(got)
        return False  # not reached

    def _unlock_run(self, run_id: str) -> None:
        with self._holds_lock:
            if run_id not in self._locked:
                return
            self._locked.discard(run_id)
            if self._holds is None:
                return
            try:
                self._holds.execute("SELECT pg_advisory_unlock(%s)", (self._lock_key(run_id),))
            except psycopg.Error:
                self._drop_holds()  # a dead connection holds nothing any more
            if not self._locked and not self._keep_holds:
                self._drop_holds()  # nothing held: no connection kept open for it

    def _holds_connection(self) -> psycopg.Connection[Any]:
        if self._holds is not None and not self._holds.closed and not self._holds.broken:
            return self._holds
        self._drop_holds()
        conn = self._connect(holds=True)
        try:
            # The server drops a vanished host's locks once keepalives go unanswered.
            k = str(self._keepalive)
            conn.execute("SELECT set_config('tcp_keepalives_idle', %s, false), "
                         "set_config('tcp_keepalives_interval', %s, false), "
                         "set_config('tcp_keepalives_count', '3', false), set_config('tcp_user_timeout', %s, false)",
                         (k, k, str(3 * self._keepalive * 1000)))
            # A live holder's lock session sits idle while its steps run (a tool body, a model
            # call): no server or role setting may end it for that. An ended lock session frees
            # the run for another worker while this one may be inside a step (R23). Set on this
            # session, over whatever the server, database or role says.
            conn.execute("SELECT set_config('idle_in_transaction_session_timeout', '0', false), "
                         "set_config('statement_timeout', '0', false), set_config('lock_timeout', '0', false)")
            if conn.info.server_version >= 140000:  # idle_session_timeout is PostgreSQL 14's
                conn.execute("SELECT set_config('idle_session_timeout', '0', false)")
            conn.execute("SELECT set_config('application_name', %s, false)", (f"cuaderno-holds-{self.schema}",))
        except BaseException:
            conn.close()
            raise
        self._holds = conn
        return conn

    def _drop_holds(self) -> None:
        conn, self._holds = self._holds, None
        self._locked.clear()
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def holder_pid(self) -> int | None:
        """The server process of this store's lock connection (``None``: it holds no run): what
        ``pg_terminate_backend`` ends to simulate this holder's death."""
        with self._holds_lock:
            if self._holds is None or self._holds.closed or not self._locked:
                return None
            return int(self._holds.info.backend_pid)

    def _close_quietly(self) -> None:
        with self._holds_lock:
            self._drop_holds()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                pool.close()
            except Exception:
                pass

