"""Opening a run: what every loop does before it goes on with a run, before it writes anything.

The runner, the episode parent and any other caller (an adapter under another agent framework)
open a run the same way: start it if the journal has none (the ``run/start`` event: its task, the
task's fingerprint, the versions and the tenant, all that a later opening is checked against);
otherwise check the journaled run against the caller (:func:`check_reopened`: event schema, task,
tenant, then the caller's versions), answer a closed run from its journal, and take an open one
over at a new fencing epoch (:func:`open_run`). Each adds its own steps after.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, Protocol

from cuaderno.checkpoint import Checkpoint, verified
from cuaderno.durable.log import JournalLog
from cuaderno.errors import DrainOnOldWorker, ReplayDivergence, RunClosed, SchemaTooNew, VersionMismatch
from cuaderno.events import StepEvent
from cuaderno.journal.base import EVENT_SCHEMA_VERSION, Checkpointer

__all__ = ["CLOSED", "Holding", "Mismatch", "Opened", "check_reopened", "open_run"]

CLOSED = ("completed", "failed", "cancelled")
"""The statuses of a run that never goes on: an opening answers it from its journal."""


Mismatch = Callable[[Mapping[str, object], Mapping[str, object]], NoReturn]
"""What a caller does with a run started under other versions (recorded, current): it raises."""


class Holding(Protocol):
    """How a run is taken over and let go (a :class:`cuaderno.loop.ownership.Ownership` is one;
    the default takes it in the journal by this process)."""

    def acquire(self, store: Checkpointer, run_id: str, owner: str, *, force: bool, open_only: bool = False) -> int:
        ...

    def release(self, store: Checkpointer, run_id: str, epoch: int) -> None:
        ...


class _JournalHolding:
    def acquire(self, store: Checkpointer, run_id: str, owner: str, *, force: bool, open_only: bool = False) -> int:
        return store.acquire(run_id, owner, force=force, open_only=open_only)

    def release(self, store: Checkpointer, run_id: str, epoch: int) -> None:
        store.release(run_id, epoch)


def check_reopened(cp: Checkpoint, run_id: str, *, task_fingerprint: str, tenant: str) -> None:
    """Refuse to go on with a run journaled under a newer event schema (its events may not mean
    what this code reads in them: no version choice may replay them), for another task, or under
    another tenant (every effect key holds the tenant: resumed under another, the run's effects
    would carry two identities; runs journaled before the tenant was recorded are not checked)."""
    recorded = cp.versions.get("schema")
    if type(recorded) is int and recorded > EVENT_SCHEMA_VERSION:
        raise SchemaTooNew(recorded, EVENT_SCHEMA_VERSION, what=f"run {run_id!r}: event schema")
    if cp.task_fingerprint != task_fingerprint:
        raise ReplayDivergence(run_id, "run", f"task {cp.task_fingerprint}", f"task {task_fingerprint}")
    if cp.tenant is not None and cp.tenant != tenant:
        raise ReplayDivergence(run_id, "run", f"tenant {cp.tenant!r}", f"tenant {tenant!r}")


@dataclass(slots=True)
class Opened:
    """A run as an opening left it.

    ``closed``: the run had ended (completed or failed) before this opening; nothing was written
    and nothing is held: answer from ``checkpoint`` and ``events``. Otherwise this caller holds
    the run at ``epoch`` and writes through ``log`` (a :class:`JournalLog` at that epoch over the
    run's events, everything committed before the takeover); it lets go with :meth:`release`.
    """

    store: Checkpointer
    run_id: str
    checkpoint: Checkpoint
    events: list[StepEvent]
    closed: bool
    epoch: int | None = None
    holding: Holding = field(default_factory=_JournalHolding)
    log: JournalLog = field(init=False)

    def __post_init__(self) -> None:
        self.log = JournalLog(self.store, self.run_id, epoch=self.epoch,
                              index={(e.step_id, e.phase): e for e in self.events})

    def finish(self, output: str, **fields: Any) -> None:
        """Journal the run's final answer: the run is ``completed`` and every later opening
        answers from it. ``output`` is the answer as text (``cuaderno show`` prints it);
        ``fields``, the caller's own (a structured answer, totals)."""
        self.log.stage(StepEvent(run_id=self.run_id, step_id="final", phase="result", kind="final",
                                 payload={"output": output, **fields}))
        self.log.commit()

    def fail(self, reason: str, **fields: Any) -> None:
        """Journal the run's end as ``failed`` with ``reason`` (a budget, an error the caller
        cannot go on after); ``fields``, the caller's own."""
        self.log.stage(StepEvent(run_id=self.run_id, step_id="run", phase="end", kind="run",
                                 payload={"reason": reason, **fields, "status": "failed"}))
        self.log.commit()

    def release(self) -> None:
        """Let the next owner take the run over at once (a no-op for a closed run)."""
        if self.epoch is not None:
            self.holding.release(self.store, self.run_id, self.epoch)
            self.epoch = None


def open_run(store: Checkpointer, run_id: str, *, task: str, task_fingerprint: str, versions: Mapping[str, Any],
             tenant: str, owner: str, name: str | None = None, start: Mapping[str, Any] | None = None,
             on_version_mismatch: Literal["refuse", "drain"] | Mismatch = "refuse", holding: Holding | None = None,
             force: bool = False) -> Opened:
    """Start or reopen ``run_id`` and hold it, or find it closed.

    A new run's ``run/start`` event holds ``task``, ``versions``, ``tenant`` and what ``start``
    adds (the caller's own fields: an episode's name, a framework's agent name); its fingerprint
    is ``task_fingerprint``. A journaled run must match (:func:`check_reopened`); other
    ``versions`` are a :class:`~cuaderno.errors.VersionMismatch` (``"refuse"``) or a
    :class:`~cuaderno.errors.DrainOnOldWorker` (``"drain"``: a worker of the recorded versions
    resumes it), or what a callable given raises with the recorded and the current versions,
    raised before anything is written. A cancelled run raises
    :class:`~cuaderno.errors.RunClosed`; a run another process holds, what ``holding.acquire``
    raises (:class:`~cuaderno.errors.RunBusy` through :class:`~cuaderno.loop.ownership.Ownership`).
    """
    holding = holding or _JournalHolding()
    if store.checkpoint(run_id) is None:
        store.append([StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", name=name,
                                fingerprint=task_fingerprint,
                                payload={"task": task, "versions": dict(versions), "tenant": tenant,
                                         **(start or {})})])
    else:
        cp, events = verified(store, run_id)
        check_reopened(cp, run_id, task_fingerprint=task_fingerprint, tenant=tenant)
        if cp.versions != dict(versions):
            if callable(on_version_mismatch):
                on_version_mismatch(cp.versions, dict(versions))
            if on_version_mismatch == "drain":
                raise DrainOnOldWorker(run_id, cp.versions, dict(versions))
            raise VersionMismatch(run_id, cp.versions, dict(versions))
        if cp.status in CLOSED:
            return _closed(store, run_id, cp, events)
    try:
        epoch = holding.acquire(store, run_id, owner, force=force, open_only=True)
    except RunClosed:
        cp, events = verified(store, run_id)
        return _closed(store, run_id, cp, events)
    cp, events = verified(store, run_id)  # all that was committed before the takeover
    return Opened(store, run_id, cp, events, closed=False, epoch=epoch, holding=holding)


def _closed(store: Checkpointer, run_id: str, cp: Checkpoint, events: list[StepEvent]) -> Opened:
    if cp.status == "cancelled":
        raise RunClosed(run_id, cp.status)
    return Opened(store, run_id, cp, events, closed=True)
