"""Loops of this process on a run: which one holds it, and whether it is in the middle of a step.

The journal refuses to hand a run to another *process* while its holder is alive
(:mod:`cuaderno.journal._lease`), but every loop of one process looks alike to it: two tasks of
one web server resuming the same run (a double click on "approve") would both be let in, and
the second would find the first one's step in flight and run it again. So the loops of this
process register here:

- a loop is *busy* from its start until it yields a step, and again once it is resumed; another
  loop that starts meanwhile gets :class:`~cuaderno.errors.RunBusy` (unless it forces);
- while its caller holds a yielded step the loop is idle, and another loop may take the run
  over (a caller that stopped iterating must not lock the run until garbage collection). The
  idle loop first commits the results it still holds (``hand_over``), then it has lost the run:
  when it is resumed it stops before doing anything, because the intent it committed last may
  already be settled by the new holder.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol

from cuaderno.errors import CuadernoError, FencedOut, RunBusy

__all__ = ["Loop", "Where", "busy_on_this_thread", "key", "pause", "resume", "start", "stop", "took"]

Where = tuple[str, str]


class Loop(Protocol):
    def hand_over(self) -> None:
        """Commit the results this loop still holds: another loop takes the run. Raises what
        the journal raised if it could not."""


_lock = threading.Lock()
_busy: dict[Where, Loop] = {}
"""The loop in the middle of a step on each run."""
_holder: dict[Where, Loop] = {}
"""The loop that took each run over last (busy or paused at a yielded step)."""
_thread: dict[Where, int] = {}
"""The thread each busy loop runs on."""


def _forget() -> None:
    """In a forked child: the parent's loops do not run here, and their connections must not be
    used here (SQLite forbids it)."""
    global _lock
    _lock = threading.Lock()
    _busy.clear()
    _holder.clear()
    _thread.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def key(store: object, run_id: str) -> Where:
    """Which journal and run: a file by its real path (two store objects on one file are one
    journal), anything else by the object."""
    path = getattr(store, "path", None)
    if isinstance(path, str) and path != ":memory:":
        return os.path.realpath(path), run_id
    return f"object {id(store)}", run_id


def start(where: Where, loop: Loop, *, force: bool, thread: int, pid: int) -> None:
    """``loop`` wants the run: refused while another loop of this process is busy on it.
    ``thread`` is the caller's thread and ``pid`` names this process in the refusal (both from
    the caller's runtime, :mod:`cuaderno.loop.runtime`).

    A holder paused at a yielded step first commits the results of steps that already happened
    (they ride on the next intent's commit): otherwise the new loop would find those effects
    without a result and call them uncertain. If it cannot, the run stays with it (``RunBusy``).
    ``loop`` becomes the holder only once it has taken the run over in the journal (:func:`took`).
    """
    with _lock:
        other = _busy.get(where)
        if other is not None and other is not loop and not force:
            raise RunBusy(where[1], f"another loop of this process (pid {pid}), in the middle of a step")
        idle = _holder.get(where)
        if idle is not None and idle is not loop and idle is not other:
            try:
                idle.hand_over()
            except FencedOut:
                pass  # it had lost the run to another process already: nothing of it can land
            except CuadernoError as exc:
                raise RunBusy(where[1], f"another loop of this process (pid {pid}), whose finished "
                                        f"steps could not be committed ({exc})") from exc
        _busy[where] = loop
        _thread[where] = thread


def took(where: Where, loop: Loop) -> None:
    """``loop`` took the run over in the journal: a paused former holder must not go on."""
    with _lock:
        _holder[where] = loop


def pause(where: Where, loop: Loop) -> None:
    """``loop`` yielded a step: everything it did is committed or handed over on demand."""
    with _lock:
        if _busy.get(where) is loop:
            del _busy[where]


def resume(where: Where, loop: Loop, *, thread: int) -> bool:
    """``loop`` goes on after a yield (or closes); ``False`` if another loop took the run, or is
    taking it, meanwhile."""
    with _lock:
        if _holder.get(where) not in (None, loop) or _busy.get(where) not in (None, loop):
            return False
        _busy[where] = loop
        _thread[where] = thread
        return True


def stop(where: Where, loop: Loop) -> None:
    """``loop`` ended, for any reason."""
    with _lock:
        if _busy.get(where) is loop:
            del _busy[where]
        if _holder.get(where) is loop:
            del _holder[where]


def busy_on_this_thread(where: Where, *, thread: int) -> bool:
    """Whether a loop in the middle of a step on this run runs on the calling thread (``thread``):
    then it cannot go on (and let the run go) while the caller waits for it."""
    with _lock:
        return where in _busy and _thread.get(where) == thread
