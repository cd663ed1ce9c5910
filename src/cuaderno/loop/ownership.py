"""The ownership seam: who holds a run, in the journal and among the loops of this process.

A loop takes a run over in the journal (a fencing epoch: :meth:`Checkpointer.acquire`, released
when it stops) and registers with the other loops of this process (:mod:`cuaderno.loop.holds`: busy
in the middle of a step, paused at a yielded step, handed over on demand). The runner, ``cancel``
and ``compensate`` reach both through an :class:`Ownership`; :class:`ProcessOwnership` is the
default, the OS process being the owner.

Under Temporal, the workflow is the owner: a workflow plugs an ownership here that takes the
fencing epoch once for the workflow (the workflow id as owner) and keeps no per-process or
per-thread holds, since replay may run the workflow on any worker thread and no OS lock may be
part of it.
"""

from __future__ import annotations

from typing import Protocol

from cuaderno.journal.base import Checkpointer
from cuaderno.loop import holds as _holds
from cuaderno.loop.holds import Loop, Where
from cuaderno.loop.runtime import DEFAULT_RUNTIME, Runtime

__all__ = ["DEFAULT_OWNERSHIP", "Ownership", "ProcessOwnership"]


class Ownership(Protocol):
    """Holding a run: the journal's fencing record, and the holds of the loops of one owner."""

    def key(self, store: Checkpointer, run_id: str) -> Where:
        """Which journal and run (two store objects on one file are one journal)."""
        ...

    def start(self, where: Where, loop: Loop, *, force: bool) -> None:
        """``loop`` wants the run: :class:`~cuaderno.errors.RunBusy` while another loop of this
        owner is busy on it."""
        ...

    def acquire(self, store: Checkpointer, run_id: str, owner: str, *, force: bool, open_only: bool = False) -> int:
        """Take the run over in the journal; return the new fencing epoch."""
        ...

    def took(self, where: Where, loop: Loop) -> None:
        """``loop`` took the run over: a paused former holder must not go on."""
        ...

    def pause(self, where: Where, loop: Loop) -> None:
        """``loop`` yielded a step."""
        ...

    def resume(self, where: Where, loop: Loop) -> bool:
        """``loop`` goes on after a yield; ``False`` if another loop took the run meanwhile."""
        ...

    def stop(self, where: Where, loop: Loop) -> None:
        """``loop`` ended, for any reason."""
        ...

    def release(self, store: Checkpointer, run_id: str, epoch: int) -> None:
        """Let the next owner take the run over at once."""
        ...

    def busy_here(self, where: Where) -> bool:
        """Whether a loop busy on the run runs where the caller runs (it cannot stop while the
        caller waits for it)."""
        ...


class ProcessOwnership:
    """The process owns the run: the journal's lease, and :mod:`cuaderno.loop.holds` for its loops."""

    def __init__(self, runtime: Runtime = DEFAULT_RUNTIME) -> None:
        self.runtime = runtime

    def key(self, store: Checkpointer, run_id: str) -> Where:
        return _holds.key(store, run_id)

    def start(self, where: Where, loop: Loop, *, force: bool) -> None:
        _holds.start(where, loop, force=force, thread=self.runtime.thread(), pid=self.runtime.process())

    def acquire(self, store: Checkpointer, run_id: str, owner: str, *, force: bool, open_only: bool = False) -> int:
        return store.acquire(run_id, owner, force=force, open_only=open_only)

    def took(self, where: Where, loop: Loop) -> None:
        _holds.took(where, loop)

    def pause(self, where: Where, loop: Loop) -> None:
        _holds.pause(where, loop)

    def resume(self, where: Where, loop: Loop) -> bool:
        return _holds.resume(where, loop, thread=self.runtime.thread())

    def stop(self, where: Where, loop: Loop) -> None:
        _holds.stop(where, loop)

    def release(self, store: Checkpointer, run_id: str, epoch: int) -> None:
        store.release(run_id, epoch)

    def busy_here(self, where: Where) -> bool:
        return _holds.busy_on_this_thread(where, thread=self.runtime.thread())


DEFAULT_OWNERSHIP = ProcessOwnership()
"""The process's ownership with the process's runtime."""
