"""The embedded default journal: one SQLite file.

Durability settings, and why:

- ``journal_mode=WAL`` so readers (the CLI, another resumer) never block the writer;
- ``synchronous=FULL`` so every acknowledged commit survives a power cut. With WAL, NORMAL may
  roll back the last commits after power loss, which would lose an intent that was already acted
  on; it is only available through an explicit ``synchronous="NORMAL"`` opt-in;
- ``BEGIN IMMEDIATE`` so the write lock is taken before reading the checkpoint: two processes
  can never both read the same ``last_seq`` and race (the fencing check runs under that lock);
- ``busy_timeout`` so a second process waits for the lock instead of failing at once.

The events table's primary key is ``(run_id, step_id, phase)``: the dedup key is a constraint of
the table, not a check two processes could race. It is an ordinary rowid table (rows stored in
insertion order, which is ``seq`` order) rather than ``WITHOUT ROWID``: the latter keeps rows in
index b-tree cells, whose local payload limit (about 1 KB at 4 KB pages) sends every larger model
response or tool result to overflow pages; measured at 2 KB payloads the file was 2.1x the payload
bytes with ``WITHOUT ROWID`` and 1.4x without.

Leaf pages hold whole rows, so the file shrinks only when a smaller row lets one more row fit on
a page. Measured on the benchmark's 1000-turn run (400-byte tool results, 4,004 rows, 1.63x the
payload bytes): storing fingerprints and row hashes as binary instead of hex removed 196 KB of
row content, yet the file stayed at exactly the same size at 4 KB pages: each leaf still holds
eight rows (two turns), and the space left on it (514 bytes instead of 116, measured with
``dbstat``) is still less than the next row, which is a model response or a tool result. The
table alone is then 1.50x the payload; the primary-key index adds 33 pages (0.10x). With 8 KB or
16 KB pages it came to 1.53x, and an 8 KB page makes every commit about 18% slower. Without
binary hashes, larger pages made the file bigger (1.65x at 8 KB, 1.69x at 16 KB), and smaller
ones did not help (the same journal rebuilt with VACUUM: 1.61x at 2 KB and at 4 KB, 2.37x at
1 KB). So a storage change that only narrows columns is not worth a schema version.

What does shrink rows is compressing the payloads themselves (the default; see
:mod:`cuaderno.journal._compress`). The same run with English-like text instead of a repeated
character: 1.63x uncompressed, 1.33x compressed (ten rows fit a leaf where eight did), and with
2 KB tool results 1.44x against 0.85x. Random base64 does not compress enough to change the
pages: 1.63x either way.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import (
    JournalCorrupt,
    JournalReplaced,
    RunBusy,
    RunClosed,
    RunNotFound,
    UsageError,
)
from cuaderno.events import SALT_BYTES
from cuaderno.journal import _anchor, _claims, _lease, _shm
from cuaderno.journal._compress import CODEC_JSON_ZSTD
from cuaderno.journal._erase import SqlEraser
from cuaderno.journal._offload import CODEC_JSON_BLOB, CODEC_SEALED_BLOB, reading
from cuaderno.journal._rows import checked_epoch as _epoch
from cuaderno.journal._sealing import Sealer
from cuaderno.journal._sql import SQLITE
from cuaderno.journal._sql_write import next_epoch
from cuaderno.journal._sqlite_errors import OPEN_RACE_S as _OPEN_RACE_S
from cuaderno.journal._sqlite_errors import open_failure as _open_failure
from cuaderno.journal._sqlite_errors import open_race as _open_race
from cuaderno.journal._sqlite_file import (
    _BLAKE_KEYED_SINCE,
    _COMPRESSED_SINCE,
    _OFFLOADED_SINCE,
    _SEALED_BLOB_SINCE,
    SqliteFile,
    _read_txn,
)
from cuaderno.journal.base import CLOSED_STATUSES, SCHEMA_VERSION
from cuaderno.journal.keys import KeyProvider

__all__ = ["SqliteCheckpointer"]


_COLUMNS = "run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, row_hash"
"""The events table's columns, in the order of every statement of :data:`SQLITE` that names them
(``benchmarks/bench_step_parts.py`` replays the inserts with it)."""
_UPSERT_RUN = SQLITE.upsert_run
"""The checkpoint write of every append (``benchmarks/bench_step_parts.py`` replays it as it is)."""


_JSON_EACH: bool | None = None
"""What :func:`_json_each` found, once it was asked (``None`` before)."""


def _json_each() -> bool:
    """Whether this SQLite has ``json_each`` (built in since 3.38, unless compiled without JSON;
    an option before): what a group's read of several summaries in one statement needs. Probed
    on the first such read, not on import, then kept."""
    global _JSON_EACH
    if _JSON_EACH is None:
        probe = sqlite3.connect(":memory:")
        try:
            probe.execute("SELECT value FROM json_each('[]')").close()
            _JSON_EACH = True
        except sqlite3.OperationalError:
            _JSON_EACH = False
        finally:
            probe.close()
    return _JSON_EACH


class SqliteCheckpointer(SqliteFile, SqlEraser):
    """A :class:`~cuaderno.journal.base.Checkpointer` in one SQLite file.

    Args:
        path: the database file (created if missing) or ``":memory:"``.
        synchronous: ``"FULL"`` (default). ``"NORMAL"`` trades the last commits before a power
            cut for speed; it must be asked for explicitly because an intent lost that way may
            already have been acted on.
        busy_timeout_ms: how long to wait for another process's write lock.
        create: ``False`` opens only an existing cuaderno journal: any other SQLite file is
            refused (:class:`~cuaderno.errors.JournalError`) before anything in it is changed.
        readonly: open for reading only (``load``, ``checkpoint``, ``list_runs``): the file is
            never changed, not even its journal mode, and every write is refused with a
            :class:`~cuaderno.errors.UsageError`. Implies ``create=False``. Reads every schema
            since the tables last changed (schema 1) as it is; an older one is refused (opening it
            for writing migrates it), and so is a newer one (:class:`~cuaderno.errors.SchemaTooNew`).
        compress: whether payloads of 256 bytes and more are compressed as they are written
            (codec ``json+zstd`` in the row; see :mod:`cuaderno.journal._compress`): a model
            response or tool result of a few KB takes about half the space, a short one two
            thirds. It is the journal's setting:
            ``True`` or ``False`` records it in the file (the last store to say so wins) and
            this store keeps to it; a store opened with ``None`` (the default) follows what the
            file says, also when it changes while the store is open (compressed, if nobody
            said). So ``compress=False`` keeps later writes plain JSON, readable with SQLite's
            own JSON functions, by every writer that does not say otherwise (the ``cuaderno``
            CLI included). Reading is the same either way, and one journal may hold both forms.
            Ignored when ``readonly``.
        accept_rollback: open a journal that is older than the last one this machine saw at this
            path (an older copy restored, a hot ``-wal`` deleted or truncated; see
            :mod:`cuaderno.journal._anchor`), which is otherwise refused at open and at every
            ``load`` with :class:`~cuaderno.journal._anchor.JournalRolledBack`. The runs then go on
            from the steps the journal holds, and effects done after them are done again: say so
            only for a rollback you made on purpose. A writable store records the journal as it
            is now as the new high-water mark.
        keys: encrypt at rest (see :mod:`cuaderno.journal._sealing`): a
            :class:`~cuaderno.journal.keys.KeyProvider` whose current master key wraps each run's
            data key. A writable store records in the file that it is encrypted (schema 5); from
            then on, opening it without a key is refused with :class:`~cuaderno.errors.KeyMissing`
            and with a provider lacking a master key its data keys need with
            :class:`~cuaderno.errors.KeyInvalid`, before anything is read or written. Rows written
            before stay as they were, and read.

    Refusals leave the files as they were. SQLite folds a ``-wal`` into the database file when the
    last connection to it closes, so a store that finds a ``-wal`` with commits in it at open (a
    process was killed, another one is running, or a ``-wal`` was put beside the file) checks the
    file, and reads, on a connection that cannot write (``mode=ro``; ``readonly_shm`` when a
    ``-shm`` is there, so that not even SQLite's index of the ``-wal`` is rebuilt) until its first
    write; and one that opened its writer but committed nothing closes while a read-only
    connection still holds the file, which keeps SQLite from folding the ``-wal`` in.

    One exception, for the ``-shm`` only: a ``-wal`` that holds its header and no frame (a process
    killed after it started a new ``-wal`` and before its first commit reached it) cannot be read
    through ``readonly_shm`` while no other process has the journal open (SQLite gives up with
    ``SQLITE_PROTOCOL``), and neither can any ``-wal`` where SQLite meets that error. Such a store
    reads on a read-only connection that lets SQLite rebuild the ``-shm`` from the ``-wal`` (under
    SQLite's own locks; a ``-shm`` a live process keeps is used as it is): the database file and the
    ``-wal`` are still left byte-identical, the ``-shm`` may be rewritten. That needs write access
    to the ``-shm``; without it the open is refused with
    :class:`~cuaderno.errors.JournalLocked`. A lock that keeps an open or a read out
    (``SQLITE_BUSY``, ``SQLITE_LOCKED``, ``SQLITE_PROTOCOL``) is always
    :class:`~cuaderno.errors.JournalLocked`, never :class:`~cuaderno.errors.JournalCorrupt`.

    And one more: a writer killed while it updated the ``-shm``'s header, while other processes
    keep the journal open, leaves an index only a connection that may write can rebuild (SQLite's
    ``SQLITE_READONLY_RECOVERY``). A writable store then opens its writer at once (rebuilding the
    ``-shm`` from the ``-wal``, which stays as it is); a read-only one waits up to its busy timeout
    for a live writer's next write to rebuild it, and is otherwise refused with
    :class:`~cuaderno.errors.JournalLocked`.
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: Literal["FULL", "NORMAL"] = "FULL",
                 busy_timeout_ms: int = 30_000, create: bool = True, readonly: bool = False,
                 compress: bool | None = None, accept_rollback: bool = False,
                 keys: KeyProvider | None = None) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise UsageError("synchronous must be 'FULL' or 'NORMAL'")
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise UsageError(f"the journal path must be a file path or ':memory:', got {path!r:.80}")
        if compress is not None and not isinstance(compress, bool):
            raise UsageError(f"compress must be True, False or None, got {compress!r:.40}")
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, (int, float)) or busy_timeout_ms < 0:
            raise UsageError("busy_timeout_ms must be a number of milliseconds")
        self.path = str(path)
        self._sealer = None if keys is None else Sealer(keys, "?")
        self._label = f"journal {self.path!r}"
        self._readonly = bool(readonly) and self.path != ":memory:"
        self._create = create and not self._readonly
        self._closed = False
        self._compress_choice = compress
        self._compress = False
        self._file_schema = SCHEMA_VERSION
        """The schema the file is at, as this store last saw it (1 until a compressed row is written)."""
        if self.path != ":memory:" and Path(self.path).is_dir():
            raise UsageError(f"{self.path!r} is a directory, not a journal file")
        if not isinstance(accept_rollback, bool):
            raise UsageError(f"accept_rollback must be True or False, got {accept_rollback!r:.40}")
        self._accept_rollback = accept_rollback
        on_disk = self.path != ":memory:"
        self._ident: _lease.Identity | None = None
        """The journal file this store opened (``st_dev``, ``st_ino``): every write checks that the
        path still names it (R22)."""
        if on_disk:
            # Before anything is created or written (the anchor below, the tables): a second name
            # for the file, or a file that replaced one whose runs a live process holds, is refused.
            _lease.refuse_second_names(self.path)
            if not self._readonly:
                _lease.check_journal(self.path, _lease.identity(self.path))
        self._anchor = _anchor.Anchor(self.path) if on_disk else None
        # Several processes opening a new journal at the same moment (workers started together)
        # race its creation: one may see the -wal another just made before that one's -shm is
        # there (SQLITE_CANTOPEN on the read-only connection), or meet the other's switch to WAL,
        # which SQLite refuses without waiting (SQLITE_BUSY on journal_mode). Both pass within
        # milliseconds; the open is retried (from the file as it then is) for a bounded time.
        deadline = time.monotonic() + min(busy_timeout_ms / 1000, _OPEN_RACE_S)
        while True:
            try:
                self._connect(on_disk, synchronous, busy_timeout_ms, compress)
                return
            except sqlite3.OperationalError as exc:
                self._close_quietly()
                if not _open_race(exc, self.path, self._readonly) or time.monotonic() >= deadline:
                    raise _open_failure(self.path, exc, busy_timeout_ms) from exc
                self._closed = False
                self._anchor = _anchor.Anchor(self.path) if on_disk else None
                time.sleep(0.01)

    # -- writes (the algorithm is journal._sql_write's) -------------------------------------------

    def _write_summary(self, db: sqlite3.Connection, run_id: str, epoch: int | None, *, fresh: bool,
                       unheld: bool) -> Checkpoint:
        cached = None if fresh else self._cache.get(run_id)
        if cached is not None:
            return cached  # the stored row is still the one this connection wrote with it
        return self._read_summary(db, run_id, db.execute(SQLITE.head, (run_id,)).fetchone(), fresh=fresh)

    def _group_summaries(self, db: sqlite3.Connection, runs: list[str]) -> dict[str, Checkpoint]:
        """:meth:`_write_summary` of each of ``runs``: those this connection wrote last, as cached;
        the others' rows read in one statement (no lock to take: the transaction holds the file)."""
        out: dict[str, Checkpoint] = {}
        misses: list[str] = []
        for run_id in runs:
            cached = self._cache.get(run_id)
            if cached is None:
                misses.append(run_id)
            else:
                out[run_id] = cached
        if len(misses) == 1 or not _json_each():  # the plain append's statement, run by run
            for run_id in misses:
                out[run_id] = self._write_summary(db, run_id, None, fresh=False, unheld=False)
        elif misses:
            found = {r: (epoch, text) for r, epoch, text in db.execute(SQLITE.summaries, (json.dumps(misses),))}
            for run_id in misses:
                out[run_id] = self._read_summary(db, run_id, found.get(run_id), fresh=False)
        return out

    def _read_summary(self, db: sqlite3.Connection, run_id: str, row: tuple[Any, Any] | None, *,
                      fresh: bool) -> Checkpoint:
        """The summary of a run whose ``(epoch, checkpoint)`` row was just read (``None``: a new
        run), taken from the summaries kept across other connections' commits when its text is
        the one this connection stored (unless ``fresh``)."""
        # Taken out, not read: this append folds events into it in place (see _stale).
        stale = self._stale.pop(run_id, None)
        if row is None:
            return Checkpoint(run_id=run_id)
        if stale is not None and not fresh and stale[0] == row[1]:
            cp = stale[1]  # the stored text is still the one this connection wrote with it
        else:
            cp = self._summary_of(db, run_id, row[1])
        cp.epoch = _epoch(run_id, row[0])
        return cp

    def _keep(self, run_id: str, cp: Checkpoint, upserted: sqlite3.Cursor, text: Any) -> None:
        self._cache[run_id] = cp
        self._kept[run_id] = text

    def _forget(self, run_ids: Iterable[str]) -> None:
        for run_id in run_ids:
            self._cache.pop(run_id, None)
            self._stale.pop(run_id, None)

    def _inserted(self, db: sqlite3.Connection, rows: list[tuple[Any, ...]], inserted: sqlite3.Cursor | None) -> None:
        # The last row was inserted alone (_last_row_alone): its cursor holds its rowid (sqlite3
        # sets ``lastrowid`` after execute(), not executemany()), which saves a query per append.
        rowid = inserted.lastrowid if inserted is not None else None
        if rowid is None:
            rowid = db.execute("SELECT last_insert_rowid()").fetchone()[0]
        self._mark = (rowid, rows[-1][11])
        if self._file_schema < _COMPRESSED_SINCE and any(r[8] == CODEC_JSON_ZSTD for r in rows):
            # The first compressed row: from this commit on, schema 1 must refuse the file.
            db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(_COMPRESSED_SINCE),))
            self._bump = _COMPRESSED_SINCE
        if self._file_schema < _OFFLOADED_SINCE and any(r[8] == CODEC_JSON_BLOB for r in rows):
            # The first offloaded row: from this commit on, schema 4 must refuse the file.
            db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(_OFFLOADED_SINCE),))
            self._bump = _OFFLOADED_SINCE
        if self._file_schema < _SEALED_BLOB_SINCE and any(r[8] == CODEC_SEALED_BLOB for r in rows):
            # The first sealed blob: from this commit on, schema 6 must refuse the file.
            db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(_SEALED_BLOB_SINCE),))
            self._bump = _SEALED_BLOB_SINCE
        if self._file_schema < _BLAKE_KEYED_SINCE and any(r[12] is not None and len(r[12]) == SALT_BYTES for r in rows):
            # The first row with a keyed BLAKE2b digest: from this commit on, schema 7 must refuse the file.
            db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(_BLAKE_KEYED_SINCE),))
            self._bump = _BLAKE_KEYED_SINCE

    # -- erasure (the algorithm is journal._erase's) --------------------------------------------------

    def _before_erase(self, db: sqlite3.Connection) -> None:
        # SQLite leaves a deleted or rewritten cell's bytes where they were, in its page or in a
        # freed page, unless secure_delete is on: on, it overwrites them with zeros, in the pages
        # the erasure's transaction writes (to the -wal, then the database file).
        db.execute("PRAGMA secure_delete=ON")

    def _scrub(self, thorough: bool) -> tuple[bool, str]:
        """Copy the erasure's pages into the database file and truncate the -wal to nothing: until
        then, the -wal holds the pages as they were before (and frames a checkpoint already copied
        stay in it until it is reset). Waits, up to the busy timeout, for readers of older
        snapshots; a reader that stays keeps it from finishing (the next ``erase`` retries)."""
        with self._lock:
            if self.path == ":memory:":
                return True, "an in-memory journal: no file"
            try:
                self._db.execute("PRAGMA secure_delete=OFF")
                if thorough:
                    self._db.execute("VACUUM")  # a new file's pages, holding only live rows
                busy, frames, copied = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as exc:
                return False, f"the -wal could not be checkpointed ({exc}); run erase again"
        if busy:
            return False, (f"another connection kept the -wal from being truncated ({copied} of {frames} frames "
                           "copied): it may still hold the old content; run erase again when it is done")
        how = "the database file rewritten (VACUUM)" if thorough else "erased pages zeroed (secure_delete)"
        return True, f"{how} and written into the database file; -wal truncated"

    def rebuild_checkpoint(self, run_id: str, *, trust_journal: bool = False) -> tuple[Checkpoint, list[str]]:
        if self._writer is not None and self._id_ok(run_id):
            # Still on the read-only connection (a -wal with commits was there at open): a rebuild
            # that will be refused is refused from it, before the writer touches the -shm.
            with self._reading(run_id), self._lock, _read_txn(self._db):
                self._plan_rebuild(self._db, run_id, trust_journal)
        return super().rebuild_checkpoint(run_id, trust_journal=trust_journal)

    def _plan_rebuild(self, db: sqlite3.Connection, run_id: str, trust_journal: bool) -> tuple[Checkpoint, list[str]]:
        try:
            # The summary is read as bytes: one that is not even UTF-8 is one more unreadable summary.
            return super()._plan_rebuild(db, run_id, trust_journal)
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc):  # the driver's "Could not decode to UTF-8 column ..."
                raise
            raise JournalCorrupt(f"journal {self.path!r}, run {run_id!r}: a row is unreadable ({exc}); nothing "
                                 "was written") from exc

    # -- reads (the algorithm is journal._sql's) -----------------------------------------------------

    _dialect = SQLITE
    _last_row_alone = True
    _bytearray_blobs = True

    @contextmanager
    def _reader(self, run_id: str, *, check: bool = True) -> Iterator[sqlite3.Connection]:
        with self._reading(run_id), self._lock, reading(self._db):
            if check:
                self._schema_of(self._db)
            yield self._db

    @contextmanager
    def _snapshot(self, run_id: str) -> Iterator[sqlite3.Connection]:
        # Read before the transaction begins: a commit the anchor records is then in its snapshot.
        mark = None if self._anchor is None or self._accept_rollback else self._anchor.read()
        with self._reading(run_id), self._lock:
            self._db.execute("BEGIN")
            try:
                self._schema_of(self._db)
                _anchor.check(self._db, self.path, mark)  # a journal rolled back since it was opened
                with reading(self._db):
                    yield self._db
            finally:
                self._db.execute("COMMIT")

    def acquire(self, run_id: str, owner: str, *, force: bool = False, open_only: bool = False) -> int:
        if not self._id_ok(run_id):
            raise RunNotFound(run_id)
        with self._txn() as db:
            self._schema_of(db)
            row = db.execute("SELECT epoch, owner, status FROM cuaderno_runs WHERE run_id=?", (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            if open_only and row[2] in CLOSED_STATUSES:  # before the lock: nothing to give back
                raise RunClosed(run_id, row[2])
            # Checked under the write lock: two resumers cannot both see the run free.
            _lease.refuse_second_names(self.path)
            holder = _lease.parse(row[1])
            if not _lease.take(self.path, run_id, holder, self._ident) and not force:
                who = _lease.describe(holder) if holder is not None else "another process"
                raise RunBusy(run_id, f"{who}, which is still alive")
            epoch = next_epoch(run_id, row[0])
            db.execute("UPDATE cuaderno_runs SET epoch=?, owner=? WHERE run_id=?",
                       (epoch, _lease.claim(owner, _lease.hold_file(self.path)), run_id))
            self._cache.pop(run_id, None)  # this connection changed the row: the cached epoch is stale
        self._taken[run_id] = epoch
        return epoch

    def release(self, run_id: str, epoch: int) -> None:
        if not self._id_ok(run_id):
            return
        try:
            with self._txn() as db:
                self._schema_of(db)
                row = db.execute("SELECT epoch, owner FROM cuaderno_runs WHERE run_id=?", (run_id,)).fetchone()
                mine = row is not None and row[0] == epoch
                if mine:
                    db.execute("UPDATE cuaderno_runs SET owner=? WHERE run_id=? AND epoch=?",
                               (_lease.released(row[1]), run_id, epoch))
                # Taken over since (by force, from another process): this process's lock must go
                # too, or the run would look held until this process exits. Not when the newer
                # holder is this very process (another loop of it): the lock is the process's.
                current = _lease.parse(row[1]) if row is not None else None
                superseded = not mine and self._taken.get(run_id) == epoch and not (
                    current is not None and _lease.is_mine(current))
        except JournalReplaced:
            # The file this store held the run in is no longer at the path: nothing to record,
            # but the lock goes, or the file now there stays refused until this process exits.
            mine, superseded = self._taken.get(run_id) == epoch, False
        if mine or superseded:
            _lease.unlock(self.path, run_id)  # after the commit: nobody finds it free while it is not
        if self._taken.get(run_id) == epoch:
            del self._taken[run_id]

    def side_connection(self) -> sqlite3.Connection:
        """A new connection of the caller's own that may write to this journal's file (autocommit),
        for what keeps its own table beside the journal (the shared rate limiter,
        :mod:`cuaderno.flow.ratelimit`). The caller closes it.

        Opened through :mod:`cuaderno.journal._shm`: a plain ``sqlite3.connect`` made while this
        process keeps the file's -shm read-only (this store before its first write, on a -wal with
        commits in it; any read-only store) could never write."""
        if self.path == ":memory:":
            raise UsageError("a journal in memory has no file another connection could open")
        if self._readonly:
            raise UsageError(f"journal {self.path!r} was opened read-only; it gives no connection that writes")
        return _shm.writable_connection(self.path, self._busy_timeout_ms / 1000)

    def close(self) -> None:
        self._release_all()
        with self._lock:
            self._close_db()
            self._closed = True
            if self._anchor is not None:
                self._anchor.close()

    # -- SupportsClaims (what a worker polls) ----------------------------------------------------

    def holders(self, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The live holder of each run that has one (see
        :class:`~cuaderno.journal.base.SupportsClaims`): the run's lock byte in ``<journal>-holds``
        is probed without being taken, and the holder described from the journal's record."""
        wanted = [r for r in dict.fromkeys(run_ids) if self._id_ok(r)]
        if not wanted:
            return {}
        owners: dict[str, str | None] = {}
        with self._reading("*"):
            with self._lock:
                self._schema_of(self._db)
                # One constant statement per run (no SQL is built from strings, R12); a primary-key
                # lookup in a local file costs microseconds.
                for run_id in wanted:
                    row = self._db.execute("SELECT owner FROM cuaderno_runs WHERE run_id=?", (run_id,)).fetchone()
                    if row is not None:
                        owners[run_id] = row[0]
        found = {}
        for run_id, owner in owners.items():
            holder = _claims.live_holder(self.path, run_id, owner)
            if holder is not None:
                found[run_id] = holder
        return found

    def _may_index(self) -> bool:
        return not self._readonly and self._writer is None  # not yet: a tail read is not worth the writer


