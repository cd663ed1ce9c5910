"""How a SQL journal writes, once for both dialects (SQLite, PostgreSQL).

An append, alone or in a group, is one transaction: the run's summary read (and, in PostgreSQL,
its row locked), the new rows planned by :func:`~cuaderno.journal._append.plan_append`, inserted
without looking first, then the summary upserted. A group of several runs does each of these once
for all of them (:meth:`SqlWriter._write_batches`). A stored key makes the insert fail (the
table's primary key is the dedup key); the append is then redone with one lookup per key (rows
already stored are returned as they are). A rebuild reads the run's rows and summary under the
write lock and rewrites the summary only where it differs. :class:`SqlWriter` is that algorithm,
with the statements of the store's :class:`~cuaderno.journal._sql.Dialect`.

What a backend supplies is its own: the write transaction (:meth:`SqlWriter._write_txn`: SQLite's
``BEGIN IMMEDIATE`` on its one connection, with what a commit of its file records after it;
PostgreSQL's pooled transaction), the summary read under its lock (:meth:`SqlWriter._write_summary`;
a group's, :meth:`SqlWriter._group_summaries`), its summary cache (a group's summaries upserted and
kept, :meth:`SqlWriter._upsert_summaries`), and, for PostgreSQL, the run locks a write checks (:meth:`SqlWriter._hold_lost`,
:meth:`SqlWriter._moved`) and what it does when a commit's acknowledgement is lost
(:meth:`SqlWriter._after_lost`). The rows' bytes are the algorithm's alone, so both dialects store
the same journal (``tests/golden``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from cuaderno import faults
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import FencedOut, JournalCorrupt, JournalError, RunNotFound
from cuaderno.events import CODEC_JSON, StepEvent
from cuaderno.journal._append import RawRow, decode_row, plan_append, plan_rebuild
from cuaderno.journal._compress import COMPRESS_FROM, MAX_PAYLOAD, pack
from cuaderno.journal._group import GroupBatch
from cuaderno.journal._offload import Held, offload_above
from cuaderno.journal._rows import Duplicate, checked_epoch, no_existing
from cuaderno.journal._sealing import RunKeys, sealed, summary_text
from cuaderno.journal._sql import SqlJournal
from cuaderno.journal.base import payload_limit, validate_event

__all__ = ["Lost", "SqlWriter", "first_line", "next_epoch", "planned_rebuild", "stored_rows"]


class Lost(JournalError):
    """A write's connection died: whether its transaction committed is not known yet (the server
    may have committed it before its reply was lost, R19). An append asks the journal
    (:meth:`SqlWriter._after_lost`); to the callers of the other writes (a takeover, a release) it
    is the JournalError it says it is. Only a store with a server raises it."""


def first_line(exc: BaseException) -> str:
    """An error's first line (a driver's message may go on with its details and hints)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


_COPIED_BELOW = 16 * 1024
"""The largest payload bound as a ``bytearray`` copy (see ``as_bytearrays``): up to there the
copy costs less than the adapter look-up it saves."""


def stored_rows(new: list[tuple[StepEvent, bytes]], compress: bool, journal: str,
                max_payload: int, keys: RunKeys | None = None, held: Held | None = None, *,
                as_bytearrays: bool = False) -> list[tuple[Any, ...]]:
    """The events table's columns of each new row (the thirteen of :data:`RawRow`; with
    ``as_bytearrays``, bound as SQLite's insert takes them cheapest, see below): over
    ``held``'s threshold its payload is a reference to the blob ``held`` keeps for the
    transaction to write (:mod:`._offload`), else it is compressed when ``compress``; then it is
    sealed with its run's data key when the store encrypts (``keys``; see :mod:`._sealing`; an
    offloaded payload's blob is then sealed too, and its reference is). The row hash and
    deduplication cover the JSON bytes; offload, compression and sealing are how they rest. The
    reference is taken before packing and sealing (it names the JSON bytes' digest, keyed by
    the run's data key when the store encrypts). A payload over ``max_payload`` is refused:
    compressed it would fit, and no reader could open it."""
    rows: list[tuple[Any, ...]] = []
    for e, payload in new:
        size = len(payload)
        if size > max_payload:
            raise JournalError(f"{journal}: the payload of {e.step_id}:{e.phase} is {size:,} "
                               f"bytes of JSON, more than the {max_payload:,} a journal row holds; nothing "
                               "was committed")
        # (Tested here, not left to the callee, where they decide nothing: this runs for every row.)
        ref = (held.take(e.run_id, payload, keys)
               if held is not None and size > held.above and e.codec == CODEC_JSON else None)
        codec, stored = ref or (pack(payload) if compress and size >= COMPRESS_FROM and e.codec == CODEC_JSON
                                else (e.codec, payload))  # pack() keeps a short payload as it is: no call
        if keys is not None:
            codec, stored = sealed(keys, e, codec, stored)
        if as_bytearrays:
            # Python's sqlite3 (3.11) looks a ``bytes`` or ``None`` parameter up in its adapters'
            # registry (about 3,400 and 2,400 instructions under callgrind, several per row) and
            # binds a ``bytearray`` or a ``str`` at once: a small blob goes as a bytearray copy (the
            # same BLOB; the copy costs less than the look-up), and a missing name, decision or
            # fingerprint as '' (never an event's value: they are non-empty), which SQLite's insert
            # stores as NULL (NULLIF, see journal._sql).
            rows.append((e.run_id, e.step_id, e.phase, e.seq, e.kind, e.name or "", e.decision or "",
                         e.fingerprint or "", codec, bytearray(stored) if len(stored) < _COPIED_BELOW else stored,
                         e.created_at, e.row_hash, None if e.salt is None else bytearray(e.salt)))
        else:
            rows.append((e.run_id, e.step_id, e.phase, e.seq, e.kind, e.name, e.decision, e.fingerprint, codec,
                         stored, e.created_at, e.row_hash, e.salt))
    return rows


def _held_for(new: list[tuple[StepEvent, bytes]], above: int, held: Held | None = None) -> Held | None:
    """``held``, else a new :class:`Held` when a payload of ``new`` goes over ``above`` (rarely:
    over a megabyte by default), else ``None``: no blob to write."""
    if held is None:
        for _, payload in new:
            if len(payload) > above:
                return Held(above)
    return held


def planned_rebuild(run_id: str, row: Sequence[Any] | None, rows: list[RawRow],
                    trust_journal: bool, keys: RunKeys | None = None) -> tuple[Checkpoint, list[str]]:
    """What ``rebuild_checkpoint`` writes, from the run's ``(epoch, checkpoint, status)`` row
    and its events' rows, both read under the write lock (see
    :func:`~cuaderno.journal._append.plan_rebuild`)."""
    if row is None:
        if rows:
            raise JournalCorrupt(f"run {run_id!r} has {len(rows)} journaled events but no summary row (it was "
                                 "deleted): its epoch and holder are lost, so it is not rebuilt; nothing was "
                                 "written")
        raise RunNotFound(run_id)
    rows.sort(key=lambda r: r[3])
    # The epoch column is the run's epoch: a takeover writes only the column.
    cp, differ = plan_rebuild(run_id, rows, row[1], checked_epoch(run_id, row[0]), trust_journal, keys)
    if row[2] != cp.status:  # the copy of the status that list_runs(status=...) filters on
        differ = [*differ, "status column"]
    return cp, differ


def next_epoch(run_id: str, value: object) -> int:
    """The epoch a takeover of the run gives it, after its epoch column ``value`` (both dialects
    store 64-bit integers)."""
    epoch = checked_epoch(run_id, value) + 1
    if epoch >= 2**63:
        raise JournalCorrupt(f"run {run_id!r}: its epoch is {value}, not one a takeover can follow; the "
                             "run's fencing record is damaged, nothing was written")
    return epoch


_UNSET = object()


class SqlWriter(SqlJournal):
    """The append, group append and rebuild of a SQL journal (see the module)."""

    _compress: bool
    _label: str
    """``journal <where>``: how this store names its journal in an error."""

    max_payload: int | None = None
    """The store's per-payload limit when set (``store.max_payload = N``); ``None``: the default
    (see :func:`~cuaderno.journal.base.payload_limit`)."""
    offload_above: int | None = None
    """The store's offload threshold when set; ``None``: the default (see :mod:`._offload`)."""
    _sizes: tuple[object, object, int, int] = (_UNSET, _UNSET, 0, 0)
    """``(max_payload, offload_above)`` as last read, and the limit and threshold they gave:
    checked once per value, not per append (see :meth:`_limits`)."""
    _last_row_alone = False
    """Insert an append's last row on its own (``execute``, after ``executemany`` of the others),
    so that :meth:`_inserted` has its cursor: SQLite's gives the row's id without a query. A
    server's store inserts them all at once (one round trip)."""
    _bytearray_blobs = False
    """Bind a row's small blobs as ``bytearray`` copies (see :func:`stored_rows`): what SQLite's
    driver binds without an adapter look-up. A server's driver has no such cost."""

    # -- what a backend supplies --------------------------------------------------------------------

    def _write_txn(self) -> AbstractContextManager[Any]:
        """One write transaction, committed when the block ends (rolled back on an error), with
        what the backend records after a commit; inside it, the store's view of the journal is
        current (a cache another connection made stale is dropped)."""
        raise NotImplementedError

    def _write_summary(self, db: Any, run_id: str, epoch: int | None, *, fresh: bool,
                       unheld: bool) -> Checkpoint:
        """The run's summary, under the write lock, to fold an append into (``fresh``: read from
        the row, not the cache; ``unheld``: see :meth:`_hold_lost`). Its epoch is the column's:
        what the fencing check compares the writer's with."""
        raise NotImplementedError

    def _keep(self, run_id: str, cp: Checkpoint, upserted: Any, text: Any) -> None:
        """Cache the summary an append just wrote (``upserted``: the cursor of its upsert, which
        returns the row version where the dialect keeps one; ``text``: the summary as stored,
        where the dialect keeps none): the next append of the run need not read it."""
        raise NotImplementedError

    def _forget(self, run_ids: Iterable[str]) -> None:
        """Drop the cached summaries of runs whose write failed (they hold events never committed)."""
        raise NotImplementedError

    def _inserted(self, db: Any, rows: list[tuple[Any, ...]], inserted: Any) -> None:
        """After an append's rows are in, in its transaction (SQLite: the anchor's mark, the schema
        a first compressed row raises). ``inserted``: the cursor of the insert when it was one row
        (``None`` for several), from which SQLite reads the row's id without a query."""

    def _schema_of(self, db: Any) -> int:
        """The journal's schema version, refused when this cuaderno cannot read it."""
        raise NotImplementedError

    def _hold_lost(self, run_ids: Sequence[str]) -> set[str]:
        """Of ``run_ids``, those whose run lock this store lost and cannot take back (none where
        the locks cannot be lost while the store lives)."""
        return set()

    def _moved(self, run_id: str, epoch: int | None) -> FencedOut | None:
        """After a commit: the refusal to give the writer if its run lock went to someone else
        meanwhile (what it wrote, an intent, must then not be acted on)."""
        return None

    def _after_lost(self, run_id: str, events: Sequence[StepEvent], epoch: int | None, expect_seq: int | None,
                    lost: Lost, unheld: bool) -> list[StepEvent]:
        """The append after its commit's acknowledgement was lost (only a server store has one)."""
        raise lost

    # -- appends --------------------------------------------------------------------------------------

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None,
               expect_seq: int | None = None) -> list[StepEvent]:
        if not events:
            return []
        run_id = events[0].run_id
        if not self._id_ok(run_id):
            validate_event(events[0])  # raises the UsageError before the run_id reaches SQL
        faults.point("append.W0")  # before the transaction (every write, whoever makes it)
        return self._append_alone(run_id, events, epoch, expect_seq)

    def _append_alone(self, run_id: str, events: Sequence[StepEvent], epoch: int | None,
                      expect_seq: int | None) -> list[StepEvent]:
        """One append in its own transaction: optimistic first, with lookups after a stored key."""
        unheld = bool(self._hold_lost([run_id] if epoch is not None else []))
        try:
            out = self._append(run_id, events, epoch, expect_seq, lookups=False, unheld=unheld)
        except Duplicate:
            out = self._append(run_id, events, epoch, expect_seq, lookups=True, unheld=unheld)
        except Lost as lost:
            out = self._after_lost(run_id, events, epoch, expect_seq, lost, unheld)
        moved = self._moved(run_id, epoch)
        if moved is not None:
            raise moved  # committed, and the run's lock went to someone else since: not to be acted on
        faults.point("append.W2")  # after the commit
        return out

    def _append(self, run_id: str, events: Sequence[StepEvent], epoch: int | None, expect_seq: int | None, *,
                lookups: bool, unheld: bool = False) -> list[StepEvent]:
        try:
            with self._write_txn() as db:
                out = self._write(db, run_id, events, epoch, expect_seq, lookups=lookups, unheld=unheld)
            return out
        except BaseException:
            self._forget([run_id])
            self._drop_keys([run_id])  # a data key created in the rolled-back transaction is gone
            raise

    def _write(self, db: Any, run_id: str, events: Sequence[StepEvent], epoch: int | None,
               expect_seq: int | None, *, lookups: bool, unheld: bool = False) -> list[StepEvent]:
        """One append's rows and summary, in ``db``'s transaction; the stored events.

        Optimistic: the rows are inserted without looking first. A stored key fails the insert
        (:class:`Duplicate`: the caller redoes the transaction with ``lookups``, one per key)."""
        cp = self._write_summary(db, run_id, epoch, fresh=lookups, unheld=unheld)

        keys = None if self._sealer is None else self._sealer.bind(db)  # self._keys(db), inline: every append

        find: Callable[[StepEvent], StepEvent | None] = no_existing
        if lookups:  # the closure only for the redo that looks keys up (it is a collectable per call)
            def existing(ev: StepEvent) -> StepEvent | None:
                row = db.execute(self._dialect.event, ev.key).fetchone()
                return None if row is None else decode_row(row, keys)
            find = existing

        limit, above = self._limits()
        new, out = plan_append(cp, events, find, epoch, expect_seq, limit, keyed=True)
        if new:
            # A Held only when a row goes to a blob (rarely: over a megabyte by default). A store
            # that encrypts offloads too: each blob is then its run's own, keyed and sealed with
            # the run's data key (see ._offload), so no payload rests in plaintext there.
            held = _held_for(new, above)
            rows = stored_rows(new, self._compress, self._label, MAX_PAYLOAD, keys, held,
                               as_bytearrays=self._bytearray_blobs)
            self._insert_rows(db, rows, held, lookups=lookups)
            armed = faults.armed()
            if armed:
                faults.in_txn("checkpoint")
            text = cp.dumps() if keys is None else summary_text(keys, cp)
            upserted = db.execute(self._dialect.upsert_run, (run_id, cp.status, cp.epoch, new[-1][0].created_at, text))
            if armed:
                faults.in_txn()
                faults.point("append.W1")  # everything written, before COMMIT
            self._keep(run_id, cp, upserted, text)
        return out

    def _insert_rows(self, db: Any, rows: list[tuple[Any, ...]], held: Held | None, *, lookups: bool) -> None:
        """An append's (or a group's) new rows, inserted in ``db``'s transaction without looking
        first, after the blobs ``held`` keeps (the SQLite anchor reads the last row inserted);
        then :meth:`_inserted`. A stored key: :class:`Duplicate` (the caller redoes the
        transaction with lookups), or, when every key was looked up (``lookups``), the
        JournalError of another writer's row committed since."""
        if held is not None:
            held.write(db)
        inserted = None
        insert = self._dialect.insert
        try:
            if len(rows) == 1:
                inserted = db.execute(insert, rows[0])
            elif self._last_row_alone:
                db.executemany(insert, rows[:-1])
                inserted = db.execute(insert, rows[-1])
            else:
                db.executemany(insert, rows)  # one round trip (psycopg pipelines it)
        except self._dialect.duplicate as exc:
            if lookups:  # every key was looked up: another writer's row, committed since
                raise JournalError(f"{self._label}: write failed, nothing was committed: {first_line(exc)}") \
                    from None
            raise Duplicate from None
        self._inserted(db, rows, inserted)

    def _limits(self) -> tuple[int, int]:
        """The store's per-payload limit and offload threshold, checked (see
        :func:`~cuaderno.journal.base.payload_limit`) when either setting changed since the last
        append, else as they were: two attribute reads per append instead of the two checks."""
        sizes = self._sizes
        if sizes[0] is not self.max_payload or sizes[1] is not self.offload_above:
            sizes = self._sizes = (self.max_payload, self.offload_above, payload_limit(self), offload_above(self))
        return sizes[2], sizes[3]

    def append_group(self, batches: Sequence[GroupBatch]) -> list[list[StepEvent] | Exception]:
        """The appends of several runs in one transaction and one sync (group commit, see
        :mod:`cuaderno.journal._group`); per batch, its stored events or its own error.

        Optimistic, like :meth:`append`: everything in one transaction; if any batch is refused
        (or the commit fails), it is rolled back whole and each batch is appended on its own.
        """
        armed = faults.armed()
        if armed:
            for _ in batches:
                faults.point("append.W0")
        for b in batches:
            if not b.events or not self._id_ok(b.events[0].run_id):
                return self._one_by_one(batches)
        if self._hold_lost([b.events[0].run_id for b in batches if b.epoch is not None]):
            return self._one_by_one(batches)  # each batch is refused, or written, on its own
        outs: list[list[StepEvent] | Exception] = [[] for _ in batches]
        try:
            with self._write_txn() as db:
                self._write_batches(db, batches, outs)
                faults.set_txn_points()
                faults.point("group.G1")  # every append of the group written, before COMMIT
        except Exception:
            faults.set_txn_points()
            self._forget(b.events[0].run_id for b in batches)
            self._drop_keys([b.events[0].run_id for b in batches if b.events])
            return self._one_by_one(batches)
        if type(self)._moved is not SqlWriter._moved:  # a store whose run locks can move (not SQLite's)
            for i, b in enumerate(batches):
                moved = self._moved(b.events[0].run_id, b.epoch)
                if moved is not None:  # committed; the lock went since, to someone else: not to be acted on
                    outs[i] = moved
        if armed:
            for _ in batches:
                faults.point("append.W2")
        return outs

    def _write_batches(self, db: Any, batches: Sequence[GroupBatch], outs: list[list[StepEvent] | Exception]) -> None:
        """Every batch of a group (taken by run id, the batches of one run in their own order), in
        ``db``'s transaction; ``outs[i]``: batch ``i``'s stored events. A handful of statements
        whatever the group's size: the summaries under the write lock
        (:meth:`_group_summaries`: PostgreSQL locks every run's row in run-id order and reads the
        ones it has not cached in one more; SQLite, whose transaction holds the whole file, reads
        the ones it has not cached in one), one ``executemany`` of every new row (SQLite's last
        row alone, see :attr:`_last_row_alone`), then every run's summary
        (:meth:`_upsert_summaries`). A group of one batch takes the plain append's statements.

        What each batch writes is what :meth:`_write` would write batch after batch: a run's
        batches fold into one summary, each seeing the one before it, and the run's summary row
        ends as its last batch leaves it, so one upsert per run, with its final summary, stores
        what one per batch would have. Any error leaves the transaction to be rolled back whole
        (the caller then appends batch by batch). The crash points of each batch with new rows
        are passed in run-id order, inside the transaction: ``K8`` once every row is in, then its
        own points and ``append.W1`` once every summary is."""
        if len(batches) == 1:
            b = batches[0]
            faults.set_txn_points(*b.points)
            outs[0] = self._write(db, b.events[0].run_id, b.events, b.epoch, b.expect_seq, lookups=False)
            return
        order = sorted(range(len(batches)), key=lambda i: batches[i].events[0].run_id)
        summaries = self._group_summaries(db, list(dict.fromkeys(batches[i].events[0].run_id for i in order)))
        keys = self._keys(db)
        limit, above = self._limits()
        held: Held | None = None
        rows: list[tuple[Any, ...]] = []
        updated: dict[str, float] = {}  # per run that has new rows, its last new row's time
        written: list[int] = []  # the batches with new rows, in order
        for i in order:
            b = batches[i]
            run_id = b.events[0].run_id
            new, outs[i] = plan_append(summaries[run_id], b.events, no_existing, b.epoch, b.expect_seq,
                                       limit, keyed=True)
            if new:
                held = _held_for(new, above, held)
                rows.extend(stored_rows(new, self._compress, self._label, MAX_PAYLOAD, keys, held,
                                        as_bytearrays=self._bytearray_blobs))
                updated[run_id] = new[-1][0].created_at
                written.append(i)
        if not rows:
            return
        # A stored key fails this (Duplicate): the group is then appended batch by batch, each
        # batch that meets it redone with lookups (see _append_alone).
        self._insert_rows(db, rows, held, lookups=False)
        armed = faults.armed()
        if armed:
            for i in written:
                faults.set_txn_points(*batches[i].points)
                faults.in_txn("checkpoint")
            faults.set_txn_points()
        self._upsert_summaries(db, [(run_id, summaries[run_id], at, summaries[run_id].dumps() if keys is None
                                     else summary_text(keys, summaries[run_id])) for run_id, at in updated.items()])
        if armed:
            for i in written:
                faults.set_txn_points(*batches[i].points)
                faults.in_txn()
                faults.point("append.W1")
            faults.set_txn_points()

    def _group_summaries(self, db: Any, runs: list[str]) -> dict[str, Checkpoint]:
        """:meth:`_write_summary` of each of ``runs`` (distinct, in code-point order) for a group's
        transaction (a backend reads the ones it has not cached in one statement)."""
        return {run_id: self._write_summary(db, run_id, None, fresh=False, unheld=False) for run_id in runs}

    def _upsert_summaries(self, db: Any, done: list[tuple[str, Checkpoint, float, Any]]) -> None:
        """A group's summaries ``(run_id, summary, updated_at, text as stored)``, each run once,
        upserted (one ``executemany``: a dialect that returns no row version) and kept
        (:meth:`_keep`)."""
        db.executemany(self._dialect.upsert_run, [(run_id, cp.status, cp.epoch, at, text)
                                                  for run_id, cp, at, text in done])
        for run_id, cp, _, text in done:
            self._keep(run_id, cp, None, text)

    def _one_by_one(self, batches: Sequence[GroupBatch]) -> list[list[StepEvent] | Exception]:
        """A group's batches appended one after the other; per batch, its events or its error."""
        outs: list[list[StepEvent] | Exception] = []
        for b in batches:
            faults.set_txn_points(*b.points)
            try:
                if not b.events:
                    outs.append([])
                    continue
                run_id = b.events[0].run_id
                if not self._id_ok(run_id):
                    validate_event(b.events[0])  # raises the UsageError before the run_id reaches SQL
                outs.append(self._append_alone(run_id, b.events, b.epoch, b.expect_seq))
            except Exception as exc:  # that batch's own outcome
                outs.append(exc)
            finally:
                faults.set_txn_points()
        return outs

    # -- rebuilding a summary ---------------------------------------------------------------------------

    def rebuild_checkpoint(self, run_id: str, *, trust_journal: bool = False) -> tuple[Checkpoint, list[str]]:
        """Rebuild the run's stored summary from its hash-chained journal, under the write lock
        (no append lands between the read and the rewrite). The epoch and holder are kept.

        Returns:
            The summary as now stored, and the fields in which the old one differed (none: it
            matched, and nothing was written).

        Raises:
            RunNotFound: no such run.
            JournalCorrupt: see :func:`~cuaderno.journal._append.plan_rebuild`; nothing was written.
        """
        if not self._id_ok(run_id):
            raise RunNotFound(run_id)
        with self._reading(run_id), self._txn() as db:  # no append's bookkeeping: no row is added
            cp, differ = self._plan_rebuild(db, run_id, trust_journal)
            if differ:
                db.execute(self._dialect.rewrite_summary, (cp.status, summary_text(self._keys(db), cp), run_id))
            self._forget([run_id])
            faults.point("rebuild.B1")  # the summary rewritten, before COMMIT
        faults.point("rebuild.B2")  # after the commit
        return cp, differ

    def _plan_rebuild(self, db: Any, run_id: str, trust_journal: bool) -> tuple[Checkpoint, list[str]]:
        """What :meth:`rebuild_checkpoint` writes, read in ``db``'s transaction."""
        self._schema_of(db)
        row = db.execute(self._dialect.rebuild_head, (run_id,)).fetchone()
        rows: list[RawRow] = db.execute(self._dialect.run_events, (run_id,)).fetchall()
        if row is not None and self._sealer is not None:
            self._drop_keys([run_id])  # read under the write lock, not as cached
            row = (row[0], self._opened_text(db, run_id, row[1]), row[2])
        return planned_rebuild(run_id, row, rows, trust_journal, self._keys(db))
