"""Workers: processes that find runs needing progress in a journal and drive them to their next stop.

Without a worker, nothing resumes a run unless the application that started it calls
``agent.run`` again: after an approval, after a crash, after a deploy. A worker does it::

    worker = Worker("postgresql://db/agents", agent, make_gateway, concurrency=8)
    await worker.run()            # until stop() or SIGTERM (run(handle_signals=True))

or from a shell: ``cuaderno worker --journal URL --agent module:attr [--concurrency N]``.

What a worker claims (polling :meth:`~cuaderno.journal.base.SupportsClaims.open_runs` every
``poll_interval`` seconds):

- a ``running`` run that no live process holds: its holder died (SIGKILL, a lost host, a deploy
  that killed it), a person's approval or denial was just journaled, a person settled an uncertain
  effect, or the application started it and went away;
- a run whose cancellation was asked while its holder was letting it go (the loop closes it);
- a cancelled run whose record schedules compensations not yet run (``compensate``).

A run waiting for a person (a pending approval, an effect nobody can know happened) is left alone:
nothing a worker can do moves it. Neither is a run started under other versions of the agent
(another definition, or the same agent before a deploy): with the default ``on_version_mismatch``
it is refused without writing anything, so it waits for a worker of its own version.

Never two workers on one step: a worker claims a run with the loop's own takeover
(``Checkpointer.acquire``), which refuses a run a live process holds (:class:`~cuaderno.errors.RunBusy`:
another worker won the race, or the application runs it) and bumps the fencing epoch that every
intent and result write checks. ``holders()`` only saves a poll from opening runs that are
obviously held; it decides nothing. A run first seen at epoch 0 (never held) is claimed only once
it is seen unchanged at the next poll: its application may be between writing its first row and
taking it over. On PostgreSQL the server may end a live holder's lock session: the holder then
writes nothing more for the run without taking its lock back (``FencedOut`` if another process
has it now: this worker stops driving it), and a worker that took the run over from a holder it
cannot prove dead takes that holder's tool step in flight as uncertain instead of sending it again
(see ``PostgresCheckpointer.earlier_holder``).

Stopping: :meth:`Worker.stop` (SIGTERM or SIGINT with ``handle_signals``) lets every run in flight
finish the step it is in, commits its result, releases the run (another worker takes it over at
once) and returns; nothing new is claimed. The loop is the unchanged runner: a worker is the same
``agent.run`` an application would call, with the task and tenant the run recorded when it started.

Concurrency is the number of runs driven at once on this process's event loop. Model calls are
awaited, so they overlap; a tool written as a plain function blocks the loop while it runs. The
steps these runs commit in one turn of the loop share one transaction and one sync
(:class:`~cuaderno.journal.GroupCommit`); each still acts only once its own intent has
committed. Put
more processes (on more hosts, for PostgreSQL) behind one journal to scale further.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import socket
import sys
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import (
    BudgetExceeded,
    CuadernoError,
    FencedOut,
    JournalError,
    RunBusy,
    RunCancelled,
    RunClosed,
    UncertainEffect,
    UsageError,
    quoted,
)
from cuaderno.events import StepEvent
from cuaderno.gateway.base import ModelGateway
from cuaderno.journal import GroupCommit, JournalQueue, canonical_versions, open_journal, queue_of, work_for
from cuaderno.journal.base import Checkpointer, SupportsClaims
from cuaderno.journal.retention import PeriodicPrune, parse_duration
from cuaderno.loop.agent import Agent, RetryPolicy, Session
from cuaderno.loop.cleanup import compensate
from cuaderno.loop.ownership import ProcessOwnership
from cuaderno.loop.steps import FinalStep, Step
from cuaderno.operations import cleanup_left

__all__ = ["Picking", "Worker", "WorkerStats", "load_agent"]

_MAX_BACKOFF_S = 60.0
_SCAN_WHILE_BUSY = 4
"""While driving runs, the open runs are looked through once per this many poll intervals."""


@dataclass(kw_only=True, slots=True)
class WorkerStats:
    """What a worker did, counted since it started."""

    claimed: int = 0
    """Runs it took over and drove (each drive counts once)."""
    completed: int = 0
    suspended: int = 0
    """Drives that stopped to wait for a person's approval."""
    needs_human: int = 0
    failed: int = 0
    cancelled: int = 0
    compensated: int = 0
    """Cancelled runs whose compensations it ran."""
    released: int = 0
    """Runs it let go of unfinished because it was stopping (another worker takes them over)."""
    busy: int = 0
    """Claims another process won: the run was held by a live process (``RunBusy``), or another
    worker finished it between this worker's read and its takeover."""
    errors: int = 0
    """Drives that ended in an error the run's journal does not record (retried after a backoff)."""
    pruned: int = 0
    """Closed runs its prune schedule removed (``prune_older_than``)."""
    skipped_versions: set[str] = field(default_factory=set[str])
    """Runs it left alone because they were started under other versions of the agent."""


_Store = TypeVar("_Store", bound=Checkpointer)


STOPPED_IN_JOURNAL: tuple[type[CuadernoError], ...] = (RunClosed, RunCancelled, BudgetExceeded, UncertainEffect)
"""What a drive raises when its run stopped in a state its journal records (closed, cancelled,
over its budget, waiting for a person on an uncertain effect): a worker counts the run as taken
and moves on, with no back-off, since another drive would stop at the same place."""


def checked_pace(concurrency: object, poll_interval: object) -> tuple[int, float]:
    """A worker's ``concurrency`` and ``poll_interval``, checked (both workers take the same two).

    Raises:
        UsageError: ``concurrency`` is not a positive integer, or ``poll_interval`` not a positive
            number of seconds (booleans are neither).
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise UsageError(f"concurrency must be a positive integer, got {concurrency!r:.40}")
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float)) or poll_interval <= 0:
        raise UsageError(f"poll_interval must be a positive number of seconds, got {poll_interval!r:.40}")
    return concurrency, float(poll_interval)


def pollable(store: _Store) -> _Store:
    """``store``, checked to be a journal a worker can poll.

    Raises:
        UsageError: it does not declare :class:`~cuaderno.journal.base.SupportsClaims`.
    """
    if not isinstance(store, SupportsClaims):
        raise UsageError(f"{type(store).__name__} cannot be polled by a worker (it does not declare the "
                         "SupportsClaims capability: open_runs and holders)")
    return store


class Picking:
    """What a worker keeps between two looks at its journal's open runs, and the choice it makes
    from them: which runs need it, which to leave (another agent's versions, a failure at the same
    point of the journal, compensations already run) and how long to wait after a failed drive.
    Shared by :class:`Worker` and :class:`cuaderno.integrations.IntegrationWorker`, so that both
    leave and retry runs by one rule.

    Attributes:
        seen_new: runs never held, by the ``last_seq`` they had when first seen: one is taken only
            if it is unchanged at the next look (its application may be between its first row and
            its takeover).
        backoff: runs whose last drive failed: ``last_seq`` then, when to try again, the wait set.
        no_cleanup: cancelled runs whose compensations all ran (or wait for a person), by
            ``last_seq``.
    """

    def __init__(self, versions: Mapping[str, object], stats: WorkerStats, say: Callable[[str], None]) -> None:
        self.versions, self.stats, self.say = versions, stats, say
        self.seen_new: dict[str, int] = {}
        self.backoff: dict[str, tuple[int, float, float]] = {}
        self.no_cleanup: dict[str, int] = {}

    def compensations_due(self, store: Checkpointer, cp: Checkpoint, what: str) -> int:
        """How many compensations of cancelled run ``cp`` are left to run; said in a line when
        some are, recorded in :attr:`no_cleanup` (not looked at again until the run moves) when
        none is. ``what`` names the run in that line."""
        left = cleanup_left(cp, store.load(cp.run_id))
        if left:
            self.say(f"running {left} compensation(s) of cancelled {what} {quoted(cp.run_id)}")
        else:
            self.no_cleanup[cp.run_id] = cp.last_seq
        return left

    def stopped(self, run_id: str) -> None:
        """A drive of ``run_id`` ended in a state its journal records (:data:`STOPPED_IN_JOURNAL`):
        counted as taken, and no longer backing off."""
        self.stats.claimed += 1
        self.backoff.pop(run_id, None)

    def candidates(self, store: SupportsClaims, active: set[str], limit: int) -> list[tuple[Checkpoint, str]]:
        """The open runs (up to ``limit`` read) that need a worker now, with what each needs
        (``resume`` or ``compensate``): not in ``active``, started under these versions, not
        backing off, not new since the last look."""
        now = asyncio.get_running_loop().time()
        candidates: list[tuple[Checkpoint, str]] = []
        seen_new: dict[str, int] = {}
        for cp in store.open_runs(limit=limit):
            work = work_for(cp)
            if work is None or cp.run_id in active:
                continue
            if cp.versions != self.versions:
                if cp.run_id not in self.stats.skipped_versions:
                    self.stats.skipped_versions.add(cp.run_id)
                    self.say(f"run {quoted(cp.run_id)} was started under other versions of the agent "
                             f"({cp.versions}); left for a worker of those")
                continue
            back = self.backoff.get(cp.run_id)
            if back is not None and back[0] == cp.last_seq and back[1] > now:
                continue  # failed at this very point of its journal: wait, or until something changes
            if work == "compensate" and self.no_cleanup.get(cp.run_id) == cp.last_seq:
                continue
            if cp.epoch == 0 and work == "resume" and self.seen_new.get(cp.run_id) != cp.last_seq:
                seen_new[cp.run_id] = cp.last_seq  # never held: its application may be about to take it
                continue
            candidates.append((cp, work))
        self.seen_new = seen_new
        return candidates

    def backing_off(self, now: float) -> set[str]:
        """The runs whose wait after a failed drive is not over at ``now``."""
        return {run_id for run_id, (_, until, _) in self.backoff.items() if until > now}

    def back_off(self, store: Checkpointer, run_id: str, exc: Exception) -> None:
        """Back off from a run whose drive raised what its journal does not record (a provider
        down, a journal that refused): retried after 1, 2, 4... up to 60 s, at once if its journal
        changes (a person acted on it)."""
        try:
            cp = store.checkpoint(run_id)
        except CuadernoError:  # the journal itself refused: back off all the same
            cp = None
        seq = cp.last_seq if cp is not None else -1
        previous = self.backoff.get(run_id)
        wait = 1.0 if previous is None or previous[0] != seq else min(previous[2] * 2, _MAX_BACKOFF_S)
        self.backoff[run_id] = (seq, asyncio.get_running_loop().time() + wait, wait)
        self.say(f"run {quoted(run_id)}: {type(exc).__name__}: {str(exc)[:300]}; retried in {wait:g} s")


class Worker:
    """Claims runs of ``agent`` that need progress in one journal, and drives them.

    Args:
        journal: a journal URL (opened here, closed when :meth:`run` returns) or an open store
            that declares :class:`~cuaderno.journal.base.SupportsClaims` (left open).
        agent: the agent whose runs it drives: the same definition (versions) that started them.
        gateway_factory: makes the gateway a drive calls the model through (called once per drive).
        concurrency: runs driven at once by this worker.
        poll_interval: seconds between two looks at the journal while there is nothing to claim.
        name: names this worker in the runs' holder record (default ``worker@host:pid``).
        retry: the loop's retry bounds for every drive.
        log: where a line per claim, stop and error goes (default: standard error; ``None``: nowhere).
        prune_older_than: also remove closed runs older than this (seconds, or ``"30d"``) every
            ``prune_every`` seconds (:class:`~cuaderno.journal.retention.PeriodicPrune`).
    """

    def __init__(self, journal: str | os.PathLike[str] | Checkpointer, agent: Agent,
                 gateway_factory: Callable[[], ModelGateway], *, concurrency: int = 4, poll_interval: float = 0.5,
                 name: str | None = None, retry: RetryPolicy | None = None,
                 log: Callable[[str], None] | None = print, prune_older_than: float | str | None = None,
                 prune_every: float = 600.0) -> None:
        if not isinstance(agent, Agent):
            raise UsageError(f"agent must be an Agent, got {type(agent).__name__}")
        if not callable(gateway_factory):
            raise UsageError("gateway_factory must be a function that returns a ModelGateway")
        concurrency, poll_interval = checked_pace(concurrency, poll_interval)
        self._pruner = None if prune_older_than is None else PeriodicPrune(
            parse_duration(str(prune_older_than)), _positive("prune_every", prune_every), cleanup_left,
            lambda line: self._say(f"{self.name}: {line}"))
        self.agent = agent
        self.gateway_factory = gateway_factory
        self.concurrency = concurrency
        self.poll_interval = float(poll_interval)
        self.name = name or f"worker@{socket.gethostname()}:{os.getpid()}"
        self.retry = retry
        self.stats = WorkerStats()
        self._log = log
        self._journal = journal
        self._store: Checkpointer | None = None
        self._versions = agent.versions()
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: dict[str, str] = {}
        """The task each run recorded when it started (it never changes), so a claim reads it once."""
        self._picking = Picking(self._versions, self.stats, lambda line: self._say(f"{self.name}: {line}"))
        self._queue: JournalQueue | None = None
        self._claims: dict[str, _Claimed] = {}
        """Queued runs this worker claimed (:mod:`cuaderno.flow`) and drives: the claim's takeover."""
        self._schedules_refused = False
        self._scanned = float("-inf")
        """When the open runs were last looked through (see :meth:`_scan_due`)."""
        self._listen: Any = None
        """PostgreSQL: the connection that LISTENs for submits and freed slots (``None``: polling only)."""

    # -- control ----------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; let each run in flight finish its step, commit and release. Safe from a
        signal handler or another thread."""
        self._stopping = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop just closed: nothing left to wake
                pass

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    def run_sync(self, *, until_idle: bool = False, handle_signals: bool = False) -> WorkerStats:
        """:meth:`run` from synchronous code (a command line, a script)."""
        return asyncio.run(self.run(until_idle=until_idle, handle_signals=handle_signals))

    async def run(self, *, until_idle: bool = False, handle_signals: bool = False) -> WorkerStats:
        """Poll and drive until :meth:`stop` (or, with ``until_idle``, until nothing is left that
        this worker can move on). ``handle_signals``: SIGTERM and SIGINT call :meth:`stop`.

        Raises:
            UsageError: the journal cannot be polled (no SupportsClaims), or the runs waiting for a
                worker were all started by another agent definition (nothing was written).
        """
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        owned = not isinstance(self._journal, Checkpointer)
        store = open_journal(self._journal, create=False) if not isinstance(self._journal, Checkpointer) \
            else self._journal
        self._store = store
        group: GroupCommit | None = None
        previous: dict[signal.Signals, Any] = {}
        try:
            pollable(store)
            self._queue = _queue(store)
            self._check_backlog(store)
            if handle_signals:
                # A plain Python handler, not loop.add_signal_handler: that one runs only when the
                # event loop gets control back, and a run whose steps never suspend (a tool that
                # is a plain function, a gateway that answers at once) could then run to its end
                # before the worker learnt it was asked to stop. This one runs between two
                # bytecodes of the main thread, wherever it is, and only sets a flag.
                for sig in (signal.SIGTERM, signal.SIGINT):
                    previous[sig] = signal.signal(sig, lambda signum, frame: self.stop())
            self._say(f"{self.name}: polling {_where(store)} for runs of agent {self.agent.name!r} "
                      f"(concurrency {self.concurrency})")
            if self.concurrency > 1:
                # The runs this worker drives at once share their commits (one transaction and one
                # sync for the steps that commit in the same turn of the event loop).
                group = GroupCommit(store, close_store=False)
            pruning = None if self._pruner is None else asyncio.create_task(self._pruner.run(store, lambda: self._stopping))
            try:
                await self._poll(group if group is not None else store, until_idle)
            finally:
                if pruning is not None and self._pruner is not None:
                    self._pruner.stop()
                    await pruning  # a batch in flight commits (or not) before the store closes
                    self.stats.pruned = self._pruner.pruned
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._unlisten()
            if group is not None:
                group.close()  # its store stays open: closed below if this worker opened it
            if owned:
                store.close()
            self._store = None
        return self.stats

    # -- the poll loop ----------------------------------------------------------------------------

    async def _poll(self, store: Checkpointer, until_idle: bool) -> None:
        assert self._wake is not None
        active: dict[str, asyncio.Task[None]] = {}
        try:
            while not self._stopping:
                try:
                    self._listen_for_queue()
                    found = await self._claim_queued(set(active), self.concurrency - len(active))
                    # Busy with the runs just claimed too: when every run in flight ends at once
                    # (a worker's runs step together) and the claim refills the slots, the worker
                    # was not idle for a moment.
                    if self._scan_due(bool(active) or bool(found)):
                        await self._fire_schedules()
                        found += self._claimable(store, set(active), self.concurrency - len(active) - len(found))
                except JournalError as exc:
                    # The journal did not answer (PostgreSQL restarting, a lost connection): the
                    # runs in flight go on or fail on their own; look again after a pause.
                    self.stats.errors += 1
                    self._say(f"{self.name}: polling failed: {str(exc)[:300]}; trying again")
                    found = []
                    if until_idle and not active:
                        raise
                for cp, work in found:
                    active[cp.run_id] = asyncio.create_task(self._drive(store, cp, work), name=f"drive {cp.run_id}")
                # Until idle: a run whose drive failed was tried once by this worker; it is not
                # waited for (a cron job must end), and the next worker tries it again.
                if until_idle and not active and not found and not self._picking.seen_new:
                    return
                self._wake.clear()
                waits: set[asyncio.Future[Any]] = {*active.values(), asyncio.ensure_future(self._wake.wait())}
                done, _ = await asyncio.wait(waits, timeout=self.poll_interval if not found else 0,
                                             return_when=asyncio.FIRST_COMPLETED)
                for fut in waits - set(active.values()):
                    fut.cancel()
                for run_id, task in list(active.items()):
                    if task.done():
                        del active[run_id]
                        task.result()  # _drive handles what it expects; anything else is a bug here
        finally:
            # Stopping (or an error of the poll itself): every run in flight finishes its step,
            # commits and is released before this returns.
            self._stopping = True
            if active:
                self._say(f"{self.name}: stopping; {len(active)} run(s) finish their step in flight")
                await asyncio.gather(*active.values(), return_exceptions=True)

    def _claimable(self, store: Checkpointer, active: set[str], free: int) -> list[tuple[Checkpoint, str]]:
        """Runs to claim now (at most ``free``), with what to do for each."""
        if free <= 0:
            return []
        assert isinstance(store, SupportsClaims)
        if self._queue is not None and not self._queue.work_outside():
            # Every open run is the queue's (claimed above): one read of the runs table instead of up to
            # 200 open runs' summaries read and parsed, by every worker of a fleet at each look.
            self._picking.seen_new = {}
            return []
        candidates = self._picking.candidates(store, active, max(200, 20 * self.concurrency))
        if self._queue is not None and candidates:
            # A queued run waiting for a worker is claimed through the queue only (its priority,
            # start time and key's limit); here only what the queue does not do for it.
            queued = self._queue.queued([cp.run_id for cp, work in candidates if work == "resume"
                                         and cp.status == "running"])
            candidates = [(cp, work) for cp, work in candidates if cp.run_id not in queued]
            self._picking.seen_new = {run_id: seq for run_id, seq in self._picking.seen_new.items()
                                      if run_id not in queued}
        if not candidates:
            return []
        held = store.holders([cp.run_id for cp, _ in candidates])
        return [(cp, work) for cp, work in candidates if cp.run_id not in held][:free]

    def _scan_due(self, busy: bool) -> bool:
        """Whether to look through the open runs now (runs nobody holds: a dead holder's, an
        approved one's, a cancellation to close). Always when idle; while driving runs, at most
        once per ``_SCAN_WHILE_BUSY`` poll intervals: the queue is asked at every wake (a run
        ended here, a submit was heard), and reading up to 200 open runs' summaries at each wake
        cost each of four workers more CPU than one worker of four times their concurrency
        (``benchmarks/bench_claims.py``). A run left by a dead holder waits that much longer.
        ``busy`` counts the runs a claim just took: a worker whose runs all ended in one wake and
        were replaced by the queue's next ones is not idle (it looked once per such wake: about
        once per ``concurrency`` runs, 30 looks per 300 runs for four workers of 8 against 11 for
        one of 32)."""
        now = asyncio.get_running_loop().time()
        if busy and self._queue is not None and now - self._scanned < _SCAN_WHILE_BUSY * self.poll_interval:
            return False
        self._scanned = now
        return True

    # -- the queue (cuaderno.flow) -----------------------------------------------------------------

    async def _claim_queued(self, active: set[str], free: int) -> list[tuple[Checkpoint, str]]:
        """Submitted runs to drive now: claimed through the queue, which takes each over for
        this worker (so no other worker can pick it) in priority order, within its key's limit.

        In a thread: a claim waits for the journal's claim lock while another worker claims, and
        takes each run over with a synced commit; the runs in flight on this loop go on meanwhile."""
        if self._queue is None or free <= 0 or self._stopping:
            return []
        now = asyncio.get_running_loop().time()
        skip = active | self._picking.backing_off(now)
        claim = await asyncio.to_thread(self._queue.claim, versions=canonical_versions(self._versions),
                                        owner=self.name, free=free, skip=skip)
        self.stats.busy += claim.lost
        found: list[tuple[Checkpoint, str]] = []
        assert self._store is not None
        for run_id, epoch in claim.taken:
            self._claims[run_id] = _Claimed(epoch, keyed=run_id in claim.keyed)
            if run_id in claim.tasks and len(self._tasks) <= 10_000:
                self._tasks[run_id] = claim.tasks[run_id]  # its queue row's: no read of its events
            # The summary the claim's takeover read with the run's row (PostgreSQL), else read now.
            cp = claim.summaries.get(run_id)
            if cp is None:
                cp = self._store.checkpoint(run_id)
            if cp is None:  # not reached: a claim takes only a run with a first event
                self._let_go(self._store, run_id)
                continue
            found.append((cp, "resume"))
        return found

    async def _fire_schedules(self) -> None:
        """Submit the runs of this agent's schedules whose fire times have come (one run per fire
        time however many workers do it: :mod:`cuaderno.flow.schedules`). The runs are then
        claimed like any submitted run."""
        if self._queue is None or self._stopping:
            return
        from cuaderno.flow.schedules import fire_due

        assert self._store is not None
        try:
            fired = await asyncio.to_thread(fire_due, self._store, self.agent)
        except JournalError:
            raise  # the poll's own handling: the journal is away
        except CuadernoError as exc:  # a schedule this worker cannot fire (croniter missing): said once
            if not self._schedules_refused:
                self._schedules_refused = True
                self._say(f"{self.name}: schedules not fired: {str(exc)[:300]}")
            return
        for handle in fired:
            if handle.created:
                self._say(f"{self.name}: schedule fired run {quoted(handle.run_id)}")

    def _let_go(self, store: Checkpointer, run_id: str) -> None:
        """Release a queued run's claim once its drive ended, unless the loop took the claim's
        takeover as its own (it released the run when it stopped), and tell the listening
        workers a slot may be free."""
        claimed = self._claims.pop(run_id, None)
        if claimed is None:
            return
        try:
            if claimed.epoch is not None:  # the drive stopped before its loop took the run
                store.release(run_id, claimed.epoch)
            if self._queue is not None and claimed.keyed:
                self._queue.notify()  # a slot of its key is free: a waiting worker may take it
        except CuadernoError as exc:  # the journal is away: the claim ends with this process's locks
            self._say(f"{self.name}: could not release run {quoted(run_id)}: {str(exc)[:200]}")

    def _listen_for_queue(self) -> None:
        """On PostgreSQL, LISTEN for submits and freed slots, so an idle worker wakes at once
        instead of polling faster. Reopened at the next poll when its connection dies (polling
        every ``poll_interval`` goes on meanwhile)."""
        if self._queue is None or self._listen is not None or self._loop is None:
            return
        conn = self._queue.listen()
        if conn is None:
            return
        self._listen = conn
        self._loop.add_reader(conn.fileno(), self._heard)

    def _heard(self) -> None:
        conn = self._listen
        if conn is None:
            return
        try:
            conn.pgconn.consume_input()
            while conn.pgconn.notifies() is not None:
                pass
        except Exception:  # the connection died (a restart): poll until it is reopened
            self._unlisten()
        if self._wake is not None:
            self._wake.set()

    def _unlisten(self) -> None:
        conn, self._listen = self._listen, None
        if conn is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.remove_reader(conn.fileno())
            except (ValueError, OSError):
                pass
        try:
            conn.close()
        except Exception:  # closing a dead connection may fail; it is gone either way
            pass

    # -- driving one run --------------------------------------------------------------------------

    async def _drive(self, store: Checkpointer, cp: Checkpoint, work: str) -> None:
        try:
            await self._drive_one(store, cp, work)
        finally:
            self._let_go(store, cp.run_id)

    async def _drive_one(self, store: Checkpointer, cp: Checkpoint, work: str) -> None:
        run_id = cp.run_id
        if self._stopping:
            return  # asked to stop between the poll and this drive: nothing in flight, nothing to start
        try:
            if work == "compensate":
                await self._compensate(store, cp)
            else:
                await self._resume(store, cp)
            self._picking.backoff.pop(run_id, None)
        except RunBusy:
            self.stats.busy += 1  # another worker (or the application) holds it: theirs
        except STOPPED_IN_JOURNAL:
            self._picking.stopped(run_id)
            self._count_end(store, run_id)
        except FencedOut as exc:
            # Another process holds the run now: it took it over (its holder's lock had gone: the
            # server ended this worker's lock session, or someone forced it), or holds its lock.
            # This worker wrote nothing more for it and stops driving it.
            self.stats.claimed += 1
            self._say(f"{self.name}: stopped driving run {quoted(run_id)}: another process holds it now ({exc})")
        except Exception as exc:  # a drive must never end the worker; the run waits and is retried
            self.stats.errors += 1
            self._picking.back_off(store, run_id, exc)

    async def _resume(self, store: Checkpointer, cp: Checkpoint) -> None:
        run_id = cp.run_id
        task = self._task(store, run_id)
        claimed = self._claims.get(run_id)
        session = Session(run_id, self.gateway_factory(), store, tenant=cp.tenant or "default", owner=self.name,
                          retry=self.retry, ownership=claimed)
        steps = cast(AsyncGenerator[Step, None], self.agent.run(task, session=session))
        self._say(f"{self.name}: claiming run {quoted(run_id)} ({cp.status}, at {cp.next_step})")
        stopped_early = took = False
        try:
            async for step in steps:
                # A run another worker finished since this one read it answers with its recorded
                # final step, without being taken over: nothing was driven here.
                took = took or not (isinstance(step, FinalStep) and step.replayed)
                if self._stopping:
                    stopped_early = True
                    break  # the step just yielded is committed; closing commits what it left pending
        finally:
            await steps.aclose()
        if not took:
            self.stats.busy += 1
            return
        self.stats.claimed += 1
        if stopped_early:
            after = store.checkpoint(run_id)
            if after is not None and after.is_open:
                self.stats.released += 1
                self._say(f"{self.name}: released run {quoted(run_id)} at {after.next_step} (stopping)")
                return
        self._count_end(store, run_id)

    async def _compensate(self, store: Checkpointer, cp: Checkpoint) -> None:
        run_id = cp.run_id
        if not self._picking.compensations_due(store, cp, "run"):
            return
        try:
            await compensate(self.agent, store, run_id, tenant=cp.tenant, retry=self.retry)
            self.stats.claimed += 1
        except UncertainEffect:
            after = store.checkpoint(run_id)
            self._picking.no_cleanup[run_id] = after.last_seq if after is not None else cp.last_seq  # a person settles it
            raise
        self.stats.compensated += 1
        after = store.checkpoint(run_id)
        if after is not None:
            self._picking.no_cleanup[run_id] = after.last_seq

    def _task(self, store: Checkpointer, run_id: str) -> str:
        """The task the run was started with (journaled in its first event)."""
        task = self._tasks.get(run_id)
        if task is None:
            start = _start_event(store.load(run_id))
            if start is None or not isinstance(start.payload.get("task"), str):
                raise CuadernoError(f"run {quoted(run_id)} has no journaled task to resume it with")
            if len(self._tasks) > 10_000:
                self._tasks.clear()  # a cache; the journal keeps every task
            task = self._tasks[run_id] = start.payload["task"]
        return task

    def _count_end(self, store: Checkpointer, run_id: str) -> None:
        cp = store.checkpoint(run_id)
        status = cp.status if cp is not None else "?"
        if status in ("completed", "suspended", "needs_human", "failed", "cancelled"):
            setattr(self.stats, status, getattr(self.stats, status) + 1)
        self._say(f"{self.name}: run {quoted(run_id)} stopped {status}")

    def _check_backlog(self, store: Checkpointer) -> None:
        """Refuse a journal whose runs waiting for a worker were all started by another agent
        definition: pointed at the wrong journal (or with the wrong ``--agent``), a worker would
        poll forever and drive nothing."""
        assert isinstance(store, SupportsClaims)
        if self._queue is not None and self._queue.has_waiting(canonical_versions(self._versions)):
            # Submitted runs of this agent wait: pointed at the right journal. One indexed read
            # instead of up to 1,000 summaries parsed, by each worker of a fleet as it starts.
            return
        waiting = [cp for cp in store.open_runs(limit=1000) if work_for(cp) is not None]
        if not waiting or any(cp.versions == self._versions for cp in waiting):
            return
        held = store.holders([cp.run_id for cp in waiting])  # runs their own processes drive are not waiting
        waiting = [cp for cp in waiting if cp.run_id not in held]
        if not waiting:
            return
        seen = waiting[0].versions
        raise UsageError(f"journal {_where(store)}: the {len(waiting)} run(s) waiting for a worker were started by "
                         f"another agent definition (versions {seen}), not by agent {self.agent.name!r} "
                         f"({self._versions}); point the worker at the agent that started them; nothing was written")

    def _say(self, line: str) -> None:
        if self._log is not None:
            self._log(line)


class _Claimed(ProcessOwnership):
    """How a worker's loop holds a run the queue claimed for it: the claim took the run over
    already (under the journal's claim lock, so that no other worker could pick it), and the
    loop's own takeover takes that epoch instead of bumping it a second time (one synced
    transaction per claimed run, as for a run found by polling). The claim took it with
    ``open_only`` as the loop does; what the loop checks before its takeover (task, versions)
    the claim matched too (a worker claims only runs of its versions). Any later takeover (a
    forced one) is the process's, as usual."""

    def __init__(self, epoch: int, *, keyed: bool = False) -> None:
        super().__init__()
        self.keyed = keyed
        """Counted against a concurrency key: its end frees a slot other workers may wait for."""
        self.epoch: int | None = epoch
        """The claim's epoch until the loop takes it (then ``None``: the loop releases the run)."""

    def acquire(self, store: Checkpointer, run_id: str, owner: str, *, force: bool, open_only: bool = False) -> int:
        epoch, self.epoch = self.epoch, None
        if epoch is not None and not force:
            return epoch
        if epoch is not None:
            store.release(run_id, epoch)
        return super().acquire(store, run_id, owner, force=force, open_only=open_only)


def _queue(store: Checkpointer) -> JournalQueue | None:
    """The journal's queue, if it has one (SQLite and PostgreSQL stores do)."""
    try:
        return queue_of(store)
    except UsageError:
        return None


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise UsageError(f"{name} must be a positive number of seconds, got {value!r:.40}")
    return float(value)


def _where(store: Checkpointer) -> str:
    return str(getattr(store, "url", None) or getattr(store, "path", None) or type(store).__name__)


def _start_event(events: list[StepEvent]) -> StepEvent | None:
    return next((ev for ev in events if ev.kind == "run" and ev.phase == "start"), None)


def load_agent(reference: str) -> Any:
    """The object ``module:attr`` names (``pkg.mod:agent``, ``pkg.mod:obj.attr``).

    Raises:
        UsageError: not of that form, the module does not import, or it has no such attribute.
    """
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{quoted(reference)} is not a reference of the form module:attr (say myapp.agents:agent)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the application's own modules import
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise UsageError(f"{quoted(reference)}: module {quoted(module_name)} does not import "
                         f"({type(exc).__name__}: {exc})") from None
    value: Any = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise UsageError(f"{quoted(reference)}: {quoted(module_name)} has no attribute {quoted(attr)}") from None
    return value
