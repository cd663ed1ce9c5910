"""SQLite's own side of :class:`~cuaderno.journal.sqlite.SqliteCheckpointer`: opening the file
(its -wal and -shm left as they are until the store writes), its identity and anchor, the schema
and its migrations (what SQLite's refusals mean is :mod:`cuaderno.journal._sqlite_errors`). The
journal algorithm itself is :mod:`cuaderno.journal._sql`; the file's durability settings are
described in :mod:`cuaderno.journal.sqlite`."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import NoReturn

from cuaderno import faults
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import (
    JournalCorrupt,
    JournalError,
    JournalLocked,
    JournalReplaced,
    RunNotFound,
    SchemaTooNew,
    UsageError,
)
from cuaderno.journal import _anchor, _lease, _offload, _queue_sql, _shm
from cuaderno.journal._paths import file_size
from cuaderno.journal._rows import schema_version as _schema_version
from cuaderno.journal._sealing import ENCRYPTION_META, KEYS_TABLE_SQLITE, Sealer, check_journal
from cuaderno.journal._sql import SQLITE, SQLITE_UNKEYED, Dialect
from cuaderno.journal._sqlite_errors import (
    errorname,
    index_half_written,
    locked,
    open_failure,
)
from cuaderno.journal.base import SCHEMA_VERSION

__all__ = ["SqliteFile"]


# Numbered, append-only: index i migrates schema i to i+1. Never edit an applied step.
_MIGRATIONS: list[tuple[str, ...]] = [
    (
        """CREATE TABLE cuaderno_events (
            run_id TEXT NOT NULL, step_id TEXT NOT NULL, phase TEXT NOT NULL,
            seq INTEGER NOT NULL, kind TEXT NOT NULL, name TEXT, decision TEXT, fingerprint TEXT,
            codec TEXT NOT NULL, payload BLOB NOT NULL, created_at REAL NOT NULL, row_hash TEXT NOT NULL,
            PRIMARY KEY (run_id, step_id, phase)
        )""",
        """CREATE TABLE cuaderno_runs (
            run_id TEXT PRIMARY KEY, status TEXT NOT NULL, epoch INTEGER NOT NULL, owner TEXT,
            updated_at REAL NOT NULL, checkpoint TEXT NOT NULL
        ) WITHOUT ROWID""",
        "CREATE INDEX cuaderno_runs_updated ON cuaderno_runs (updated_at)",
    ),
    # Schema 2: the same tables; a payload's codec may be ``json+zstd`` (compressed at rest). Only
    # the number changes, so that a cuaderno that reads schema 1 refuses the file (SchemaTooNew)
    # instead of taking a compressed row for a tampered one.
    (),
    # Schema 3 (the queue: cuaderno.flow): three tables of their own, read only by the
    # queue; the events and runs tables are unchanged. IF NOT EXISTS: an existing file is raised
    # only as far as its tables need (see _migrate), so these statements may run at every open.
    _queue_sql.SQLITE_TABLES,
    # Schema 4 (erasure): each row's digest key. A row with one chains over its keyed
    # content digest (row hash version 2), so that erasing its content (codec ``erased``, the
    # payload replaced by that digest, the key set to NULL) leaves a chain that still verifies.
    # Rows written before keep NULL and their version-1 hash. Taken by every open for writing (a
    # new row needs the column); a read-only store reads an older file as it is.
    ("ALTER TABLE cuaderno_events ADD COLUMN salt BLOB",),
    # Schema 5 (encryption at rest): each run's data key, wrapped by a master key (see
    # journal._sealing). IF NOT EXISTS: created by every open for writing; the number is raised
    # only by a store that encrypts (its rows and summaries, sealed, must be refused by a
    # cuaderno before this schema), so a plain journal stays readable by one.
    (KEYS_TABLE_SQLITE,),
    # Schema 6 (large payloads): payloads over the offload threshold, stored once per content in
    # chunks, and which runs use each (see cuaderno.journal._offload); rows refer to them with
    # the storage codec ``json+blob``. IF NOT EXISTS: created by every open for writing; the number
    # is raised only by the first transaction that writes an offloaded row (see sqlite.py's
    # _inserted), as schema 2 was by compression: a journal without large payloads stays readable
    # by a cuaderno of schema 4 (or 5, when encrypted), and one with them is refused by it (it
    # would take a reference for damage).
    _offload.BLOB_TABLES_SQLITE,
    # Schema 7 (large payloads under encryption): an encrypted run's blob is its own, addressed
    # by a digest keyed with its data key and sealed chunk by chunk (see journal._offload); its
    # rows have the storage codec ``json+blob+aesgcm``. No table changes: the number is raised
    # only by the first transaction that writes such a row (sqlite.py's _inserted), so that a
    # cuaderno of schema 6, which would take the keyed reference or a sealed chunk for damage,
    # refuses the file instead.
    (),
    # Schema 8 (keyed BLAKE2b digests): a new row's content digest is keyed BLAKE2b under a
    # 32-byte key, where rows of schema 4 to 7 hold HMAC-SHA256 under a 16-byte one (the key's
    # length says which, see cuaderno.events.content_digest; both stay readable). No table
    # changes: the number is raised only by the first transaction that writes such a row
    # (sqlite.py's _inserted), so that a cuaderno of schema 7, which would take the longer key
    # for damage, refuses the file instead.
    (),
]

assert len(_MIGRATIONS) == SCHEMA_VERSION

_COMPRESSED_SINCE = 2
"""The schema from which rows may be compressed (``json+zstd``)."""

_KEYED_SINCE = 4
"""The schema from which the events table has the ``salt`` column: rows may be keyed or erased."""

_SEALED_SINCE = 5
"""The schema from which rows and summaries may be sealed (encryption at rest, ``cuaderno_keys``)."""

_OFFLOADED_SINCE = 6
"""The schema from which rows may refer to blobs (``json+blob``, see :mod:`._offload`)."""

_SEALED_BLOB_SINCE = 7
"""The schema from which an encrypted run's rows may refer to its sealed blobs (``json+blob+aesgcm``)."""

_BLAKE_KEYED_SINCE = 8
"""The schema from which rows may hold keyed BLAKE2b digests (32-byte keys, see
:func:`cuaderno.events.content_digest`)."""


_READ_AS_IS_FROM = 1
"""The oldest schema whose files this cuaderno reads without migrating them (a read-only store
cannot migrate): up to schema 2 only the codecs grew, and every older codec is still read."""


_ON_OFF = {True: "on", False: "off"}


_META_NOW = ("SELECT (SELECT value FROM cuaderno_meta WHERE key='schema_version'), "
             "(SELECT value FROM cuaderno_meta WHERE key='encryption'), "
             "(SELECT value FROM cuaderno_meta WHERE key='compress'), "
             "EXISTS (SELECT 1 FROM sqlite_master WHERE type='table' AND name='cuaderno_keys')")
"""What :meth:`SqliteFile._follow_meta` depends on, in one statement: the schema version, the
encryption record, the compression setting (each ``None`` when not recorded), and whether the keys
table exists (with the meta table, which this reads, what ``check_journal`` asks for)."""

def _compressing(choice: bool | None, setting: object, path: str) -> bool:
    """Whether a store compresses: its own ``choice``, else the journal's recorded ``setting``
    (``None``: none recorded, compressed).

    Raises:
        JournalCorrupt: a setting that is neither ``on`` nor ``off``.
    """
    if choice is not None:
        return choice
    if setting is None:
        return True  # compressed, if nobody said
    if setting not in ("on", "off"):
        raise JournalCorrupt(f"{path!r}: the journal's compress setting is {setting!r:.40}, not 'on' or 'off'")
    return bool(setting == "on")


_UNREAD = object()
"""``_schema_of``'s default: it reads the schema version itself."""

_WAL_HEADER = 32
"""Bytes of a -wal's header; its frames (the commits in it) follow it."""

_STALE_MAX = 4096
"""The most summaries kept across other connections' commits (``SqliteFile._stale``): beyond it
they are dropped, and the next append of each run parses its summary again."""


def _read_only(path: str, busy_timeout_ms: float, step_aside: Callable[[], bool], *,
               wait_for_rebuild: bool = True) -> tuple[sqlite3.Connection, _shm.Keeper | None]:
    """:func:`_read_only_once`, waiting (up to ``busy_timeout_ms``) while SQLite's index of the
    -wal is half-written (:func:`index_half_written`): the next write of a process that has the
    journal open rebuilds it, and no read-only connection can."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    pause = 0.005
    while True:
        try:
            return _read_only_once(path, busy_timeout_ms, step_aside)
        except sqlite3.Error as exc:
            if not (wait_for_rebuild and index_half_written(exc)) or time.monotonic() >= deadline:
                raise
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.1)


def _read_only_once(path: str, busy_timeout_ms: float,
                    step_aside: Callable[[], bool]) -> tuple[sqlite3.Connection, _shm.Keeper | None]:
    """A connection that cannot change the file or its -wal (``mode=ro``: it never folds the -wal
    in), and, when it also leaves the -shm as it is, its registration with :mod:`._shm` (through
    which a writer this process opens later asks it to ``step_aside``).

    It does (``readonly_shm``) when a -shm is there: SQLite then reads the -wal itself when no live
    connection keeps the -shm (a private index, in memory), and uses the -shm when one does. Except
    when that cannot read the journal: a -wal that holds its header and no frame (a process killed
    after it started a new -wal and before its first commit reached it), with no live connection,
    is read by SQLite (3.40) into a private index that lacks the header's salt, which it then finds
    different from the file's, every time: after about 10 s of retries it gives up with
    ``SQLITE_PROTOCOL``, so such a journal could never be opened. Then, and whenever a first read
    through ``readonly_shm`` meets ``SQLITE_PROTOCOL``, the connection is opened without it: SQLite
    rebuilds the -shm from the -wal (when no live connection keeps it; one that does keeps it valid,
    and it is used as it is), under its own locks, as every reader of the file does. The database
    file and the -wal are still never written.
    """
    uri = f"{Path(path).resolve().as_uri()}?mode=ro"
    # Not while a writer of this process has the file: SQLite would map the -shm read-only for it
    # too (see _shm), and that writer keeps the -shm current anyway.
    keeper = _shm.Keeper.register(path, step_aside) if file_size(path + "-shm") > 0 and \
        file_size(path + "-wal") != _WAL_HEADER else None
    if keeper is not None:
        db = _connect_uri(uri + "&readonly_shm=1", busy_timeout_ms)
        try:
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # its first read transaction
            return db, keeper
        except BaseException as exc:
            db.close()
            keeper.release()
            if not (isinstance(exc, sqlite3.Error) and errorname(exc).startswith("SQLITE_PROTOCOL")):
                raise
    return _connect_uri(uri, busy_timeout_ms), None


def _connect_uri(uri: str, busy_timeout_ms: float) -> sqlite3.Connection:
    return sqlite3.connect(uri, uri=True, timeout=int(busy_timeout_ms) / 1000, isolation_level=None,
                           check_same_thread=False)


@contextmanager
def _read_txn(db: sqlite3.Connection) -> Iterator[None]:
    """One read transaction (statements in it see one snapshot)."""
    db.execute("BEGIN")
    try:
        yield
    finally:
        db.execute("COMMIT")


def _compress_setting(db: sqlite3.Connection) -> str | None:
    """The journal's recorded compression setting, as stored (``None`` if nobody set one)."""
    row = db.execute("SELECT value FROM cuaderno_meta WHERE key='compress'").fetchone()
    return None if row is None else str(row[0])


class SqliteFile:
    """The file, connection and schema handling a SQLite store is built on (a mixin)."""

    path: str
    _readonly: bool
    _create: bool
    _closed: bool
    _compress_choice: bool | None
    _compress: bool
    _file_schema: int
    _dialect: Dialect
    _accept_rollback: bool
    _ident: _lease.Identity | None
    _anchor: _anchor.Anchor | None
    _hot_wal: bool
    _lock: threading.RLock
    _cache: dict[str, Checkpoint]
    _taken: dict[str, int]
    _data_version: int | None
    _writer: tuple[str, float, bool | None] | None
    _busy_timeout_ms: float
    _keeper: _shm.Keeper | None = None
    """Set while the connection is a read-only one that leaves the -shm as it is (``readonly_shm``):
    its registration with :mod:`._shm`. Before each read it is checked that SQLite can still read
    the -wal that way (see _reading)."""
    _release_writer: Callable[[], None] | None = None
    """Set while the connection is the writer: tells :mod:`._shm` when it closes."""
    _db: sqlite3.Connection
    _index_unread: bool
    _sealer: Sealer | None
    _mark: tuple[int, str] | None = None
    """The rowid and row hash of the last row the open append transaction inserted (the anchor's)."""
    _bump = 0
    """The schema an append's transaction raised the file to (0: none), recorded after its commit."""
    _meta_seen: tuple[object, ...] | None = None
    """The meta rows (:data:`_META_NOW`) the last ``_follow_meta`` derived the schema, the key check
    and the compression setting from: the same rows again are not derived again."""
    """Whether the open append transaction raised the file's schema (its first compressed row)."""

    def _connect(self, on_disk: bool, synchronous: str, busy_timeout_ms: float, compress: bool | None) -> None:
        """Open the store's connection on the file as it is now (see ``__init__``); on a failure
        the caller closes what was opened."""
        fresh = not on_disk or file_size(self.path) == 0
        if fresh and self._create and self._anchor is not None:
            self._anchor.reset()  # a journal created anew at this path: what was seen at it is gone
        self._hot_wal = on_disk and not fresh and file_size(self.path + "-wal") > 0
        """A -wal with commits in it was there at open: a store that writes nothing must not fold it."""
        # Reentrant: the first write of a store that opened on a read-only connection swaps in the
        # writer while holding it (so no other thread of the store can use the read-only or the
        # closed connection meanwhile: two threads writing at once right after a SIGKILL left a
        # -wal got "attempt to write a readonly database" and "Cannot operate on a closed
        # database"), and opening the writer migrates in a transaction of its own.
        self._lock = threading.RLock()
        # Checkpoints this connection wrote last, keyed by run, so an append does not read back and
        # decode the row it wrote itself. Inside every write transaction (under the write lock) the
        # cache is dropped if any other connection has committed since this one last wrote:
        # SQLite's data_version changes exactly then, without reading any row.
        self._cache: dict[str, Checkpoint] = {}
        self._kept: dict[str, object] = {}
        """The stored text of each summary in ``_cache``, as the append that cached it wrote it."""
        self._stale: dict[str, tuple[object, Checkpoint]] = {}
        """Summaries dropped from ``_cache`` because another connection committed, with their text:
        an append that reads its run's row and finds that very text uses the summary as it is
        instead of parsing the text again (the other connection wrote other runs)."""
        self._taken: dict[str, int] = {}
        """Runs this store took over (acquire) and has not released, with their epochs."""
        self._data_version: int | None = None
        self._writer: tuple[str, float, bool | None] | None = None
        """Set while a store that opened on a -wal with commits reads on a read-only connection:
        how to open the writer at its first write."""
        self._busy_timeout_ms = busy_timeout_ms
        self._keeper = None
        # Under the lock until the connection is open: a writer this process opens meanwhile (see
        # _shm) waits for it before it asks it to step aside.
        with self._lock:
            self._open_first(synchronous, busy_timeout_ms, compress)

    def _open_first(self, synchronous: str, busy_timeout_ms: float, compress: bool | None) -> None:
        try:
            # timeout= is sqlite3_busy_timeout: no PRAGMA built from a value (R12).
            if self._readonly:
                # mode=ro: SQLite itself refuses every write, so no code path here can change the file.
                self._db, self._keeper = _read_only(self.path, busy_timeout_ms, self._step_aside)
                self._bind_file()
                self._refuse_newer_schema(older_too=True)
                self._refuse_without_key(self._db)
                self._accept_rollback = self._accept_rollback or not self._check_anchor()
                return
            if self._hot_wal:
                # A -wal with commits in it: every check at open, and every read until this store
                # first writes, on a connection that can neither fold the -wal into the file nor
                # rebuild the -shm (a refused command leaves all three as they were, but for a
                # -shm SQLite cannot read the -wal without rebuilding: see _read_only).
                try:
                    self._db, self._keeper = _read_only(self.path, busy_timeout_ms, self._step_aside,
                                                        wait_for_rebuild=False)
                except sqlite3.Error as exc:
                    if not index_half_written(exc):
                        raise
                    # A writer died while it updated the -shm, and only a connection that may write
                    # rebuilds it (from the -wal, which stays as it is): this store may, so its
                    # writer opens now rather than wait for another process's next write.
                    self._open_writer(synchronous, busy_timeout_ms, compress)
                    return
                self._bind_file()
                self._refuse_newer_schema()
                self._refuse_without_key(self._db)
                self._check_anchor()
                if self._reads_as_is(compress):
                    self._compress = self._follow_meta(self._db)
                    self._writer = (synchronous, busy_timeout_ms, compress)
                    return
                self._close_connection()  # opening writes (tables, a migration, a setting): the writer does it now
            self._open_writer(synchronous, busy_timeout_ms, compress)
        except sqlite3.OperationalError:
            raise  # the caller retries an open race, or names the failure
        except sqlite3.DatabaseError as exc:
            self._close_quietly()
            raise open_failure(self.path, exc, busy_timeout_ms) from exc
        except BaseException:
            self._close_quietly()
            raise

    def _open_writer(self, synchronous: str, busy_timeout_ms: float, compress: bool | None) -> None:
        """Open the connection that writes (at open, or at the first write of a store that opened
        on a -wal with commits in it), checking and migrating the file."""
        on_disk = self.path != ":memory:"
        release = _shm.writer(self.path, busy_timeout_ms / 1000) if on_disk else None
        try:
            self._db = sqlite3.connect(self.path, timeout=int(busy_timeout_ms) / 1000, isolation_level=None,
                                       check_same_thread=False)
        except BaseException:
            if release is not None:
                release()
            raise
        self._release_writer = release
        self._bind_file()
        self._refuse_newer_schema()  # before anything (even the WAL switch) touches the file
        self._refuse_without_key(self._db)
        rolled_back = not self._check_anchor()
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if self.path != ":memory:" and mode != "wal":
            raise JournalError(f"could not put {self.path!r} in WAL mode (got {mode!r})")
        self._db.execute("PRAGMA synchronous=FULL" if synchronous == "FULL" else "PRAGMA synchronous=NORMAL")
        self._compress = self._migrate(compress)
        if rolled_back and self._anchor is not None:  # accepted: the journal as it is is the new mark
            with self._lock:
                mark = _anchor.last_row(self._db)
            if mark is None:
                self._anchor.reset()
            else:
                self._anchor.write(*mark)

    def _reads_as_is(self, compress: bool | None) -> bool:
        """Whether opening the file writes nothing: a journal with its tables and schema record
        whose compression setting is the one this store asks for (or it asks for none)."""
        db = self._db
        if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='cuaderno_runs'").fetchone() is None:
            return False
        if db.execute("SELECT 1 FROM cuaderno_meta WHERE key='schema_version'").fetchone() is None:
            return False
        return compress is None or _compress_setting(db) == _ON_OFF[compress]

    def _start_writing(self) -> None:
        """Swap the read-only connection a store opened with for the writer, once (see __init__);
        under the store's lock, which the caller holds."""
        with self._lock:
            pending, self._writer = self._writer, None
            if pending is None:
                return
            if self._closed:
                raise UsageError(f"journal {self.path!r} was closed; open a new SqliteCheckpointer")
            self._close_connection()
            try:
                self._open_writer(*pending)
            except sqlite3.DatabaseError as exc:
                raise open_failure(self.path, exc, pending[1]) from exc

    def _bind_file(self) -> None:
        """Record which file this store opened (at its first connection), or check that a later
        connection (the writer, opened at the first write) opened that same one."""
        if self.path == ":memory:":
            return
        now = _lease.identity(self.path)
        if self._ident is None:
            self._ident = now
        elif now != self._ident:
            self._replaced(now)

    def _check_file(self) -> None:
        """Inside a write transaction: the path still names the file this store opened. A file
        moved aside or replaced under a live store would take rows nobody reads any more (its
        holder's results, say), while the file at the path lacks them."""
        if self._ident is not None and _lease.identity(self.path) != self._ident:
            self._replaced(_lease.identity(self.path))

    def _replaced(self, now: _lease.Identity | None) -> NoReturn:
        what = "deleted" if now is None else "replaced by another file"
        raise JournalReplaced(f"journal {self.path!r} was {what} since this store opened it; nothing was written "
                              "(open the journal again to work on the file now there)")

    def _check_anchor(self) -> bool:
        """Whether the journal still holds the last row this machine committed to it; refuses it
        (:class:`~cuaderno.journal._anchor.JournalRolledBack`) unless ``accept_rollback``."""
        db = self._db
        if self._anchor is None:
            return True
        mark = self._anchor.read()  # before the read transaction below begins
        if mark is None:
            return True
        try:
            with _read_txn(db):
                # No events table under an anchor: the file lost even its tables (a -wal deleted
                # before the first checkpoint), not a journal created anew (that one starts empty).
                has_events = db.execute(
                    "SELECT 1 FROM sqlite_master WHERE type='table' AND name='cuaderno_events'").fetchone()
                _anchor.check(db if has_events else None, self.path, mark)
        except _anchor.JournalRolledBack:
            if not self._accept_rollback:
                raise
            return False
        return True

    def _refuse_newer_schema(self, *, older_too: bool = False) -> None:
        db = self._db
        has_meta = db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='cuaderno_meta'").fetchone()
        if has_meta is None:
            if not self._create:  # before the WAL switch: another application's file stays as it was
                raise JournalError(f"{self.path!r} is not a cuaderno journal (no cuaderno tables); nothing was "
                                   "changed")
            return
        row = db.execute("SELECT value FROM cuaderno_meta WHERE key='schema_version'").fetchone()
        if row is None and not self._create:
            raise JournalCorrupt(f"{self.path!r} has a cuaderno_meta table without a schema version")
        version = _schema_version(row[0]) if row is not None else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(version, SCHEMA_VERSION)
        if older_too and version < _READ_AS_IS_FROM:
            raise JournalError(f"{self.path!r} has journal schema {version}; this cuaderno reads {SCHEMA_VERSION}. "
                               "Open it once for writing to migrate it; nothing was changed")

    def _refuse_without_key(self, db: sqlite3.Connection) -> None:
        """An encrypted journal and no key, or a wrong key: refused before anything is written
        (see :func:`~cuaderno.journal._sealing.check_journal`)."""
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name IN "
                                           "('cuaderno_meta', 'cuaderno_keys')").fetchall()}
        if self._sealer is not None:
            self._sealer.has_table = "cuaderno_keys" in tables
        check_journal(db, self._sealer, f"journal {self.path!r}", has_tables=len(tables) == 2)

    def _migrate(self, compress: bool | None) -> bool:
        """Create or migrate the schema; return whether this store compresses payloads."""
        with self._txn() as db:
            has_meta = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='cuaderno_meta'").fetchone()
            if has_meta is None:
                others = db.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'cuaderno_%'").fetchone()[0]
                if others:
                    raise JournalCorrupt(f"{self.path!r} has cuaderno tables but no schema record")
                db.execute("CREATE TABLE cuaderno_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")
                version = 0
            else:
                version = self._schema_of(db)
            for step in _MIGRATIONS[version:]:
                for statement in step:
                    db.execute(statement)
            # A new file starts at the current schema. An existing one is raised only as far as its
            # tables need; the step to schema 2 is taken by the first transaction that writes a
            # compressed row (see _append), so that opening a file, a refused command, or a
            # journal kept plain leaves it readable by a cuaderno of schema 1.
            # Schema 4 is taken at once: every new row is keyed, and its column must be there.
            target = SCHEMA_VERSION if version == 0 else max(version, _READ_AS_IS_FROM, _KEYED_SINCE)
            if self._sealer is not None:
                # Encrypting: recorded in the file, so that a store without the key refuses it,
                # and the schema raised, so that a cuaderno that cannot open sealed rows does.
                target = max(target, _SEALED_SINCE)
                db.execute("INSERT OR IGNORE INTO cuaderno_meta (key, value) VALUES (?, 'aesgcm')", (ENCRYPTION_META,))
                self._sealer.has_table = True
            if version < target:
                db.execute("INSERT OR REPLACE INTO cuaderno_meta (key, value) VALUES ('schema_version', ?)",
                           (str(target),))
            # Whether payloads are compressed is the journal's setting, so that every writer (the
            # CLI's included) keeps to what the owner chose; a store that says nothing follows it.
            if compress is not None and _compress_setting(db) != _ON_OFF[compress]:
                db.execute("INSERT OR REPLACE INTO cuaderno_meta (key, value) VALUES ('compress', ?)",
                           (_ON_OFF[compress],))
            compressing = self._follow_meta(db)
            faults.point("open.M1")  # tables, schema and setting written, before COMMIT
        faults.point("open.M2")  # after the commit
        return compressing

    def _schema_of(self, db: sqlite3.Connection, recorded: object = _UNREAD) -> int:
        """The file's schema version (0 if it records none), refusing one newer than this
        cuaderno: also checked on every read and lease write, since a newer cuaderno may have
        migrated the file while this store had it open (its rows may not read as this version
        expects: schema 1 took compressed rows for tampered ones). ``recorded``: the
        ``schema_version`` row's value as the caller read it (``None``: no row)."""
        if recorded is _UNREAD:
            row = db.execute("SELECT value FROM cuaderno_meta WHERE key='schema_version'").fetchone()
            recorded = None if row is None else row[0]
        version = _schema_version(recorded) if recorded is not None else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(version, SCHEMA_VERSION)
        # A file before schema 4 (read by a read-only store, which cannot migrate it) has no
        # ``salt`` column: its rows are read as the first chain version's.
        self._dialect = SQLITE if version >= _KEYED_SINCE or version == 0 else SQLITE_UNKEYED
        return version

    def _follow_meta(self, db: sqlite3.Connection) -> bool:
        """Read the file's schema and compression setting again (another connection may have
        changed them since this store opened); return whether this store compresses.

        One statement reads every meta row this depends on (:data:`_META_NOW`); when they are the
        ones the last call derived its answer from, nothing is derived again (what it refused
        then, it refuses now, and what it accepted it accepts): after every other process's
        commit, a fleet's stores would otherwise run three or four statements each.

        Raises:
            SchemaTooNew: a newer cuaderno migrated the file while this store had it open.
            KeyMissing: encryption turned on by another store since this one opened (keyless).
            JournalCorrupt: a compression setting that is neither ``on`` nor ``off``.
        """
        meta: tuple[object, ...] = db.execute(_META_NOW).fetchone()
        if meta == self._meta_seen:
            return self._compress
        self._file_schema = self._schema_of(db, meta[0])
        if self._sealer is None and meta[1] is not None and meta[3]:
            self._refuse_without_key(db)  # turned on by another store since this one opened
        compressing = _compressing(self._compress_choice, meta[2], self.path)
        self._meta_seen = meta
        return compressing

    @contextmanager
    def _txn(self, *, append: bool = False) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` on the one connection, committed when the block ends. ``append``:
        an append's transaction (:meth:`_write_txn`): this store's cache made current first (see
        :meth:`_fresh`); after the commit, the schema it raised and the anchor of its last row,
        still under the store's lock, so the mark the anchor records is this transaction's."""
        if self._readonly:
            raise UsageError(f"journal {self.path!r} was opened read-only; nothing was written")
        with self._lock:
            if self._writer is not None:
                self._start_writing()
            db = self._db
            if append:
                self._mark, self._bump = None, 0
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    self._check_file()  # under the write lock: no row lands in a file moved aside
                    version = self._fresh(db) if append else None
                    with _offload.reading(db):
                        yield db
                    if version is not None:
                        self._data_version = version
                    db.execute("COMMIT")
                except BaseException:
                    # Perhaps read by _follow_meta as this transaction wrote them (a migration):
                    # rows that were never committed are no answer to remember.
                    self._meta_seen = None
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                self._refuse_if_closed(exc)
                if locked(exc):  # another connection kept the write lock past the busy timeout
                    raise JournalLocked(f"journal {self.path!r}: write failed, nothing was committed: another "
                                        f"connection held the journal's lock ({exc}); try again") from exc
                # Disk full, I/O error: nothing of this transaction was committed.
                raise JournalError(f"journal {self.path!r}: write failed, nothing was committed: {exc}") from exc
            if not append:
                return
            if self._bump:
                self._file_schema = self._bump  # committed
                self._meta_seen = None  # derived from a schema record this transaction changed
            if self._mark is not None and self._anchor is not None:
                self._anchor.write(*self._mark)  # after the commit: the anchor may lag the journal, never lead it

    def _write_txn(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._txn(append=True)

    def _fresh(self, db: sqlite3.Connection) -> int:
        """Inside a write transaction: drop what this store cached if another connection committed
        since it last wrote; return the data version to record once this transaction is written."""
        version: int = db.execute("PRAGMA data_version").fetchone()[0]
        if version != self._data_version:
            # Another connection committed: any cached row may be stale. Each summary is kept
            # with the text this connection stored, and used again only where the row still
            # holds that text (SQLite has no row version to tell it without reading the row):
            # with several processes on one file, nearly every append finds another's commit
            # since its own, and would otherwise parse its run's summary again each time.
            if len(self._stale) > _STALE_MAX:
                self._stale.clear()
            kept = self._kept
            for run_id, cp in self._cache.items():
                text = kept.get(run_id)
                if text is not None:
                    self._stale[run_id] = (text, cp)
            self._cache.clear()
            kept.clear()
            if self._sealer is not None:
                self._sealer.forget_all()  # and any run's key (a run pruned and started again has another)
            self._compress = self._follow_meta(db)  # and perhaps the schema, or the setting
        return version

    @contextmanager
    def _reading(self, run_id: str) -> Iterator[None]:
        """Turn damage found while reading into JournalCorrupt (the file is never touched), and a
        lock that kept the read from happening into JournalLocked (the file is in use, not damaged)."""
        try:
            self._keep_index_readable()
            yield
        except (JournalCorrupt, RunNotFound):
            raise
        except sqlite3.OperationalError as exc:
            self._refuse_if_closed(exc)
            if not locked(exc):
                raise JournalCorrupt(f"journal {self.path!r}, run {run_id!r}: unreadable (OperationalError: {exc}); "
                                     "the file was not changed") from exc
            if errorname(exc).startswith("SQLITE_PROTOCOL") or index_half_written(exc):
                self._index_unread = True  # the next read reopens the connection, rebuilding SQLite's index
            raise JournalLocked(f"journal {self.path!r}, run {run_id!r}: another connection's lock kept it from being "
                                f"read ({exc}, {errorname(exc)}); the file was not changed; try again") from exc
        except (sqlite3.DatabaseError, ValueError, TypeError, KeyError, UnicodeError) as exc:
            if isinstance(exc, sqlite3.Error):
                self._refuse_if_closed(exc)
            raise JournalCorrupt(f"journal {self.path!r}, run {run_id!r}: unreadable ({type(exc).__name__}: {exc}); "
                                 "the file was not changed") from exc

    _index_unread = False
    """A read through ``readonly_shm`` met SQLITE_PROTOCOL, or a read-only read met a half-written
    -shm: the next one reopens the connection (a writable store's is its writer)."""

    def _keep_index_readable(self) -> None:
        """Before a read on a connection that leaves the -shm as it is: if the -wal now holds only
        its header (a process was killed right after it started a new -wal), or the last read met
        SQLITE_PROTOCOL, reopen it as a read-only connection that rebuilds the -shm (see
        :func:`_read_only`); SQLite would otherwise refuse every read for as long as no other
        connection keeps the -shm. The new connection must open the same file (JournalReplaced)."""
        if self._index_unread and self._writer is not None:
            # A writable store still on its read-only connection met a half-written -shm: its
            # writer rebuilds that index, where a read-only connection would wait for another's.
            self._index_unread = False
            self._start_writing()
            return
        if not self._keeper is not None or not (self._index_unread or file_size(self.path + "-wal") == _WAL_HEADER):
            return
        with self._lock:
            if not self._keeper is not None or self._closed:
                return
            self._index_unread = False
            self._reopen_reader()

    def _reopen_reader(self) -> None:
        """Under the store's lock: a new read-only connection in place of the one that keeps the
        -shm as it is (which may be one again, see _read_only), on the same file (JournalReplaced)."""
        fresh, keeper = _read_only(self.path, self._busy_timeout_ms, self._step_aside)
        if _lease.identity(self.path) != self._ident:
            fresh.close()  # keep the connection to the file this store opened
            if keeper is not None:
                keeper.release()
            self._replaced(_lease.identity(self.path))
        self._close_connection()
        self._db, self._keeper = fresh, keeper

    def _close_connection(self) -> None:
        """Close the read-only connection (closing it folds nothing) and drop its registration."""
        keeper, self._keeper = self._keeper, None
        try:
            self._db.close()
        finally:
            if keeper is not None:
                keeper.release()

    def _step_aside(self) -> bool:
        """Asked by a writer this process is opening on the file (:mod:`._shm`), from its thread:
        give up the connection that keeps the -shm read-only, now, unless the store is busy with it
        (false: the writer asks again). The new connection (plain read-only, since a writer is
        opening) maps the -shm writable, as the writer needs."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._keeper is None or self._closed:
                return True
            try:
                self._reopen_reader()
            except Exception:
                # The file changed under the store (replaced, unreadable): the writer must not
                # wait for it, and the store's next read reopens its connection and says so.
                assert self._keeper is not None
                try:
                    self._db.close()
                finally:
                    self._keeper.release()
                self._index_unread = True
            return True
        finally:
            self._lock.release()

    def _close_db(self) -> None:
        """Close the connection; when it found a -wal with commits in it and wrote nothing, without
        folding that -wal into the database file. SQLite folds it when the last connection to the
        file closes, so a read-only connection holds the file open meanwhile: a refused command
        (and any command that only read) leaves the file and its -wal as they were."""
        witness, witness_keeper = None, None
        if self._hot_wal and not self._readonly and self._writer is None and self._db.total_changes == 0:
            try:
                # Busy (never steps aside) for the few statements it lives.
                witness, witness_keeper = _read_only(self.path, 0, lambda: False)
                witness.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()  # takes its shared lock
            except sqlite3.Error:
                pass
        release, self._release_writer = self._release_writer, None
        try:
            self._close_connection()
        finally:
            if release is not None:
                release()
            if witness is not None:
                witness.close()  # read-only: it cannot fold the -wal either
            if witness_keeper is not None:
                witness_keeper.release()

    def _refuse_if_closed(self, exc: sqlite3.Error) -> None:
        if self._closed:  # a usage error, not damage to the file
            raise UsageError(f"journal {self.path!r} was closed; open a new SqliteCheckpointer") from exc

    def _close_quietly(self) -> None:
        try:
            self._close_db()
        except Exception:
            pass
        if self._anchor is not None:
            self._anchor.close()

