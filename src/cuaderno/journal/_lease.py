"""Who holds a run, and whether that process is still alive.

Fencing alone (an epoch bumped by every takeover, checked in the intent/result transaction)
refuses a superseded owner's *next write*, but its step in flight — a model call, a tool body —
still completes. If a second process could take a live run over, it would find that step's
intent without a result and run it again. So a takeover is refused while the holder is alive.

A SQLite journal is shared only by processes of one machine (WAL needs shared memory), so
liveness is asked of the operating system, not inferred from a clock: the holder keeps a POSIX
record lock on one byte per run of a file beside the journal (``<journal>-holds``), and the
kernel drops it when the holder dies, whatever killed it and in whichever container it ran. A
killed holder is therefore taken over at once, with no lease to wait out; a live one (even a
stopped one) keeps the run until it releases it, or until someone takes it over with ``force``.
Where such locks are not available (no ``fcntl``, a journal in memory, a file that cannot be
created), the holder named in the journal is asked about instead: same host and PID namespace,
its PID and the process's start time (a recycled PID has another start time); a holder that
cannot be checked that way counts as alive.

A holder releases the run when its loop stops for any reason (completed, suspended, failed,
cancelled, or an exception), so a process that is still alive does not block a later resume
elsewhere (a web server that ran a run until it waited for a person, say).

The lock alone can be got around by changing files under it (RELIABILITY R22), so the hold is
tied to the files' identities (``st_dev``, ``st_ino``), and a free lock is believed only for the
file it was taken in:

- a holder records, with its process (host, PID namespace, PID, start time, boot id), the
  identity of the hold file it locked. A taker that finds the run's byte free in *another* hold
  file (the holder's was deleted or replaced since) asks the operating system about that process
  instead, and a live one keeps the run (:class:`~cuaderno.errors.RunBusy`);
- the hold file names the journal file it serves (its identity, at its start), and every process
  that holds a run through it keeps a shared lock on its byte 0. A journal at that path whose
  identity is another one (the file was replaced or deleted) is refused while anyone still holds a
  run of the file it replaced (:class:`~cuaderno.errors.JournalReplaced`), before anything is
  written into it; once nobody does, the hold file is rebound to the new file;
- a journal file with a second name (``st_nlink > 1``) is refused
  (:class:`~cuaderno.errors.JournalLinked`): each name would have its own hold file, and its own
  ``-wal``.

What this cannot see: the journal *and* its hold file replaced together (a new directory, say) is
a new journal, which knows nothing of the runs of the old one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import threading
from functools import cache, lru_cache
from typing import Any

from cuaderno.errors import JournalLinked, JournalReplaced
from cuaderno.journal._paths import stat_or_none

try:
    import fcntl
except ImportError:  # not on Windows: the holder named in the journal is asked about instead
    fcntl = None  # type: ignore[assignment]

__all__ = ["Holder", "Identity", "check_journal", "claim", "describe", "hold_file", "holds_path", "identity", "is_alive",
           "is_mine", "liveness", "lock", "parse", "released", "take", "this_process", "unlock"]

Identity = tuple[int, int]
"""A file's ``(st_dev, st_ino)``: which file a path names now."""

_HEADER = 64
"""Bytes at the start of a hold file that name the journal file it serves (``dev ino``, padded).
Run bytes are locked at offsets derived from the run id, never read or written."""

_files: dict[str, tuple[int, set[str]]] = {}
"""Per lock file: its descriptor and the runs this process has locked in it. The descriptor is
closed when the last lock is given back (closing any descriptor of a file drops every POSIX lock
this process holds on it, so never while one is held)."""
_files_lock = threading.Lock()
_start_times: dict[int, int | None] = {}
"""This process's start time by PID (:func:`_started`), emptied in a forked child."""


def _after_fork() -> None:
    global _files_lock
    _files_lock = threading.Lock()  # a forked child holds none of its parent's record locks
    _files.clear()
    _start_times.clear()  # a child of this child may get a PID this process's parent had


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


@lru_cache(maxsize=8192)
def _byte(run_id: str) -> int:
    # Never 0 in practice (2**-56): byte 0 is the "holds runs of this journal" lock. Kept: a
    # claim of a fleet probes the byte of every run the other workers hold, at every claim.
    return int.from_bytes(hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).digest()[:7], "big")


def identity(path: str) -> Identity | None:
    """Which file ``path`` names now (``None``: none)."""
    st = stat_or_none(path)
    return None if st is None else (st.st_dev, st.st_ino)


def links(path: str) -> int:
    """How many names the file at ``path`` has (0: no file)."""
    st = stat_or_none(path)
    return 0 if st is None else st.st_nlink


def holds_path(journal: str) -> str:
    """The path of the journal's hold file, resolved now: a caller that locks many runs at once
    resolves it once (``os.path.realpath`` costs more than the lock) and passes it as ``at``."""
    return os.path.realpath(journal) + "-holds"


def _read_header(fd: int) -> Identity | None:
    try:
        text = os.pread(fd, _HEADER, 0).decode("ascii", "replace").split()
        return (int(text[0]), int(text[1])) if len(text) >= 2 else None
    except (OSError, ValueError):
        return None


def _write_header(fd: int, journal: Identity) -> None:
    os.pwrite(fd, f"{journal[0]} {journal[1]}".ljust(_HEADER - 1).encode("ascii") + b"\n", 0)


def _others_hold(fd: int, mine: bool) -> bool:
    """Whether another process holds runs through this hold file (a lock on its byte 0).
    ``mine``: this process holds some (its shared lock is given back as it was)."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return True
        raise
    fcntl.lockf(fd, fcntl.LOCK_SH if mine else fcntl.LOCK_UN, 1, 0, os.SEEK_SET)
    return False


def _bound(fd: int, journal: Identity, runs: set[str], path: str) -> None:
    """Check that the hold file serves this journal file, or rebind it when nobody holds runs of
    the one it named. Raises :class:`~cuaderno.errors.JournalReplaced` otherwise."""
    named = _read_header(fd)
    if named == journal:
        return
    if named is not None and (runs or _others_hold(fd, mine=bool(runs))):
        raise JournalReplaced(f"journal {path[:-len('-holds')]!r} is not the file whose runs are held (the hold "
                              f"file {path!r} serves file {named[0]}:{named[1]}, this one is {journal[0]}:"
                              f"{journal[1]}): it was replaced or deleted while a process still runs runs of the "
                              "old one; nothing was written. Stop that process (or let it finish), then open it "
                              "again")
    _write_header(fd, journal)  # a new hold file, or the old journal's holders are all gone


def check_journal(journal: str, ident: Identity | None) -> None:
    """Refuse to open a journal file that replaced (or, ``ident`` ``None``, deleted) the one whose
    runs a live process still holds (:class:`~cuaderno.errors.JournalReplaced`). Creates nothing."""
    if fcntl is None or journal == ":memory:":
        return
    path = holds_path(journal)
    with _files_lock:
        fd, runs = _files.get(path) or (-1, set())
        opened = fd < 0
        if opened:
            try:
                fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return  # no hold file (or not ours to open): nobody holds runs through it
        try:
            named = _read_header(fd)
            if named is None or named == ident:
                return
            if runs or _others_hold(fd, mine=bool(runs)):
                what = "deleted" if ident is None else "replaced"
                raise JournalReplaced(f"journal {journal!r} was {what} while a process still runs runs of the file "
                                      f"it was ({named[0]}:{named[1]}, named in {path!r}); nothing was written. "
                                      "Stop that process (or let it finish), then open it again")
        finally:
            if opened:
                os.close(fd)


def hold_file(journal: str, *, at: str | None = None) -> Identity | None:
    """The identity of the hold file this process locks the journal's runs in (``None``: none).
    ``at``: the hold file's path, when the caller resolved it already (:func:`holds_path`)."""
    with _files_lock:
        fd, _ = _files.get(at or holds_path(journal)) or (-1, set())
        if fd < 0:
            return None
        st = os.fstat(fd)
        return st.st_dev, st.st_ino


def lock(journal: str, run_id: str, ident: Identity | None = None, *, at: str | None = None) -> bool | None:
    """Take the run's lock for this process: ``True`` (taken, or this process had it),
    ``False`` (a live process holds it), ``None`` (no such locks here: ask :func:`is_alive`).

    ``ident``, the journal file's identity, is checked against the one the hold file serves
    (:class:`~cuaderno.errors.JournalReplaced` when it serves another file still held). ``at``:
    the hold file's path, when the caller resolved it already (:func:`holds_path`)."""
    if fcntl is None or journal == ":memory:":
        return None
    path = at or holds_path(journal)
    with _files_lock:
        fd, runs = _files.get(path) or (-1, set())
        if fd < 0:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError:
                return None
        try:
            if ident is not None:
                _bound(fd, ident, runs, path)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _byte(run_id), os.SEEK_SET)
            if not runs:
                fcntl.lockf(fd, fcntl.LOCK_SH, 1, 0, os.SEEK_SET)  # "runs of this journal are held"
        except OSError as exc:
            if not runs:
                os.close(fd)
                _files.pop(path, None)
            return False if exc.errno in (errno.EACCES, errno.EAGAIN) else None
        except BaseException:
            if not runs:
                os.close(fd)
                _files.pop(path, None)
            raise
        runs.add(run_id)
        _files[path] = (fd, runs)
        return True


def unlock(journal: str, run_id: str, *, at: str | None = None) -> None:
    """Give the run's lock back (this process stopped running it). ``at``: the hold file's
    path, when the caller resolved it already (:func:`holds_path`)."""
    if fcntl is None or journal == ":memory:":
        return
    path = at or holds_path(journal)
    with _files_lock:
        fd, runs = _files.get(path) or (-1, set())
        if run_id not in runs:
            return
        runs.discard(run_id)
        if runs:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, _byte(run_id), os.SEEK_SET)
        else:
            os.close(fd)  # the last lock of this file: closing gives it back
            del _files[path]


Holder = dict[str, Any]
"""``{"owner": label, "process": {"host", "ns", "pid", "start", "boot"}, "held": bool, "holds": [dev, ino]}``
(``holds``: the hold file the holder locked the run in; absent where it took no such lock, and in
holds recorded by a cuaderno that kept none)."""


@cache
def _boot_id() -> str | None:
    """This boot of the machine: a PID and start time recorded before a reboot name no process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


@cache
def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks)`` of a process, or ``None`` when there is no such
    process (or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], int(fields[19])


def this_process() -> dict[str, Any]:
    """This process's identity."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "ns": _pid_namespace(), "pid": pid, "start": _started(pid),
            "boot": _boot_id()}


def _started(pid: int) -> int | None:
    """This process's start time (clock ticks), read from ``/proc`` once per PID: it never
    changes while the process lives, and a forked child has a PID of its own (a claim records
    this process as the holder of every run it takes: one read of ``/proc``, not one per run)."""
    if pid not in _start_times:
        stat = _stat(pid)
        _start_times[pid] = None if stat is None else stat[1]
    return _start_times[pid]


def claim(owner: str, holds: Identity | None = None, server: str | None = None,
          unsettled: list[Holder] | None = None) -> str:
    """The stored form of a hold taken by this process under the label ``owner`` (``holds``: the
    hold file it locked the run in; ``server``: when the database server that keeps its lock
    started, for a lock that a server's restart, not the holder's death, ended; ``unsettled``:
    earlier holders that may still be executing a step, each ``{"owner", "process", "seq"}``, its
    intents being those up to ``seq``: kept across takeovers and releases, see
    ``PostgresCheckpointer.earlier_holder``)."""
    value: dict[str, Any] = {"owner": owner, "process": this_process(), "held": True}
    if holds is not None:
        value["holds"] = list(holds)
    if server is not None:
        value["server"] = server
    if unsettled:
        value["unsettled"] = unsettled
    return json.dumps(value, sort_keys=True)


def released(stored: str | None) -> str | None:
    """The stored form of the same holder, released."""
    holder = parse(stored)
    if holder is None:
        return stored
    return json.dumps({**holder, "held": False}, sort_keys=True)


def parse(stored: str | None) -> Holder | None:
    """The holder recorded in the journal, or ``None`` (never taken, or a plain label written by
    a cuaderno that kept no process identity: nobody to wait for)."""
    if not stored:
        return None
    try:
        value = json.loads(stored)
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("process"), dict) else None


def liveness(holder: Holder) -> str:
    """What this process can prove about the holding process: ``"gone"`` (it no longer runs:
    this host's kernel says so, or it ran before this host's last boot), ``"alive"`` (it runs on
    this host, in this PID namespace, with the recorded start time) or ``"unknown"`` (another host
    or PID namespace, or a record without a PID: nothing here can prove either)."""
    proc = holder["process"]
    me = this_process()
    if proc.get("host") == me["host"] and proc.get("boot") and me["boot"] and proc.get("boot") != me["boot"]:
        return "gone"  # recorded on this host before its last boot: that process is gone
    if proc.get("host") != me["host"] or proc.get("ns") != me["ns"]:
        return "unknown"
    pid = proc.get("pid")
    if not isinstance(pid, int):
        return "unknown"
    if pid == me["pid"] and proc.get("start") == me["start"]:
        return "alive"
    stat = _stat(pid)
    if stat is None:
        if me["start"] is not None:
            return "gone"  # /proc works here and has no such process
        try:  # no /proc (macOS): a signal-0 probe; a recycled PID reads as alive (the safe side)
            os.kill(pid, 0)
        except ProcessLookupError:
            return "gone"
        except PermissionError:
            return "alive"
        return "alive"
    state, start = stat
    return "alive" if state not in ("Z", "X") and start == proc.get("start") else "gone"


def is_alive(holder: Holder) -> bool:
    """Whether the holding process may still be running its step. ``True`` when that cannot be
    known (another host or PID namespace): only a provably gone holder is taken over."""
    return liveness(holder) != "gone"


def is_mine(holder: Holder) -> bool:
    """Whether this process holds it (a resume from the same process takes it back at once)."""
    proc, me = holder["process"], this_process()
    return all(proc.get(k) == me[k] for k in ("host", "ns", "pid", "start"))


def take(journal: str, run_id: str, holder: Holder | None, ident: Identity | None = None, *,
         at: str | None = None) -> bool:
    """Whether this process may take the run over now (and, where OS record locks exist, take its
    lock): the run's lock is free in the hold file the holder locked it in, or the holder the
    journal names has let go, is this process, or is provably gone.

    A lock found free in another hold file than the holder's (it was deleted or replaced under a
    live holder) proves nothing: the holder's process is asked about instead. ``at``: the hold
    file's path, when the caller resolved it already (:func:`holds_path`: a claim takes many runs)."""
    let_go = holder is None or not holder.get("held") or is_mine(holder)
    taken = lock(journal, run_id, ident, at=at)
    if taken is None:
        return let_go or not is_alive(holder)  # type: ignore[arg-type]
    if not taken:
        return False
    recorded = None if holder is None else holder.get("holds")
    if let_go or recorded is None or recorded == list(hold_file(journal, at=at) or ()) or not is_alive(holder):  # type: ignore[arg-type]
        return True
    unlock(journal, run_id, at=at)
    return False


def describe(holder: Holder) -> str:
    """For error messages: who holds the run, and where."""
    proc = holder["process"]
    return f"{holder.get('owner')!s:.80} (process {proc.get('pid')} on {proc.get('host')!s:.80})"


def refuse_second_names(path: str) -> None:
    """Refuse a journal file with a second name (R21/R22): each name gets its own ``-holds`` and
    ``-wal``, so two processes could hold one run through the two names."""
    if links(path) > 1:
        raise JournalLinked(f"journal {path!r} has {links(path)} names (hard links): each "
                            "name would have its own hold file and -wal, and a run could run through two of "
                            "them at once; remove the other names; nothing was changed")
