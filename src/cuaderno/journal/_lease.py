"""Who holds a run, and whether that process is still alive.

Fencing alone (an epoch bumped by every takeover, checked in the intent/result transaction)
refuses a superseded owner's *next write*, but its step in flight — a model call, a tool body —
still completes. If a second process could take a live run over, it would find that step's
intent without a result and run it again. So a takeover is refused while the holder is alive.

A SQLite journal is shared only by processes of one machine (WAL needs shared memory), so
liveness is asked of the operating system, not inferred from a clock: the holder is named by
host, PID namespace, PID and the process's start time (a recycled PID has another start time).
A killed holder is therefore taken over at once, with no lease to wait out. A holder in another
container (another host name or PID namespace) cannot be checked: it keeps the run until it
releases it, or until someone takes it over with ``force``.

A holder releases the run when its loop stops for any reason (completed, suspended, failed,
cancelled, or an exception), so a process that is still alive does not block a later resume
elsewhere (a web server that ran a run until it waited for a person, say).
"""

from __future__ import annotations

import json
import os
import socket
from functools import cache
from typing import Any

__all__ = ["Holder", "claim", "describe", "is_alive", "parse", "released"]

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


def describe(holder: Holder) -> str:
    """For error messages: who holds the run, and where."""
    proc = holder["process"]
    return f"{holder.get('owner')!s:.80} (process {proc.get('pid')} on {proc.get('host')!s:.80})"
