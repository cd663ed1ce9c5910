"""Group commit: the runs of one process share a transaction and its sync.

A durable step costs one synced commit, and the sync, not the SQL, is most of it (a few ms of
fsync on this machine against ~0.2 ms of statements). Runs that commit at the same moment can
share one: :class:`GroupCommit` wraps a store, and every append handed to it joins a *group*;
one *leader* writes the whole group in one transaction, with one sync, then wakes the others
(*followers*), each with its own stored events or its own error.

By default every loop on a SQLite or PostgreSQL store commits through the store's own group
(:func:`shared_group`): an application's concurrent runs share commits as a worker's do, and a
run alone commits at once (:data:`SOLO_WINDOW_S`), so it pays nothing for it. ``store.group_commit
= False`` turns it off for a store.

Leader and followers (as a database log writer does it, without a dedicated writer thread):

- an append joins the queue; if no leader is writing, its caller becomes the leader;
- the leader takes everything queued *at that moment*, writes it, and after the commit wakes the
  callers it wrote for; appends that arrived while it wrote wait in the queue, and the first of
  them leads the next group. So a group is whatever arrived during the previous commit: at one
  run the group is one append and nothing waits; at M runs it grows to about M, with no timer;
- a caller on an event loop (:meth:`GroupCommit.append_async`) does not lead at once (it would
  block every other run on the loop before they could join): its append waits for the end of the
  loop's current iteration, when every run the loop had ready has stepped to its own next commit;
  the loop then leads that group itself, and the callers' futures resolve in the same iteration.

Why on the loop and not on a committer thread (the first version): a thread lets the sync
overlap the loop's CPU, but every hand-off between it and the loop waits for the GIL, which a
busy loop gives up only every 5 ms (``sys.getswitchinterval``); measured side by side (SQLite,
M=32, one process), the thread gave 3,900-4,600 durable steps/s against 4,700-5,700 on the loop,
at ~190 µs against ~155 µs of CPU per step. A committer thread still leads when the loop that was
handed the lead has closed (its caller gone), so nothing queued is ever left unwritten.

What is never weakened: an append returns (or its future resolves) only after the transaction
that holds its events has committed, so a caller that acts after ``append`` returns acts on a
durable intent, exactly as with the store alone; and each append keeps its own outcome. A group
whose transaction fails (one append met a fenced epoch, a stored key, a closed run; or the
database refused the commit) is rolled back whole and its appends are then written one by one,
each in its own transaction, so one run's refusal is never another's, and no append is both
refused and written. The store decides what one transaction of several runs is
(:class:`SupportsGroupAppend`); a store without it is called append by append under a lock.

Measured (``benchmarks/bench_throughput.py --repeats 3``, 50 turns per run, one tool call per
turn, the runs of a process sharing one agent as a worker's do; medians; 2 CPUs, load average
0.7 at the start, 3.2 at the end; the raw driver floor, one INSERT and one synced COMMIT per step
on one connection, measured in the same invocation before and after the cells: 6,255 / 6,337
steps/s for sqlite3, 1,423 / 1,746 for psycopg), durable steps/s, the store alone / through a
group, and the group's mean size:

============  =====================  =====================  ==========
processes, M  SQLite                 PostgreSQL             mean group
============  =====================  =====================  ==========
1, M=1        1,780 / 1,797          595 / 615              1
1, M=8        2,305 / 5,317          735 / 1,975            7
1, M=32       2,624 / 7,723 (1.23x)  794 / 3,355 (2.12x)    20
1, M=128      2,453 / 6,956          680 / 3,337            37
2, M=32       2,516 / 5,989          1,131 / 3,072          12
4, M=32       2,222 / 4,552          1,351 / 3,063          7
4, M=128      1,851 / 4,170          1,385 / 4,824          20
============  =====================  =====================  ==========

(1.23x, 2.12x: the floor's multiple.) A second run of the SQLite cells (``--backends sqlite --runs
1,32 --procs 1 --repeats 5``): M=32 through a group 7,098 steps/s against a floor of 5,129 / 4,977
(1.40x); M=1 1,494 against 1,506 alone. p50 step latency at M=32: 3.4 ms on SQLite, 6.4 ms on
PostgreSQL (a step waits for the group it rides in). A run alone commits at once
(:data:`SOLO_WINDOW_S`), and PostgreSQL writes a group of one with the plain append's statements.

The floors move with the virtual disk's sync latency, not with cuaderno: on another day the same
benchmark measured 15,552 / 11,149 for sqlite3 and 4,364 / 5,028 for psycopg, and there SQLite
M=32 through a group reached 0.38x its floor. What bounds it then is CPU: the loop over an
in-memory store that writes nothing (the ceiling cell; 10,065 steps/s at M=128 in the run above)
cannot reach a floor of 15,000 whatever the commits cost.

PostgreSQL is bound by CPU on this machine: at M=32 through a group, a step took 164-228 µs of
the worker's CPU and 58-83 µs of the server's (``benchmarks/bench_cpu_per_step.py``, two runs:
rusage and ``/proc``), so 2 CPUs hold at most about 6,400-9,000 steps/s however many worker
processes share them. Four processes cannot reach 3x one (9,600-13,500: one process made
3,205-4,493 in those runs), and one process cannot reach 5x the psycopg floor wherever the floor
is above ~1,800 (it measured 1,423-5,028).

Crash points (``cuaderno.testing.crash``): ``group.G1`` inside the group's transaction, every
append of the group written, before COMMIT (nothing of the group is durable: none may have
acted); ``group.G2`` after the commit, before any follower is woken (all of it is durable, and
none has acted yet: a resume finds intents without results).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cuaderno import faults
from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import UsageError
from cuaderno.events import StepEvent
from cuaderno.journal.base import Checkpointer

__all__ = ["SOLO_WINDOW_S", "GroupBatch", "GroupCommit", "SupportsGroupAppend", "shared_group"]

SOLO_WINDOW_S = 0.05
"""How long one run must have been the only one appending before its commits are made at once
(not deferred to the end of the loop's iteration): a run alone gains nothing from a group."""


@dataclass(frozen=True, eq=False)
class GroupBatch:
    """One caller's append, as the leader writes it: the arguments of
    :meth:`~cuaderno.journal.base.Checkpointer.append`, and the crash points the loop named for
    its transaction (``tool.K1``...), fired when this append is written."""

    events: Sequence[StepEvent]
    epoch: int | None = None
    expect_seq: int | None = None
    points: tuple[str, ...] = ()


@runtime_checkable
class SupportsGroupAppend(Protocol):
    """Optional capability: the appends of several runs in one transaction and one sync."""

    def append_group(self, batches: Sequence[GroupBatch]) -> list[list[StepEvent] | Exception]:
        """Write every batch in one transaction; return, per batch in order, its stored events or
        the error that refused it.

        All or nothing first: if any batch is refused, or the commit fails, the transaction is
        rolled back and every batch is then appended on its own (its own transaction), so that the
        outcome of each is exactly what :meth:`append` alone would have given it. Fires
        ``group.G1`` inside the shared transaction before COMMIT.
        """
        ...


class _Slot:
    """One waiting append: its batch, and where its outcome goes."""

    __slots__ = ("batch", "done", "error", "future", "lead", "loop", "result", "woken")

    def __init__(self, batch: GroupBatch, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.batch = batch
        self.result: list[StepEvent] | None = None
        self.error: BaseException | None = None
        self.done = False
        self.lead = False
        """Set by the last leader: this caller leads the next group."""
        self.woken = threading.Event() if loop is None else None
        """How a caller blocked in append() is woken (one on a loop awaits its future instead)."""
        self.loop = loop
        self.future: asyncio.Future[list[StepEvent]] | None = loop.create_future() if loop is not None else None


class GroupCommit:
    """A :class:`~cuaderno.journal.base.Checkpointer` that groups the appends of concurrent runs
    into one transaction and one sync of the store it wraps (see the module's docstring).

    Everything but ``append`` goes to the store as it is. Share one ``GroupCommit`` between the
    runs of a process (threads, or tasks of one event loop through :meth:`append_async`); closing
    it closes the store.

    Args:
        store: the journal; with :class:`SupportsGroupAppend` (SQLite, PostgreSQL) the group is
            one transaction, otherwise its appends are made one by one.
        max_group: the most appends one transaction holds (the rest lead the next group).
        share_loop: the loop commits a step's intent through :meth:`append_async` (at the end of
            the loop's iteration), so that runs sharing an event loop share commits; ``False``: it
            commits at once in :meth:`append`, as with the store alone (then only runs on other
            threads group).
        close_store: :meth:`close` closes the store too (``False``: the caller keeps it open).
        alone_direct: a run appending alone calls the store's ``append`` itself (see
            :attr:`alone_direct`); ``False`` (the default): it commits through a group of one.
    """

    max_payload: int | None = None
    offload_above: int | None = None
    """The store's size settings (:func:`cuaderno.journal.base.byte_setting`): ``None`` here (unless
    set on this wrapper) sends the read on to the store. Declared, not left to :meth:`__getattr__`,
    because every step reads them, and a miss there costs an AttributeError raised and caught."""

    def __init__(self, store: Checkpointer, *, max_group: int = 512, share_loop: bool = True,
                 close_store: bool = True, alone_direct: bool = False) -> None:
        if not isinstance(store, Checkpointer):
            raise UsageError(f"GroupCommit needs a Checkpointer, got {type(store).__name__}")
        if isinstance(max_group, bool) or not isinstance(max_group, int) or max_group < 1:
            raise UsageError("max_group must be a positive integer")
        self.store = store
        self.path = getattr(store, "path", None)
        """The store's file, if it has one: two handles on one file are one journal (``_holds``)."""
        self._max = max_group
        self.share_loop = bool(share_loop)
        self._close_store = bool(close_store)
        self._cond = threading.Lock()
        self._queue: list[_Slot] = []
        self._leading = False
        self._committer: ThreadPoolExecutor | None = None
        """Leads a group only when a loop that was handed the lead has closed (its caller gone)."""
        self._flush_pending = False
        """A loop has a flush scheduled at the end of its iteration."""
        self._last_run: str | None = None
        self._mixed_at = float("-inf")
        """When an append last came from another run than the one before it."""
        self.groups = 0
        """Transactions written so far (``appends / groups`` is the mean group size)."""
        self.appends = 0
        self.alone_direct = bool(alone_direct)
        """A run appending alone (:meth:`_alone`) goes to the store's own ``append``, not through a
        group of one: the same call, crash points and cost as without a group (the store's shared
        group does this: :func:`shared_group`)."""
        self.direct = 0
        """Appends made that way (not counted in ``groups`` or ``appends``)."""

    # -- appends ----------------------------------------------------------------------------------

    def append(self, events: Sequence[StepEvent], *, epoch: int | None = None, expect_seq: int | None = None,
               points: tuple[str, ...] = ()) -> list[StepEvent]:
        """:meth:`Checkpointer.append`, in the next group; returns once its events are durable."""
        if not events:
            return []
        if self.alone_direct and self._alone(events[0].run_id) and not self._leading:
            return self._append_direct(events, epoch, expect_seq, points)
        slot = _Slot(GroupBatch(events, epoch, expect_seq, points))
        if self._join(slot):
            self._lead()
        while not slot.done:
            assert slot.woken is not None
            slot.woken.wait()
            slot.woken.clear()
            if slot.lead and not slot.done:
                self._lead()
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        return slot.result

    async def append_async(self, events: Sequence[StepEvent], *, epoch: int | None = None,
                           expect_seq: int | None = None, points: tuple[str, ...] = ()) -> list[StepEvent]:
        """The same, for a caller on an event loop: the append waits for the end of the loop's
        current iteration, so that every run the loop steps meanwhile joins the same group; the
        group is then written on the loop, and this caller goes on once it has committed."""
        if not events:
            return []
        if self._alone(events[0].run_id):
            # One run: nobody could join its group, and a deferral would be pure cost.
            return self.append(events, epoch=epoch, expect_seq=expect_seq, points=points)
        loop = asyncio.get_running_loop()
        slot = _Slot(GroupBatch(events, epoch, expect_seq, points), loop)
        with self._cond:
            self._queue.append(slot)
            schedule = not self._leading and not self._flush_pending
            self._flush_pending = self._flush_pending or schedule
        if schedule:
            loop.call_soon(self._flush_on_loop)
        assert slot.future is not None
        return await slot.future

    def _append_direct(self, events: Sequence[StepEvent], epoch: int | None, expect_seq: int | None,
                       points: tuple[str, ...]) -> list[StepEvent]:
        """The store's own append, with the loop's crash points armed for its transaction, exactly
        as the loop appends without a group. Another thread's group may commit meanwhile: each is
        its own transaction, as two appends to the store always are."""
        faults.set_txn_points(*points)
        try:
            out = self.store.append(events, epoch=epoch, expect_seq=expect_seq)
        finally:
            faults.set_txn_points()
        with self._cond:
            self.direct += 1
        return out

    def _flush_on_loop(self) -> None:
        """At the end of a loop iteration: lead a group of everything queued, unless a leader
        (another thread's caller) is writing; it hands the lead on to what it left queued."""
        with self._cond:
            self._flush_pending = False
            if self._leading or not self._queue:
                return
            self._leading = True
        self._lead()

    def _alone(self, run_id: str) -> bool:
        """Whether only this run has appended for ``SOLO_WINDOW_S``: then it commits at once, exactly
        as the store alone would, and does not wait for the end of the loop's iteration."""
        now = time.monotonic()
        if run_id != self._last_run:
            if self._last_run is not None:
                self._mixed_at = now
            self._last_run = run_id
        return now - self._mixed_at > SOLO_WINDOW_S

    def _join(self, slot: _Slot) -> bool:
        """Queue the slot; ``True``: no leader is writing, so the caller leads."""
        with self._cond:
            self._queue.append(slot)
            if self._leading:
                return False
            self._leading = True
            return True

    def _hand_to_committer(self) -> None:
        if self._committer is None:
            with self._cond:
                if self._committer is None:
                    self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cuaderno-group")
        fut: Future[None] = self._committer.submit(self._lead)
        del fut  # its outcome is the slots'; _lead never raises

    def _lead(self) -> None:
        """Write one group (everything queued now, up to ``max_group``), wake its callers, and pass
        the lead to the first caller still waiting (or drop it)."""
        with self._cond:
            group, self._queue = self._queue[:self._max], self._queue[self._max:]
        try:
            outcomes = self._write(group)
        except BaseException as exc:  # every caller gets it, none is left waiting
            outcomes = [exc] * len(group)
        faults.point("group.G2")  # committed, nobody woken: all durable, none acted
        with self._cond:
            self.groups += 1
            self.appends += len(group)
            # A caller blocked in append() leads before any loop: it may be blocking the very loop
            # the lead would be handed to.
            nxt = next((w for w in self._queue if w.future is None), self._queue[0] if self._queue else None)
            if nxt is None:
                self._leading = False
        for slot, outcome in zip(group, outcomes, strict=True):
            self._settle(slot, outcome)
        if nxt is not None:
            if nxt.future is None:
                assert nxt.woken is not None
                nxt.lead = True
                nxt.woken.set()
            else:
                self._hand_to_loop(nxt)

    def _hand_to_loop(self, nxt: _Slot) -> None:
        """Pass the lead to the loop of the first caller still waiting (it writes the next group
        at the end of its iteration); if that loop has closed, the committer thread leads."""
        assert nxt.loop is not None
        try:
            if _running_loop() is nxt.loop:
                nxt.loop.call_soon(self._lead)
            else:
                nxt.loop.call_soon_threadsafe(self._lead)
        except RuntimeError:  # the loop closed: nobody would ever write what waits
            self._hand_to_committer()

    def _write(self, group: list[_Slot]) -> list[list[StepEvent] | BaseException]:
        batches = [slot.batch for slot in group]
        store = self.store
        if isinstance(store, SupportsGroupAppend):
            return list(store.append_group(batches))
        out: list[list[StepEvent] | BaseException] = []
        faults.point("group.G1")  # a store without a shared transaction: nothing of the group written yet
        for b in batches:  # one by one, as the callers would
            faults.set_txn_points(*b.points)
            try:
                out.append(store.append(b.events, epoch=b.epoch, expect_seq=b.expect_seq))
            except Exception as exc:  # the caller's own outcome
                out.append(exc)
            finally:
                faults.set_txn_points()
        return out

    @staticmethod
    def _settle(slot: _Slot, outcome: list[StepEvent] | BaseException) -> None:
        if isinstance(outcome, BaseException):
            slot.error = outcome
        else:
            slot.result = outcome
        slot.done = True
        if slot.future is not None and slot.loop is not None:
            if _running_loop() is slot.loop:
                _resolve(slot.future, outcome)  # on its own loop: wake it in this iteration
            else:
                try:
                    slot.loop.call_soon_threadsafe(_resolve, slot.future, outcome)
                except RuntimeError:  # its loop closed: the caller is gone, its events are durable
                    pass
        elif slot.woken is not None:
            slot.woken.set()

    # -- everything else is the store's -----------------------------------------------------------

    def load(self, run_id: str) -> list[StepEvent]:
        return self.store.load(run_id)

    def checkpoint(self, run_id: str) -> Checkpoint | None:
        return self.store.checkpoint(run_id)

    def list_runs(self, *, status: str | None = None, limit: int = 100) -> list[Checkpoint]:
        return self.store.list_runs(status=status, limit=limit)

    def acquire(self, run_id: str, owner: str, *, force: bool = False, open_only: bool = False) -> int:
        return self.store.acquire(run_id, owner, force=force, open_only=open_only)

    def release(self, run_id: str, epoch: int) -> None:
        self.store.release(run_id, epoch)

    def close(self) -> None:
        committer, self._committer = self._committer, None
        if committer is not None:
            committer.shutdown(wait=True)
        if self._close_store:
            self.store.close()

    def __getattr__(self, name: str) -> Any:
        """The store's optional capabilities (tail reads for snapshots, a worker's claims, summary
        rebuilds) as its own: they read, or write alone, and need no group. Only attributes this
        class lacks come here, so a capability the store lacks is lacked here too."""
        if name == "store" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.store, name)

    def __enter__(self) -> GroupCommit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _resolve(future: asyncio.Future[list[StepEvent]], outcome: list[StepEvent] | BaseException) -> None:
    if future.done():
        return  # the awaiting task was cancelled: its events are durable all the same
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


_SHARED = "_cuaderno_shared_group"
_shared_lock = threading.Lock()


def shared_group(store: Checkpointer) -> GroupCommit | None:
    """The group every loop on ``store`` commits through by default: one per store object, made
    at the first ask, for a store that writes a group in one transaction
    (:class:`SupportsGroupAppend`: SQLite, PostgreSQL); ``None`` for another store, or one whose
    ``group_commit`` attribute is ``False`` (the loop then appends to the store directly).

    Why by default: it cannot cost a run alone anything, and it is what an application's
    concurrent runs on one store need. A run that is the only one appending commits at once
    through the store's own ``append`` (:data:`SOLO_WINDOW_S`, ``alone_direct``), as with no
    group at all; only when
    several runs append does a commit wait for the end of the loop's turn, so that the runs the
    loop steps meanwhile share its transaction and sync. Every append still returns only once
    its own transaction committed, and keeps its own outcome (see the module's docstring). The
    group lives as long as its store (an attribute of it) and never closes it."""
    if isinstance(store, GroupCommit):
        return store
    if not isinstance(store, SupportsGroupAppend) or getattr(store, "group_commit", True) is False:
        return None
    found = getattr(store, _SHARED, None)
    if isinstance(found, GroupCommit):
        return found
    with _shared_lock:
        found = getattr(store, _SHARED, None)
        if not isinstance(found, GroupCommit):
            found = GroupCommit(store, close_store=False, alone_direct=True)
            try:
                setattr(store, _SHARED, found)
            except AttributeError:  # a store without a __dict__: no shared group (appended directly)
                return None
    return found

