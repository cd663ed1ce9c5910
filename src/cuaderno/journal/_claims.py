"""What a worker (and ``cuaderno status``) asks of a journal: which runs need progress, and who
holds a run now. Shared by the backends' :class:`~cuaderno.journal.base.SupportsClaims` methods.

Three questions, kept apart because they have different owners:

- *Does this run need a process to move it on?* A pure function of its checkpoint
  (:func:`work_for`): a ``running`` run, a run whose cancellation was asked and not yet closed, a
  cancelled run whose record schedules compensations. A run waiting for a person (an approval, an
  uncertain effect to settle) does not: nothing a worker can do moves it.
- *Does a live process hold it?* The backend's business (``holders``): on SQLite the record lock
  of the run's byte in ``<journal>-holds`` (probed here with ``F_GETLK``, which takes nothing, so
  a probe never makes a real resumer meet :class:`~cuaderno.errors.RunBusy`); on PostgreSQL the
  server's advisory lock table; in memory, nobody (one process holds the store).
- *What does it wait for?* :func:`state_of` puts the two together for people: a run whose status
  is ``running`` while no process holds it is *waiting for a worker*, never shown as running.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from typing import Any, Final

from cuaderno.checkpoint import Checkpoint
from cuaderno.events.payloads import PendingApproval
from cuaderno.journal import _lease

try:
    import fcntl
except ImportError:  # no record locks: the holder named in the journal is asked about instead
    fcntl = None  # type: ignore[assignment]

__all__ = ["cleanup_scheduled", "describe_holder", "held_by_lock", "live_holder", "state_of", "work_for"]

_FLOCK: Final = "hh4xqqi4x"
"""Linux's ``struct flock`` on 64-bit machines: type, whence, start, len, pid (with the padding
the C compiler puts there). Elsewhere the probe answers "cannot tell"."""


def cleanup_scheduled(cp: Checkpoint) -> bool:
    """Whether a cancelled run's record schedules compensations (some may remain to run)."""
    if cp.status != "cancelled" or not isinstance(cp.outcome, dict):
        return False
    cleanup = cp.outcome.get("cleanup")
    return isinstance(cleanup, list) and bool(cleanup)


def work_for(cp: Checkpoint) -> str | None:
    """What a worker would do for this run, from its checkpoint alone: ``"resume"`` (drive it with
    the loop: it runs, or its cancellation is to be closed), ``"compensate"`` (a cancelled run's
    scheduled cleanup; whether any remains needs its journal), or ``None`` (it ended, or it waits
    for a person: an approval, or an effect nobody can know happened)."""
    if cp.status == "running":
        return "resume"
    if cp.status in ("suspended", "needs_human"):
        # Waiting for a person, unless someone cancelled it meanwhile and its holder let it go
        # before closing it: the loop closes it on opening (cancel() usually does it itself).
        return "resume" if cp.cancel_requested is not None else None
    if cleanup_scheduled(cp):
        return "compensate"
    return None


def live_holder(journal: str, run_id: str, stored_owner: str | None) -> dict[str, Any] | None:
    """The live holder of a run of a SQLite journal, or ``None``.

    The run's lock byte answers when this machine has record locks (the kernel dropped it if the
    holder died); the process holding it is named by the lock, and described from the journal's
    record. Without locks (no ``fcntl``, ``:memory:``), the recorded holder's liveness is asked, as
    ``acquire`` does.
    """
    holder = _lease.parse(stored_owner)
    probed = _probe(journal, run_id)
    if probed is None:  # cannot tell from the lock: the journal's record, as acquire reads it
        if holder is None or not holder.get("held"):
            return None
        return holder if _lease.is_alive(holder) or _lease.is_mine(holder) else None
    if probed == 0:
        return None
    if holder is not None and holder.get("process", {}).get("pid") == probed:
        return holder
    return {"owner": holder.get("owner") if holder else None, "process": {"pid": probed, "host": None}}


def held_by_lock(journal: str, run_ids: Iterable[str]) -> set[str] | None:
    """Which of these runs of a SQLite journal a live process holds, from their lock bytes alone
    (``None``: this machine cannot tell; ask :func:`live_holder` with the journal's record).

    What a claim needs, and only that: the holders are not described, so no record is read and
    the hold file's path is resolved once for all the runs, not once per run (a claim of a fleet
    probes every run the other workers hold)."""
    if fcntl is None or journal == ":memory:" or not hasattr(fcntl, "F_GETLK") or struct.calcsize(_FLOCK) != 32:
        return None
    path = os.path.realpath(journal) + "-holds"
    held: set[str] = set()
    with _lease._files_lock:
        fd, mine = _lease._files.get(path) or (-1, set())
        own = fd < 0  # this process holds no lock in the file: a descriptor of its own is safe to close
        if own:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                return held  # nobody ever took a run of this journal on this machine
            except OSError:
                return None
        try:
            for run_id in run_ids:
                if run_id in mine:
                    held.add(run_id)
                    continue
                try:
                    answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET,
                                                                         _lease._byte(run_id), 1, 0))
                except OSError:
                    return None
                if struct.unpack(_FLOCK, answer)[0] != fcntl.F_UNLCK:
                    held.add(run_id)
        finally:
            if own:
                os.close(fd)
    return held


def _probe(journal: str, run_id: str) -> int | None:
    """The PID holding the run's lock byte (0: nobody), or ``None`` (cannot tell here).

    Never takes the lock. The descriptor it opens is the one :mod:`._lease` keeps for the file when
    this process holds runs in it: closing any other descriptor of that file would drop every
    lock this process holds there (POSIX record locks belong to the process, not the descriptor).
    So a new descriptor is opened and closed only while this process holds no lock in the file,
    under the same lock ``_lease.lock`` takes to add one.
    """
    if fcntl is None or journal == ":memory:" or not hasattr(fcntl, "F_GETLK") or struct.calcsize(_FLOCK) != 32:
        return None
    path = os.path.realpath(journal) + "-holds"
    offset = _lease._byte(run_id)
    with _lease._files_lock:
        fd, runs = _lease._files.get(path) or (-1, set())
        if run_id in runs:
            return os.getpid()
        own = fd < 0
        if own:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                return 0  # nobody ever took a run of this journal on this machine
            except OSError:
                return None
        try:
            answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
        except OSError:
            return None
        finally:
            if own:
                os.close(fd)
    kind, _, _, _, pid = struct.unpack(_FLOCK, answer)
    return 0 if kind == fcntl.F_UNLCK else int(pid)


def describe_holder(holder: dict[str, Any]) -> str:
    """Who holds a run, for people: its owner label, process and host."""
    proc = holder.get("process") or {}
    where = f"process {proc.get('pid')}" + (f" on {proc.get('host')}" if proc.get("host") else "")
    owner = holder.get("owner")
    return f"{owner!s:.80} ({where})" if owner else where


def state_of(cp: Checkpoint, holder: dict[str, Any] | None, *, cleanup_left: int | None = None) -> dict[str, Any]:
    """What a run is doing now, for ``cuaderno status``/``show``/``list``: ``state`` (``running``
    only while a live process holds it; ``waiting``, or the status of a run that ended),
    ``waiting_for`` (what would move it on), ``held_by`` and a one-line ``summary``.

    ``cleanup_left``: for a cancelled run, the compensations not yet run (``None``: unknown).
    """
    held_by = describe_holder(holder) if holder is not None else None
    work = work_for(cp)
    if holder is not None and work is not None:
        doing = "closing its cancellation" if cp.cancel_requested is not None and cp.status != "cancelled" else (
            "running its compensations" if work == "compensate" else "running")
        return {"state": "running", "waiting_for": None, "held_by": held_by, "summary": f"{doing}, held by {held_by}"}
    waiting: str | None = None
    if work == "resume":
        waiting = "a worker to close its cancellation" if cp.cancel_requested is not None else "a worker"
    elif work == "compensate" and cleanup_left != 0:
        n = "its" if cleanup_left is None else f"{cleanup_left}"
        waiting = f"a worker to run {n} compensation{'s' if cleanup_left != 1 else ''}"
    elif cp.status == "suspended":
        waiting = "approval of " + ", ".join(_pending(cp.pending.items()))
    elif cp.status == "needs_human":
        waiting = "a person to settle " + ", ".join(sorted(cp.uncertain)) + " (cuaderno resolve)"
    if waiting is None:
        return {"state": cp.status, "waiting_for": None, "held_by": held_by, "summary": cp.status}
    verb = "waiting for" if waiting.startswith("a worker") else "waits for"
    state = "cancelled" if cp.status == "cancelled" else "waiting"
    return {"state": state, "waiting_for": waiting, "held_by": held_by, "summary": f"{verb} {waiting}"}


def _pending(entries: Iterable[tuple[str, PendingApproval]]) -> list[str]:
    return [f"{step_id} ({entry.get('tool')})" if entry.get("tool") else step_id for step_id, entry in sorted(entries)]
