"""A claim's takeovers in one transaction: the queue takes over every run it
picked for a worker with one synced commit instead of one per run.

Each run is taken exactly as :meth:`~cuaderno.journal.base.Checkpointer.acquire` (``open_only``,
never ``force``) takes it alone: its row read under the write lock, refused if it is closed
(*stale*: its holder finished it after the claim's read) or held by a live process (*lost*), its
liveness lock taken (SQLite: the run's byte in ``<journal>-holds``; PostgreSQL: the run's advisory
lock on the store's lock connection), its epoch bumped and its holder recorded. What changes is
only that the rows of every run are written in one transaction.

Crash safety. The liveness locks are the process's, and the kernel (or the server, with the
session) drops them when it dies; the epochs and holders are rows. So a process killed inside
the transaction (``queue.C0``: every run picked locked, rows written, before COMMIT) leaves every
run as it was before the claim (nothing committed, no lock left); killed after the commit
(``queue.C1``), it leaves them taken over at a new epoch by a holder that is gone: the next
claim takes them at once, and the epoch fences any write of the dead one. A transaction that
fails (the journal refused the commit) gives back the locks this call took, so nothing looks
held that is not.

What replay needs: nothing here is an event. The epoch each run is taken at is the fencing
epoch every later intent and result of the worker's loop carries (see ``_Claimed`` in
:mod:`cuaderno.worker`); the holder record is what ``cuaderno status`` and a later takeover read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cuaderno import faults
from cuaderno.errors import RunBusy
from cuaderno.journal import _lease
from cuaderno.journal._rows import storable
from cuaderno.journal._sql_write import next_epoch
from cuaderno.journal.base import CLOSED_STATUSES, Checkpointer

if TYPE_CHECKING:
    from cuaderno.journal.postgres import PostgresCheckpointer
    from cuaderno.journal.sqlite import SqliteCheckpointer

__all__ = ["Takeovers", "take_over"]


@dataclass(kw_only=True, slots=True)
class Takeovers:
    """What :func:`take_over` did with each run it was given."""

    taken: list[tuple[str, int]] = field(default_factory=list[tuple[str, int]])
    """Runs now held by the store, with the epoch each was taken at (in the order given)."""
    lost: list[str] = field(default_factory=list[str])
    """Held by a live process (another worker, or an application that resumed it itself)."""
    stale: list[str] = field(default_factory=list[str])
    """Closed (or gone) since the caller read them: nothing to take."""
    summaries: dict[str, Any] = field(default_factory=dict[str, Any])
    """PostgreSQL: each run taken's summary as stored (read with its row, locked), for a caller
    that would otherwise read it again at once (a worker starting to drive the runs)."""


def take_over(store: Checkpointer, run_ids: Sequence[str], owner: str, *, done: Sequence[str] = ()) -> Takeovers:
    """Take over ``run_ids`` for ``owner`` in one transaction (a SQLite or PostgreSQL store;
    another store is asked run by run with its own ``acquire``). ``done``: queued runs the claim
    found ended, whose queue rows the same transaction marks done (so that claims stop reading
    them) instead of a transaction of their own."""
    wanted = list(dict.fromkeys(run_ids))
    if not wanted:
        return Takeovers()
    kind = type(store).__name__
    if kind == "SqliteCheckpointer":
        return _sqlite(store, wanted, owner, list(done))  # type: ignore[arg-type]
    if kind == "PostgresCheckpointer":
        return _postgres(store, wanted, owner, list(done))  # type: ignore[arg-type]
    return _one_by_one(store, wanted, owner)


def _one_by_one(store: Checkpointer, run_ids: list[str], owner: str) -> Takeovers:
    from cuaderno.errors import RunClosed, RunNotFound

    out = Takeovers()
    for run_id in run_ids:
        try:
            out.taken.append((run_id, store.acquire(run_id, owner, open_only=True)))
        except RunBusy:
            out.lost.append(run_id)
        except (RunClosed, RunNotFound):
            out.stale.append(run_id)
    return out


def _sqlite(store: SqliteCheckpointer, run_ids: list[str], owner: str, done: list[str]) -> Takeovers:
    out = Takeovers()
    locked: list[str] = []  # locks this call took: given back if its transaction does not commit
    at = _lease.holds_path(store.path)  # resolved once for every run, not once per lock
    try:
        with store._txn() as db:
            store._schema_of(db)
            _lease.refuse_second_names(store.path)  # as acquire: a journal with a second name is refused before any lock
            if done:
                db.executemany("UPDATE cuaderno_queue SET done = 1 WHERE run_id = ?", [(run_id,) for run_id in done])
            record: str | None = None
            written: list[tuple[int, str, str]] = []
            for run_id in run_ids:
                row = db.execute("SELECT epoch, owner, status FROM cuaderno_runs WHERE run_id=?",
                                 (run_id,)).fetchone() if store._id_ok(run_id) else None
                if row is None or row[2] in CLOSED_STATUSES:
                    out.stale.append(run_id)
                    continue
                had = run_id in store._taken
                # Under the write lock, as acquire: two takers cannot both find the run free.
                if not _lease.take(store.path, run_id, _lease.parse(row[1]), store._ident, at=at):
                    out.lost.append(run_id)
                    continue
                if not had:
                    locked.append(run_id)
                if record is None:  # one process, one hold file: the same record for every run
                    record = _lease.claim(owner, _lease.hold_file(store.path, at=at))
                epoch = next_epoch(run_id, row[0])
                written.append((epoch, record, run_id))
                out.taken.append((run_id, epoch))
            if written:  # every run's row in one statement's loop (the same transaction as before)
                db.executemany("UPDATE cuaderno_runs SET epoch=?, owner=? WHERE run_id=?", written)
                for _, _, run_id in written:
                    store._cache.pop(run_id, None)  # this connection changed the row: the cached epoch is stale
            if out.taken:
                faults.point("queue.C0")  # every run picked locked and its row written, before COMMIT
    except BaseException:
        for run_id in locked:
            _lease.unlock(store.path, run_id, at=at)
        raise
    for run_id, epoch in out.taken:
        store._taken[run_id] = epoch
    return out


def _postgres(store: PostgresCheckpointer, run_ids: list[str], owner: str, done: list[str]) -> Takeovers:
    out = Takeovers()
    wanted = sorted(r for r in run_ids if storable(r))  # rows locked in one order: no deadlock between claimers
    locked: list[str] = []
    earlier: dict[str, list[_lease.Holder]] = {}
    try:
        with store._txn() as cur:
            store._schema_of(cur)
            if done:
                cur.execute("UPDATE cuaderno_queue SET done = true WHERE run_id = ANY(%s)", (done,))
            # The server's start (for _restart_grace) rides on every row: one statement, not two.
            found = cur.execute(
                "SELECT run_id, epoch, owner, status, checkpoint, pg_postmaster_start_time()::text, "
                "extract(epoch FROM now() - pg_postmaster_start_time())::float8 FROM cuaderno_runs "
                "WHERE run_id = ANY(%s) ORDER BY run_id FOR UPDATE", (wanted,)).fetchall() if wanted else []
            rows: dict[str, Any] = {r[0]: r[1:5] for r in found}
            server, up_s = (found[0][5], found[0][6]) if found else ("", 0.0)  # no row: every run is stale
            open_runs = [r for r in run_ids if r in rows and rows[r][2] not in CLOSED_STATUSES]
            held_before = {r for r in open_runs if r in store._locked}
            # Every open run's lock asked for by one statement (with its row locked, as acquire),
            # not one statement per run.
            got = _lock_runs(store, open_runs)
            locked = [r for r in open_runs if got[r] and r not in held_before]  # given back if this fails
            written: list[tuple[str, int, str]] = []
            for run_id in run_ids:
                row = rows.get(run_id)
                if row is None or row[2] in CLOSED_STATUSES:
                    out.stale.append(run_id)
                    continue
                if not got[run_id]:
                    out.lost.append(run_id)
                    continue
                holder = _lease.parse(row[1])
                if run_id not in held_before:
                    try:
                        store._restart_grace(run_id, holder, server, float(up_s))
                    except RunBusy:  # its holder may still take its lock back after a restart
                        locked.remove(run_id)
                        store._unlock_run(run_id)
                        out.lost.append(run_id)
                        continue
                unsettled = store._unsettled(run_id, holder, row[3], force=run_id in store._taken)
                epoch = next_epoch(run_id, row[0])
                written.append((run_id, epoch, _lease.claim(owner, server=server, unsettled=unsettled)))
                earlier[run_id] = unsettled
                out.taken.append((run_id, epoch))
                out.summaries[run_id] = row[3]
            _write_holders(store, cur, written)
            if out.taken:
                faults.point("queue.C0")  # every run picked locked and its row written, before COMMIT
    except BaseException:
        for run_id in locked:
            store._unlock_run(run_id)
        raise
    records = {run_id: record for run_id, _, record in written}
    for run_id, epoch in out.taken:
        store._taken[run_id] = epoch
        store._records[run_id] = (epoch, records[run_id])  # what its release marks let go
        if earlier[run_id]:
            store._earlier[run_id] = earlier[run_id]
        else:
            store._earlier.pop(run_id, None)
    return out


def _write_holders(store: PostgresCheckpointer, cur: Any, written: list[tuple[str, int, str]]) -> None:
    """Each run's new epoch and holder record (``(run_id, epoch, record)``), by one statement per
    record, not per run: the runs of a claim nearly always share one (earlier holders differ
    only after a takeover from a live-looking one). The record goes as a parameter of its own:
    in a ``text[]`` psycopg escapes every one of its quotes with a regular expression."""
    by_record: dict[str, list[tuple[str, int]]] = {}
    for run_id, epoch, record in written:
        by_record.setdefault(record, []).append((run_id, epoch))
    for record, runs in by_record.items():
        cur.execute("UPDATE cuaderno_runs AS r SET epoch = v.epoch, owner = %s "
                    "FROM unnest(%s::text[], %s::bigint[]) AS v(run_id, epoch) WHERE r.run_id = v.run_id",
                    (record, [r for r, _ in runs], [e for _, e in runs]))
    if written:
        with store._cache_lock:
            for run_id, _, _ in written:
                store._cache.pop(run_id, None)  # this store changed the rows: the cached epochs are stale


def _lock_runs(store: PostgresCheckpointer, run_ids: list[str]) -> dict[str, bool]:
    """Each run's advisory lock taken on the store's lock connection, as ``_lock_run`` takes one
    (``False``: someone holds it), by one statement for all of them: a run this store holds
    already counts as taken once the connection answers (locks stack; it is not asked again)."""
    import psycopg

    if not run_ids:
        return {}
    with store._holds_lock:
        for attempt in (1, 2):
            conn = store._holds_connection()
            fresh = [r for r in run_ids if r not in store._locked]
            try:
                if fresh:
                    got = [bool(g) for (g,) in conn.execute(
                        "SELECT pg_try_advisory_lock(k) FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(k, i) ORDER BY i",
                        ([store._lock_key(r) for r in fresh],)).fetchall()]
                else:  # all held already: is the connection still alive?
                    conn.execute("SELECT 1")
                    got = []
            except psycopg.OperationalError:
                # The lock connection died (and with it every lock it held): open a new one.
                store._drop_holds()
                if attempt == 2:
                    raise
                continue
            taken = dict.fromkeys(run_ids, True)
            for run_id, ok in zip(fresh, got, strict=True):
                taken[run_id] = ok
                if ok:
                    store._locked.add(run_id)
            return taken
    return {}  # not reached
