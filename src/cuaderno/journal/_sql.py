"""The part of a SQL journal that is the same in every dialect (SQLite, PostgreSQL).

The two stores read the same tables with the same statements, differing only in how a parameter
is written (``?`` or ``%s``), in how a connection and one consistent snapshot are had (a lock and
``BEGIN`` on SQLite's one connection; a pooled connection and a ``REPEATABLE READ`` transaction in
PostgreSQL), and in which values they can hold. :class:`SqlJournal` is that shared algorithm:
``load``, ``load_tail``, ``checkpoint``, ``list_runs``, ``open_runs`` and the entry points of an
append; a backend supplies its :class:`Dialect` (every statement written out, no SQL is built from
strings, R12) and the few hooks that obtain a connection (:meth:`SqlJournal._reader`,
:meth:`SqlJournal._snapshot`, :meth:`SqlJournal._reading`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Self

from cuaderno import faults
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import JournalCorrupt, JournalError, RunNotFound, UsageError
from cuaderno.events import CODEC_JSON, StepEvent
from cuaderno.journal import _claims
from cuaderno.journal._append import RawRow, check_chain, decode_row, plan_rebuild
from cuaderno.journal._compress import pack
from cuaderno.journal._group import GroupBatch
from cuaderno.journal._rows import checked_epoch, decode_small_payloads, storable
from cuaderno.journal.base import Tail, tail_base, validate_event

__all__ = ["POSTGRES", "SQLITE", "Dialect", "SqlJournal"]


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


SQLITE = Dialect(
    head="SELECT epoch, checkpoint FROM cuaderno_runs WHERE run_id=?",
    summary="SELECT checkpoint FROM cuaderno_runs WHERE run_id=?",
    run_events=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
                "row_hash FROM cuaderno_events WHERE run_id=?"),
    list_runs=("SELECT run_id, epoch, checkpoint FROM cuaderno_runs WHERE (? IS NULL OR status = ?) "
               "ORDER BY updated_at DESC LIMIT ?"),
    open_runs=("SELECT run_id, epoch, checkpoint FROM cuaderno_runs WHERE status = 'running' "
               "OR (status IN ('suspended', 'needs_human') AND checkpoint LIKE '%\"cancel_requested\":{%') "
               "OR (status = 'cancelled' AND checkpoint LIKE '%\"cleanup\":[{%') "
               "ORDER BY updated_at LIMIT ?"),
    has_step="SELECT 1 FROM cuaderno_events WHERE run_id=? AND step_id=? LIMIT 1",
    last_mark=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, "
               "created_at, row_hash FROM cuaderno_events WHERE run_id=? AND step_id=? ORDER BY seq DESC LIMIT 1"),
    tail=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
          "row_hash FROM cuaderno_events WHERE run_id=? AND seq>? ORDER BY seq"),
)

POSTGRES = Dialect(
    head="SELECT epoch, checkpoint FROM cuaderno_runs WHERE run_id=%s",
    summary="SELECT checkpoint FROM cuaderno_runs WHERE run_id=%s",
    run_events=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, "
                "created_at, row_hash FROM cuaderno_events WHERE run_id=%s ORDER BY seq"),
    list_runs=("SELECT run_id, epoch, checkpoint FROM cuaderno_runs "
               "WHERE (%s::text IS NULL OR status = %s) ORDER BY updated_at DESC LIMIT %s"),
    open_runs=("SELECT run_id, epoch, checkpoint FROM cuaderno_runs "
               "WHERE status = 'running' OR (status IN ('suspended', 'needs_human') AND "
               "strpos(checkpoint, '\"cancel_requested\":{') > 0) "
               "OR (status = 'cancelled' AND strpos(checkpoint, '\"cleanup\":[{') > 0) "
               "ORDER BY updated_at LIMIT %s"),
    has_step="SELECT 1 FROM cuaderno_events WHERE run_id=%s AND step_id=%s LIMIT 1",
    last_mark=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, "
               "created_at, row_hash FROM cuaderno_events WHERE run_id=%s AND step_id=%s ORDER BY seq DESC "
               "LIMIT 1"),
    tail=("SELECT run_id, step_id, phase, seq, kind, name, decision, fingerprint, codec, payload, created_at, "
          "row_hash FROM cuaderno_events WHERE run_id=%s AND seq>%s ORDER BY seq"),
)


def plain_loads(run_id: str, text: Any) -> Checkpoint:
    """A stored summary as SQLite hands it back."""
    return Checkpoint.loads(text)


def text_loads(run_id: str, text: object) -> Checkpoint:
    """A stored summary, refused unless it is text (as PostgreSQL hands it back)."""
    if not isinstance(text, str):
        raise JournalCorrupt(f"run {run_id!r}: its stored summary is not text")
    return Checkpoint.loads(text)


def planned_rebuild(run_id: str, row: Sequence[Any] | None, rows: list[RawRow],
                    trust_journal: bool) -> tuple[Checkpoint, list[str]]:
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
    cp, differ = plan_rebuild(run_id, rows, row[1], checked_epoch(run_id, row[0]), trust_journal)
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


def stored_rows(new: list[tuple[StepEvent, bytes]], compress: bool, journal: str,
                max_payload: int) -> list[tuple[Any, ...]]:
    """The events table's columns of each new row, its payload compressed when ``compress`` (the
    row hash and deduplication cover the JSON bytes; compression is how they rest). A payload over
    ``max_payload`` is refused: compressed it would fit, and no reader could open it."""
    rows = []
    for e, payload in new:
        if len(payload) > max_payload:
            raise JournalError(f"{journal}: the payload of {e.step_id}:{e.phase} is {len(payload):,} "
                               f"bytes of JSON, more than the {max_payload:,} a journal row holds; nothing "
                               "was committed")
        codec, stored = pack(payload) if compress and e.codec == CODEC_JSON else (e.codec, payload)
        rows.append((e.run_id, e.step_id, e.phase, e.seq, e.kind, e.name, e.decision, e.fingerprint, codec,
                     stored, e.created_at, e.row_hash))
    return rows


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

    def _tail_index(self) -> bool:
        raise NotImplementedError

    def _append_alone(self, run_id: str, events: Sequence[StepEvent], epoch: int | None,
                      expect_seq: int | None) -> list[StepEvent]:
        raise NotImplementedError

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

    # -- reads ------------------------------------------------------------------------------------------

    def load(self, run_id: str) -> list[StepEvent]:
        if not self._id_ok(run_id):
            raise RunNotFound(run_id)
        # One snapshot for both statements: read apart, a writer committing between them would
        # leave rows past the head the summary named, which looks exactly like a tampered journal.
        with self._snapshot(run_id) as db:
            head = db.execute(self._dialect.summary, (run_id,)).fetchone()
            rows: list[RawRow] = [] if head is None else db.execute(self._dialect.run_events, (run_id,)).fetchall()
        if head is None:
            raise RunNotFound(run_id)
        with self._reading(run_id):
            rows.sort(key=lambda r: r[3])
            summary = self._loads(run_id, head[0])
            events = check_chain(run_id, rows, summary.last_hash, summary.last_seq)
            decode_small_payloads(events)
        return events

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        if not self._id_ok(run_id):
            return None
        with self._reader(run_id) as db:
            row = db.execute(self._dialect.head, (run_id,)).fetchone()
            if row is None:
                return None
            cp = self._loads(run_id, row[1])
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
                cp = self._loads(run_id, text)
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
        if head is None:
            raise RunNotFound(run_id)
        if snap is None or base is None:
            return None
        with self._reading(run_id):
            summary = self._loads(run_id, head[1])
            summary.epoch = checked_epoch(run_id, head[0])
            return Tail(summary, decode_row(snap), [decode_row(r) for r in rows])

    def prepare_tail(self) -> None:
        """See :meth:`~cuaderno.journal.base.SupportsTail.prepare_tail` (once per store)."""
        self._tail_index()

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
