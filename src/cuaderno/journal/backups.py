"""Backups of a SQLite journal, and restores the rollback check knows for what they are.

**Backup** (:func:`backup`): SQLite's online backup API (``sqlite3.Connection.backup``) copies the
journal while workers write to it. In one step (``pages=-1``): the copy is then one read
transaction's snapshot, which in WAL mode never blocks a writer; a copy in several steps would
restart from its first page every time another process commits, and under steady writes might
never end. It is written to ``DEST.partial`` beside ``DEST``, stamped (``cuaderno_meta``:
``backup_of``, ``backup_at``, ``backup_last_row``), synced, checked (every run's hash chain, and
its summary against its journal) and only then renamed to ``DEST``: a ``DEST`` is always a whole,
verified copy. An existing ``DEST`` is refused, left as it was. A journal encrypted at rest is
copied as it rests (sealed); checking the copy and restoring it need its key, read from the
environment (``CUADERNO_KEY``, ``CUADERNO_KEY_FILE``).

**Restore** (:func:`restore`): copying an older journal over a newer one is exactly what the anchor
(:mod:`cuaderno.journal._anchor`) refuses (:class:`~cuaderno.errors.JournalRolledBack`): the runs
would go on from earlier steps and do again what they did after the copy was made. A restore says
explicitly what happens to those runs (``runs_after_backup``):

- ``"needs-human"``: each run that may have moved past the backup point gets an ``uncertain``
  record at step ``restore`` with the evidence (the backup's time and the run's last event in the
  backup, and in the journal it replaces when that one is readable), so it is ``needs_human``: no
  worker claims it and a resume raises :class:`~cuaderno.errors.UncertainEffect`, never resuming it
  silently. Which runs: when the journal being replaced can be read, those whose last event there
  is later than in the backup; when it cannot (the usual reason to restore), every run the backup
  holds open (it may have done anything since). A person checks the systems the run acts on and
  then ends it (``cuaderno cancel RUN``: its compensations run) or goes on in a new run from a step
  they know (``cuaderno fork RUN --at STEP``). Not yet: settling the ``restore`` step with
  ``cuaderno resolve`` and resuming the same run (the loop does not know that step and refuses the
  resume with :class:`~cuaderno.errors.ReplayDivergence`; nothing is written).
- ``"accept"``: nothing is marked: the runs go on from the backup's steps, and effects done after it
  may be done again (as ``accept_rollback=True``).

Then the journal is replaced (the one it replaces is kept, renamed ``JOURNAL.before-restore-<time>``
with its ``-wal``: nothing is lost; a restore killed before the restored journal is in place leaves
the path empty, and is simply run again), the anchor is moved to the restored journal's last row (so the
next open does not refuse it; a *later* rollback is refused as before), and the restore is recorded
in the journal's ``cuaderno_meta`` (``restored``: from which backup, when, the choice, the runs
marked, the runs the replaced journal held that the backup lacks). Workers must be stopped: a run a
live process holds in the journal being replaced refuses the restore
(:class:`~cuaderno.errors.RunBusy`), nothing changed.

PostgreSQL has no anchor and no online copy here: ``pg_dump --schema`` / ``pg_restore`` (see
``docs/guide/retention-and-backups.md``), then :func:`mark_runs` through
:func:`cuaderno.operations.mark_restored` (``cuaderno mark-restored``) before workers start.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from cuaderno import faults
from cuaderno.errors import JournalError, RunBusy, UsageError, quoted
from cuaderno.events import RESTORE_STEP, StepEvent
from cuaderno.journal import _anchor, _claims
from cuaderno.journal._anchor import INCARNATION_META
from cuaderno.journal.base import Checkpointer
from cuaderno.journal.keys import KeyProvider, environment_keys

__all__ = ["RESTORE_STEP", "BackupReport", "RestoreReport", "Uncertain", "backup", "mark_runs", "restore", "restore_record",
           "restored_record"]



@dataclass
class BackupReport:
    """What :func:`backup` copied and checked."""

    source: str
    dest: str
    bytes: int
    runs: int
    events: int
    seconds: float
    backup_at: float
    last_row: tuple[int, str] | None


@dataclass
class RestoreReport:
    """What :func:`restore` did."""

    journal: str
    backup: str
    choice: str
    marked: list[str] = field(default_factory=list)
    """Runs given the ``uncertain`` record (``needs-human``)."""
    lost: list[str] = field(default_factory=list)
    """Runs the replaced journal held and the backup does not (started after it): kept only in the
    replaced journal, renamed aside."""
    kept_aside: str | None = None
    """Where the replaced journal now is."""
    replaced_readable: bool = False
    """Whether the replaced journal could be read (else every open run of the backup was marked)."""


def _sqlite_path(path: str | os.PathLike[str], what: str) -> str:
    if not isinstance(path, (str, os.PathLike)) or not str(path) or str(path) == ":memory:":
        raise UsageError(f"{what} must be a SQLite file path, got {path!r:.80}")
    return str(path)


def _verify(path: str, keys: KeyProvider | None) -> tuple[int, int]:
    """Every run of the journal at ``path`` checked (chain and summary); ``(runs, events)``."""
    from cuaderno.checkpoint import verified
    from cuaderno.journal.sqlite import SqliteCheckpointer

    runs = events = 0
    with SqliteCheckpointer(path, readonly=True, accept_rollback=True, keys=keys) as store:
        for cp in store.list_runs(limit=2**62):
            _, evs = verified(store, cp.run_id)
            runs += 1
            events += len(evs)
    return runs, events


def _meta(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM cuaderno_meta WHERE key=?", (key,)).fetchone()
    return None if row is None else str(row[0])


def backup(journal: str | os.PathLike[str], dest: str | os.PathLike[str], *,
           keys: KeyProvider | None = None) -> BackupReport:
    """Copy a SQLite journal to ``dest`` while it is written, and check the copy (see the module).
    ``keys``: the master keys of an encrypted journal (``None``: the environment's, as
    :func:`cuaderno.open_journal` takes them); the copy stays sealed, and is checked with them.

    Raises:
        KeyMissing, KeyInvalid: an encrypted journal and no key, or not its key; no copy is left.
        UsageError: ``dest`` exists, or a path is not a SQLite file; nothing was written.
        JournalError: the source is not a cuaderno journal, or the copy does not verify (the
            partial copy is removed).
    """
    src_path, dst_path = _sqlite_path(journal, "the journal"), _sqlite_path(dest, "the backup")
    if not os.path.isfile(src_path):
        raise UsageError(f"no journal file at {quoted(src_path)}; nothing was written")
    if os.path.lexists(dst_path):
        raise UsageError(f"{quoted(dst_path)} exists; a backup never overwrites a file; nothing was written")
    partial = dst_path + ".partial"
    for suffix in ("", "-wal", "-shm", "-anchor"):
        if os.path.lexists(partial + suffix):
            os.unlink(partial + suffix)  # a backup killed before its rename
    started = time.perf_counter()
    src = sqlite3.connect(f"{_uri(src_path)}?mode=ro", uri=True, isolation_level=None, timeout=30)
    dst = sqlite3.connect(partial, isolation_level=None)
    try:
        if src.execute("SELECT 1 FROM sqlite_master WHERE name='cuaderno_meta'").fetchone() is None:
            raise JournalError(f"{quoted(src_path)} is not a cuaderno journal; nothing was written")
        src.backup(dst)  # one step: one snapshot, never restarted by a writer (see the module)
        last = _anchor.last_row(dst)
        backup_at = time.time()
        dst.execute("PRAGMA journal_mode=DELETE")  # one file: nothing of the copy lives in a -wal
        dst.executemany("INSERT OR REPLACE INTO cuaderno_meta (key, value) VALUES (?, ?)",
                        [("backup_of", os.path.realpath(src_path)), ("backup_at", repr(backup_at)),
                         ("backup_last_row", json.dumps(list(last) if last else None))])
    except BaseException:
        dst.close()
        src.close()
        _remove(partial)
        raise
    dst.close()
    src.close()
    try:
        runs, events = _verify(partial, keys or environment_keys())
        _remove(partial + "-anchor")
        with open(partial, "rb+") as f:
            os.fsync(f.fileno())
        faults.point("backup.C1")  # the copy written, checked and synced, not yet at DEST
        os.rename(partial, dst_path)
        _sync_dir(dst_path)
    except BaseException:
        _remove(partial)
        raise
    return BackupReport(source=src_path, dest=dst_path, bytes=os.path.getsize(dst_path), runs=runs, events=events,
                        seconds=round(time.perf_counter() - started, 4), backup_at=backup_at, last_row=last)


def restore(backup_path: str | os.PathLike[str], journal: str | os.PathLike[str], *,
            runs_after_backup: Literal["needs-human", "accept"], uncertain: Uncertain,
            keys: KeyProvider | None = None) -> RestoreReport:
    """Put the backup at ``journal``'s path as a restore the rollback check knows (see the module).
    ``keys``: as for :func:`backup`.

    Raises:
        KeyMissing, KeyInvalid: an encrypted backup and no key, or not its key; nothing was changed.
        UsageError: a choice other than ``"needs-human"`` or ``"accept"``, or a file that is not a
            backup made by :func:`backup`; nothing was changed.
        RunBusy: a live process holds a run of the journal being replaced; nothing was changed.
        JournalCorrupt: the backup does not verify; nothing was changed.
    """
    if runs_after_backup not in ("needs-human", "accept"):
        raise UsageError(f"runs_after_backup must be 'needs-human' or 'accept', got {runs_after_backup!r:.40}: say "
                         "what happens to runs that went on after the backup; nothing was changed")
    src, dst = _sqlite_path(backup_path, "the backup"), _sqlite_path(journal, "the journal")
    if not os.path.isfile(src):
        raise UsageError(f"no backup file at {quoted(src)}; nothing was changed")
    with sqlite3.connect(f"{_uri(src)}?mode=ro", uri=True) as db:
        has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE name='cuaderno_meta'").fetchone()
        backup_at = _meta(db, "backup_at") if has_meta else None
    db.close()
    if backup_at is None:
        raise UsageError(f"{quoted(src)} is not a backup made by cuaderno backup (it records no backup point); "
                         "nothing was changed")
    keys = keys or environment_keys()
    _verify(src, keys)
    report = RestoreReport(journal=dst, backup=src, choice=runs_after_backup)
    now_seqs = _current(dst, keys)  # raises RunBusy while a live process holds one of its runs
    report.replaced_readable = now_seqs is not None
    tmp = dst + ".restoring"
    for suffix in ("", "-wal", "-shm", "-anchor"):
        _remove(tmp + suffix)
    with sqlite3.connect(f"{_uri(src)}?mode=ro", uri=True) as s, sqlite3.connect(tmp) as t:
        s.backup(t)
    s.close()
    t.close()
    try:
        _mark(tmp, src, float(backup_at), now_seqs, report, uncertain, keys)
    except BaseException:
        for suffix in ("", "-wal", "-shm", "-anchor"):
            _remove(tmp + suffix)
        raise
    # A -wal or -shm without its file too (the file deleted, its -wal left): beside the restored file
    # it would be read as part of it (SQLite: "database disk image is malformed").
    if any(os.path.exists(dst + suffix) for suffix in ("", "-wal", "-shm")):
        report.kept_aside = f"{dst}.before-restore-{time.strftime('%Y%m%dT%H%M%S')}"
        for suffix in ("-wal", "-shm", ""):  # the file last: a -wal left behind alone belongs to nothing
            if os.path.exists(dst + suffix):
                os.rename(dst + suffix, report.kept_aside + suffix)
    for suffix in ("-wal", "-shm"):
        _remove(tmp + suffix)
    faults.point("restore.R1")  # the replaced journal renamed aside, the restored one not yet in place
    os.rename(tmp, dst)
    _remove(tmp + "-anchor")
    _sync_dir(dst)
    last = _last_row(dst)
    anchor = _anchor.Anchor(dst)
    if last is None:
        anchor.reset()
    else:
        anchor.write(*last)  # the restored journal is now the one this machine knows at this path
    anchor.close()
    return report


def _current(path: str, keys: KeyProvider | None) -> dict[str, int] | None:
    """The journal being replaced, per run its last seq; ``None`` when it cannot be read (missing,
    damaged). Refuses (RunBusy) while a live process holds one of its runs."""
    from cuaderno.journal.sqlite import SqliteCheckpointer

    if not os.path.isfile(path):
        return None
    try:
        store = SqliteCheckpointer(path, readonly=True, accept_rollback=True, keys=keys)
    except JournalError:
        return None
    try:
        runs = store.list_runs(limit=2**62)
        held = store.holders([cp.run_id for cp in runs])
        if held:
            run_id, holder = next(iter(held.items()))
            raise RunBusy(run_id, f"{_claims.describe_holder(holder)}, which is still alive: stop the workers "
                                  "before a restore; nothing was changed")
        return {cp.run_id: cp.last_seq for cp in runs}
    finally:
        store.close()


Uncertain = Callable[[str, dict[str, Any]], StepEvent]
"""Builds the ``uncertain`` record of a run a restore marks (``cuaderno.durable`` owns how a tool
step's uncertainty is written: :func:`cuaderno.durable.effect.restore_uncertain`)."""


def _mark(tmp: str, src: str, backup_at: float, now_seqs: dict[str, int] | None, report: RestoreReport,
          uncertain: Uncertain, keys: KeyProvider | None) -> None:
    """In the copy about to become the journal: the uncertain records and the restore's record."""
    from cuaderno.journal.sqlite import SqliteCheckpointer

    with SqliteCheckpointer(tmp, accept_rollback=True, keys=keys) as store:
        mark_runs(store, report, src, backup_at, now_seqs, uncertain)
        with store._txn() as db:
            db.execute("DELETE FROM cuaderno_meta WHERE key IN ('backup_of', 'backup_at', 'backup_last_row')")
        store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        store._db.execute("PRAGMA journal_mode=WAL")


def mark_runs(store: Checkpointer, report: RestoreReport, src: str, backup_at: float | None,
              now_seqs: dict[str, int] | None, uncertain: Uncertain) -> None:
    """Mark the runs of a restored journal that may have gone on after its backup (``report.choice``
    ``"needs-human"``; see the module), and record the restore in its ``cuaderno_meta``
    (``restored``, the last 20). ``now_seqs``: per run, its last seq in the journal the restore
    replaced, when that one could be read (else every open run is marked). Either backend: a
    PostgreSQL journal restored with ``pg_restore`` is marked by :func:`cuaderno.operations.mark_restored`."""
    from cuaderno.journal.base import CLOSED_STATUSES

    runs = {cp.run_id: cp for cp in store.list_runs(limit=2**62)}
    if now_seqs is not None:
        report.lost = sorted(set(now_seqs) - set(runs))
    if report.choice == "needs-human":
        for run_id, cp in sorted(runs.items()):
            later = None if now_seqs is None else now_seqs.get(run_id)
            moved = (later is not None and later > cp.last_seq) if now_seqs is not None else (
                cp.status not in CLOSED_STATUSES)
            if not moved or RESTORE_STEP in cp.uncertain:
                continue
            store.append([uncertain(run_id, {
                "tool": None, "effect_key": None, "restored_from": src, "backup_at": backup_at,
                "backup_last_seq": cp.last_seq, "journal_last_seq": later,
                "reason": "the journal was restored from a backup; this run may have gone on after it (its effects "
                          f"after event {cp.last_seq} may have happened): check the systems it acts on, then end it "
                          "(cuaderno cancel RUN) or go on in a new run from a step you know (cuaderno fork)"})])
            report.marked.append(run_id)
    record = {"from": src, "backup_at": backup_at, "restored_at": time.time(), "runs_after_backup": report.choice,
              "marked": report.marked, "runs_not_in_backup": report.lost,
              "replaced_journal_readable": report.replaced_readable}
    postgres = not hasattr(store, "path")
    with store._txn() as db:  # type: ignore[attr-defined]
        row = db.execute("SELECT value FROM cuaderno_meta WHERE key=%s" if postgres else
                         "SELECT value FROM cuaderno_meta WHERE key=?", ("restored",)).fetchone()
        history = json.loads(row[0]) if row is not None else []
        value = json.dumps([*(history if isinstance(history, list) else []), record][-20:])
        if postgres:
            db.execute("INSERT INTO cuaderno_meta (key, value) VALUES ('restored', %s) ON CONFLICT (key) DO UPDATE "
                       "SET value = excluded.value", (value,))
            # With the record, in its transaction: the restored tables are now the journal's own, and
            # the next open (a worker's) is no longer refused as a restore.
            db.execute("INSERT INTO cuaderno_meta (key, value) VALUES (%s, to_regclass('cuaderno_events')::oid::text) "
                       "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (INCARNATION_META,))
        else:
            db.execute("INSERT OR REPLACE INTO cuaderno_meta (key, value) VALUES ('restored', ?)", (value,))


def restored_record(store: Checkpointer) -> list[dict[str, Any]]:
    """The restores an open journal records (either backend; oldest first)."""
    postgres = not hasattr(store, "path")
    with store._reader("*") as db:  # type: ignore[attr-defined]
        row = db.execute("SELECT value FROM cuaderno_meta WHERE key=%s" if postgres else
                         "SELECT value FROM cuaderno_meta WHERE key=?", ("restored",)).fetchone()
    found = json.loads(row[0]) if row is not None else []
    return found if isinstance(found, list) else []


def restore_record(journal: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The restores a journal records (oldest first; empty when it was never restored)."""
    path = _sqlite_path(journal, "the journal")
    with sqlite3.connect(f"{_uri(path)}?mode=ro", uri=True) as db:
        value = _meta(db, "restored")
    db.close()
    found = json.loads(value) if value else []
    return found if isinstance(found, list) else []


def _last_row(path: str) -> tuple[int, str] | None:
    with sqlite3.connect(f"{_uri(path)}?mode=ro", uri=True) as db:
        last = _anchor.last_row(db)
    db.close()
    return last


def _uri(path: str) -> str:
    from pathlib import Path

    return Path(path).resolve().as_uri()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _sync_dir(path: str) -> None:
    """The rename made durable (the directory's entry synced)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
