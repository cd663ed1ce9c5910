"""A worker for wrapped runs: what ``cuaderno worker --agent module:attr`` does when ``attr`` is a
wrapped agent (a Pydantic AI ``DurableAgent``, or what ``resumable`` returns on either integration).

A wrapped run resumes by calling the wrapper again with its run id (the opening takes it over,
replays what is journaled, goes on live). So a worker for these runs is small: it looks through
the journal's open runs (:meth:`~cuaderno.journal.base.SupportsClaims.open_runs`), picks those
started under the wrapper's versions that need progress and that no live process holds (a
crashed holder, a decided approval, a settled uncertain effect), and calls
:meth:`Resumable.resume` on each. Never two drivers on one step: the wrapper's opening takes the
run over with the journal's fencing takeover, which refuses a run a live process holds
(:class:`~cuaderno.errors.RunBusy`); ``holders()`` only saves a poll from trying.

A run never held yet (epoch 0) is taken only once it is seen unchanged at the next poll: its
application may be between writing its first row and taking it over (as :mod:`cuaderno.worker`
does). Stopping lets each drive in flight end (a wrapped run has no step boundary the worker can
stop at without leaving an effect in flight, which for a non-idempotent tool would make the run
``needs_human``), then returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

from cuaderno.errors import (
    CuadernoError,
    JournalError,
    RunBusy,
    UncertainEffect,
    UsageError,
    quoted,
)
from cuaderno.events import StepEvent
from cuaderno.journal.base import Checkpointer, SupportsClaims
from cuaderno.worker import STOPPED_IN_JOURNAL, Picking, WorkerStats, checked_pace, pollable

__all__ = ["IntegrationWorker", "Resumable", "entered", "start_event"]

@runtime_checkable
class Resumable(Protocol):
    """A wrapped agent a worker can resume runs of.

    ``journal``: where its runs are (the worker polls it). ``run_versions()``: the versions its
    runs are started under (a run started under others is left for a worker of those).
    ``resume(run_id)``: go on with the run from its journal (the task the run was started with
    is read from its ``run/start`` event) and return the status it stopped in.
    ``compensate(run_id)``: run the compensations a cancelled run scheduled."""

    @property
    def journal(self) -> Checkpointer: ...

    def run_versions(self) -> dict[str, Any]: ...

    async def resume(self, run_id: str) -> str: ...

    async def compensate(self, run_id: str) -> list[dict[str, Any]]: ...


def start_event(store: Checkpointer, run_id: str) -> StepEvent:
    """The run's ``run/start`` event (what a resume reads its task from).

    Raises:
        RunNotFound: no such run in ``store`` (the wrapper's journal is not the one polled).
        CuadernoError: the run has no start event.
    """
    from cuaderno.errors import RunNotFound

    events = store.load(run_id)
    if not events:
        raise RunNotFound(run_id)
    start = next((ev for ev in events if ev.kind == "run" and ev.phase == "start"), None)
    if start is None:
        raise CuadernoError(f"run {quoted(run_id)} has no journaled start to resume it from")
    return start


@contextlib.asynccontextmanager
async def entered(value: Any, factory: Callable[[], Any] | None) -> AsyncIterator[Any]:
    """``value``, or what ``factory()`` returns for this one drive: entered if it is an async
    context manager (deps holding an HTTP client are opened and closed around the drive)."""
    if factory is None:
        yield value
        return
    made = factory()
    if isinstance(made, contextlib.AbstractAsyncContextManager):
        async with made as inside:
            yield inside
    else:
        yield made


class IntegrationWorker:
    """Resumes the runs of one wrapped agent that need progress (module docstring).

    Args:
        target: the wrapped agent (a :class:`Resumable`); its journal is the one polled.
        concurrency: runs driven at once.
        poll_interval: seconds between two looks at the journal while there is nothing to take.
        name: names this worker in its log lines.
        log: where a line per claim, end and error goes (``None``: nowhere).
    """

    def __init__(self, target: Resumable, *, concurrency: int = 4, poll_interval: float = 0.5,
                 name: str | None = None, log: Callable[[str], None] | None = print) -> None:
        if not isinstance(target, Resumable):
            raise UsageError(f"target must be a wrapped agent that can resume its runs, got {type(target).__name__}")
        self.target = target
        self.concurrency, self.poll_interval = checked_pace(concurrency, poll_interval)
        self.name = name or f"worker@{socket.gethostname()}:{os.getpid()}"
        self.stats = WorkerStats()
        self._log = log
        self._versions = target.run_versions()
        self._stopping = False
        self._picking = Picking(self._versions, self.stats, lambda line: self._say(f"{self.name}: {line}"))
        self._work: dict[str, str] = {}
        """What each run found was taken for: ``resume`` or ``compensate``."""

    def stop(self) -> None:
        """Take nothing new; each drive in flight ends, then :meth:`run` returns."""
        self._stopping = True

    def run_sync(self, *, until_idle: bool = False, handle_signals: bool = False) -> WorkerStats:
        return asyncio.run(self.run(until_idle=until_idle, handle_signals=handle_signals))

    async def run(self, *, until_idle: bool = False, handle_signals: bool = False) -> WorkerStats:
        """Poll and resume until :meth:`stop` (or, ``until_idle``, until nothing is left to move on).

        Raises:
            UsageError: the wrapper's journal cannot be polled (no SupportsClaims).
        """
        store = pollable(self.target.journal)
        previous: dict[signal.Signals, Any] = {}
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda signum, frame: self.stop())
        self._say(f"{self.name}: polling for wrapped runs (versions {self._versions}, concurrency {self.concurrency})")
        active: dict[str, asyncio.Task[None]] = {}
        try:
            while not self._stopping:
                try:
                    found = self._claimable(store, set(active), self.concurrency - len(active))
                except JournalError as exc:
                    self.stats.errors += 1
                    self._say(f"{self.name}: polling failed: {str(exc)[:300]}; trying again")
                    if until_idle and not active:
                        raise
                    found = []
                for run_id in found:
                    active[run_id] = asyncio.create_task(self._drive(store, run_id), name=f"drive {run_id}")
                if until_idle and not active and not found and not self._picking.seen_new:
                    return self.stats
                if active:
                    await asyncio.wait(set(active.values()), timeout=self.poll_interval,
                                       return_when=asyncio.FIRST_COMPLETED)
                else:
                    await asyncio.sleep(self.poll_interval)
                for run_id, task in list(active.items()):
                    if task.done():
                        del active[run_id]
                        task.result()  # _drive handles what it expects
        finally:
            self._stopping = True
            if active:
                await asyncio.gather(*active.values(), return_exceptions=True)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.stats

    def _claimable(self, store: Checkpointer, active: set[str], free: int) -> list[str]:
        if free <= 0:
            return []
        assert isinstance(store, SupportsClaims)
        candidates = []
        for cp, work in self._picking.candidates(store, active, max(200, 20 * self.concurrency)):
            candidates.append(cp.run_id)
            self._work[cp.run_id] = work
        if not candidates:
            return []
        held = store.holders(candidates)
        return [run_id for run_id in candidates if run_id not in held][:free]

    async def _drive(self, store: Checkpointer, run_id: str) -> None:
        if self._stopping:
            return
        if self._work.pop(run_id, "resume") == "compensate":
            await self._compensate(store, run_id)
            return
        self._say(f"{self.name}: resuming wrapped run {quoted(run_id)}")
        try:
            status = await self.target.resume(run_id)
        except RunBusy:
            self.stats.busy += 1
            return
        except STOPPED_IN_JOURNAL:
            self._picking.stopped(run_id)
            self._count(store, run_id, None)
            return
        except Exception as exc:  # a drive never ends the worker: the run waits and is tried again
            self.stats.errors += 1
            self._picking.back_off(store, run_id, exc)
            return
        self._picking.backoff.pop(run_id, None)
        self.stats.claimed += 1
        self._count(store, run_id, status)

    async def _compensate(self, store: Checkpointer, run_id: str) -> None:
        cp = store.checkpoint(run_id)
        if cp is None:
            return
        if not self._picking.compensations_due(store, cp, "wrapped run"):
            return
        try:
            await self.target.compensate(run_id)
        except RunBusy:
            self.stats.busy += 1
            return
        except UncertainEffect:
            self.stats.needs_human += 1  # a person settles it (cuaderno resolve); then it goes on
        except Exception as exc:
            self.stats.errors += 1
            self._picking.back_off(store, run_id, exc)
            return
        else:
            self.stats.compensated += 1
        self.stats.claimed += 1
        after = store.checkpoint(run_id)
        if after is not None:
            self._picking.no_cleanup[run_id] = after.last_seq

    def _count(self, store: Checkpointer, run_id: str, status: str | None) -> None:
        cp = store.checkpoint(run_id)
        status = cp.status if cp is not None else (status or "?")
        if status in ("completed", "suspended", "needs_human", "failed", "cancelled"):
            setattr(self.stats, status, getattr(self.stats, status) + 1)
        self._say(f"{self.name}: run {quoted(run_id)} stopped {status}")

    def _say(self, line: str) -> None:
        if self._log is not None:
            self._log(line)
