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
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import threading
from functools import cache
from typing import Any

try:
    import fcntl
except ImportError:  # not on Windows: the holder named in the journal is asked about instead
    fcntl = None  # type: ignore[assignment]

__all__ = ["Holder", "claim", "describe", "is_alive", "is_mine", "lock", "parse", "released", "take",
           "this_process", "unlock"]

_files: dict[str, tuple[int, set[str]]] = {}
"""Per lock file: its descriptor and the runs this process has locked in it. The descriptor is
closed when the last lock is given back (closing any descriptor of a file drops every POSIX lock
this process holds on it, so never while one is held)."""
_files_lock = threading.Lock()


def _after_fork() -> None:
    global _files_lock
    _files_lock = threading.Lock()  # a forked child holds none of its parent's record locks
    _files.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _byte(run_id: str) -> int:
    return int.from_bytes(hashlib.sha256(run_id.encode("utf-8", "surrogatepass")).digest()[:7], "big")


def lock(journal: str, run_id: str) -> bool | None:
    """Take the run's lock for this process: ``True`` (taken, or this process had it),
    ``False`` (a live process holds it), ``None`` (no such locks here: ask :func:`is_alive`)."""
    if fcntl is None or journal == ":memory:":
        return None
    path = os.path.realpath(journal) + "-holds"
    with _files_lock:
        fd, runs = _files.get(path) or (-1, set())
        if fd < 0:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError:
                return None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _byte(run_id), os.SEEK_SET)
        except OSError as exc:
            if not runs:
                os.close(fd)
                _files.pop(path, None)
            return False if exc.errno in (errno.EACCES, errno.EAGAIN) else None
        runs.add(run_id)
        _files[path] = (fd, runs)
        return True


def unlock(journal: str, run_id: str) -> None:
    """Give the run's lock back (this process stopped running it)."""
    if fcntl is None or journal == ":memory:":
        return
    path = os.path.realpath(journal) + "-holds"
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
"""``{"owner": label, "process": {"host", "ns", "pid", "start"}, "held": bool}``"""


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
    stat = _stat(pid)
    return {"host": socket.gethostname(), "ns": _pid_namespace(), "pid": pid,
            "start": None if stat is None else stat[1]}


def claim(owner: str) -> str:
    """The stored form of a hold taken by this process under the label ``owner``."""
    return json.dumps({"owner": owner, "process": this_process(), "held": True}, sort_keys=True)


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


def is_alive(holder: Holder) -> bool:
    """Whether the holding process may still be running its step. ``True`` when that cannot be
    known (another host or PID namespace): only a provably gone holder is taken over."""
    proc = holder["process"]
    me = this_process()
    if proc.get("host") != me["host"] or proc.get("ns") != me["ns"]:
        return True
    pid = proc.get("pid")
    if not isinstance(pid, int):
        return True
    if pid == me["pid"] and proc.get("start") == me["start"]:
        return True
    stat = _stat(pid)
    if stat is None:
        if me["start"] is not None:
            return False  # /proc works here and has no such process
        try:  # no /proc (macOS): a signal-0 probe; a recycled PID reads as alive (the safe side)
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state, start = stat
    return state not in ("Z", "X") and start == proc.get("start")


def is_mine(holder: Holder) -> bool:
    """Whether this process holds it (a resume from the same process takes it back at once)."""
    proc, me = holder["process"], this_process()
    return all(proc.get(k) == me[k] for k in ("host", "ns", "pid", "start"))


def take(journal: str, run_id: str, holder: Holder | None) -> bool:
    """Whether this process may take the run over now (and, where OS record locks exist, take its
    lock): the run's lock is free, or, without such locks, the holder the journal names has let
    go, is this process, or is provably gone."""
    taken = lock(journal, run_id)
    if taken is not None:
        return taken
    return holder is None or not holder.get("held") or is_mine(holder) or not is_alive(holder)


def describe(holder: Holder) -> str:
    """For error messages: who holds the run, and where."""
    proc = holder["process"]
    return f"{holder.get('owner')!s:.80} (process {proc.get('pid')} on {proc.get('host')!s:.80})"
