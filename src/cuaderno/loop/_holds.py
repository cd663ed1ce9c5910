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

from cuaderno.errors import RunBusy

__all__ = ["Loop", "key", "pause", "resume", "start", "stop"]

Where = tuple[str, str]


class Loop(Protocol):
    def hand_over(self) -> None:
        """Commit the results this loop still holds; another loop takes the run."""

_lock = threading.Lock()
_busy: dict[Where, Loop] = {}
_holder: dict[Where, Loop] = {}


def key(store: object, run_id: str) -> Where:
    """Which journal and run: a file by its real path (two store objects on one file are one
    journal), anything else by the object."""
    path = getattr(store, "path", None)
    if isinstance(path, str) and path != ":memory:":
        return os.path.realpath(path), run_id
    return f"object {id(store)}", run_id


def start(where: Where, loop: Loop, *, force: bool) -> None:
    """``loop`` takes the run; refused while another loop of this process is busy on it."""
    with _lock:
        other = _busy.get(where)
        if other is not None and other is not loop and not force:
            raise RunBusy(where[1], f"another loop of this process (pid {os.getpid()}), in the middle of a step")
        idle = _holder.get(where)
        if idle is not None and idle is not loop and idle is not other:
            # It waits at a yielded step with the results of steps that already happened still
            # uncommitted (they ride on the next intent's commit): commit them now, or the new
            # holder would find those effects without a result and call them uncertain.
            idle.hand_over()
        _busy[where] = _holder[where] = loop


def pause(where: Where, loop: Loop) -> None:
    """``loop`` yielded a step: everything it did is committed."""
    with _lock:
        if _busy.get(where) is loop:
            del _busy[where]


def resume(where: Where, loop: Loop) -> bool:
    """``loop`` goes on after a yield; ``False`` if another loop took the run meanwhile."""
    with _lock:
        if _holder.get(where) is not loop:
            return False
        _busy[where] = loop
        return True


def stop(where: Where, loop: Loop) -> None:
    """``loop`` ended, for any reason."""
    with _lock:
        if _busy.get(where) is loop:
            del _busy[where]
        if _holder.get(where) is loop:
            del _holder[where]
