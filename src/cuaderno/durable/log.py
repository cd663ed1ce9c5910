"""What a durable step writes through: one run's journal, as the step protocols see it.

The protocols (:mod:`cuaderno.durable.model_call`, :mod:`cuaderno.durable.effect`) never hold a
store themselves. They read the run's journal by ``(step_id, phase)``, stage events, and ask for
the staged events to be made durable before they act. Two kinds of caller provide that:

- the runner (:mod:`cuaderno.loop`), which stages a whole turn's events and commits them in one
  transaction (group commit, snapshots, crash points named per transaction);
- :class:`JournalLog`, for a caller that is not the runner (the episode parent, the Temporal
  activities, another framework's adapter): every commit is one ``append`` at the holder's epoch,
  passing the crash points its events name inside the journal's transaction, as the runner's do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from cuaderno import faults
from cuaderno.events import StepEvent
from cuaderno.journal import shared_group
from cuaderno.journal.base import Checkpointer, CommitsInGroups, ConfirmsHold, KnowsEarlierHolders

__all__ = ["Capabilities", "JournalLog", "StepLog", "confirm_hold", "earlier_holder", "numbered"]


@runtime_checkable
class StepLog(Protocol):
    """One run's journal as a durable step reads and writes it."""

    @property
    def run_id(self) -> str:
        """The run every staged event belongs to."""
        ...

    def get(self, step_id: str, phase: str) -> StepEvent | None:
        """The journaled (or staged and committed) event at ``(step_id, phase)``, if any."""
        ...

    def stage(self, event: StepEvent, *points: str) -> None:
        """Add ``event`` to the next commit. ``points`` name the crash points of that commit's
        transaction (the runner's fault-injection sweep); a log may ignore them."""
        ...

    def commit(self) -> None:
        """Make every staged event durable now (an ending record: an error, an uncertainty)."""
        ...

    async def commit_before_acting(self) -> None:
        """Make every staged event durable before a send or a body starts. The runner lets other
        runs of its event loop join the transaction; the step goes on only once it committed."""
        ...

    def confirm_hold(self) -> None:
        """Raise :class:`~cuaderno.errors.FencedOut` if this writer may have lost the run (see
        :func:`confirm_hold`): called after an effect's intent is durable, before its body."""
        ...

    def earlier_holder(self, step_id: str) -> dict[str, Any] | None:
        """An earlier holder that may still be running ``step_id`` (see :func:`earlier_holder`)."""
        ...


def numbered(log: StepLog, step_id: str, phase: str) -> list[StepEvent]:
    """A step's numbered events in order: ``phase``, ``phase.2``, ``phase.3``... Probes keys: a
    resumed run of thousands of events never pays O(journal) per step."""
    out: list[StepEvent] = []
    while (ev := log.get(step_id, phase if not out else f"{phase}.{len(out) + 1}")) is not None:
        out.append(ev)
    return out


def confirm_hold(store: Checkpointer, run_id: str, epoch: int | None) -> None:
    """Refuse to start a body once this writer may have lost the run. A store that can lose a
    holder's lock while the holder lives (PostgreSQL: the server may end its lock session) is
    :class:`~cuaderno.journal.base.ConfirmsHold` and raises :class:`~cuaderno.errors.FencedOut`
    here; a kernel lock (SQLite) cannot be lost by a living process, and memory has no second
    writer: those stores do not have the capability, and nothing is asked."""
    Capabilities(store).confirm_hold(run_id, epoch)


def earlier_holder(store: Checkpointer, run_id: str, first_intent: StepEvent | None) -> dict[str, Any] | None:
    """An earlier holder of the run that may still be executing the step whose first intent is
    ``first_intent`` (its lock was ended under it, and it may be about to make the call): then a
    lookup that finds no effect proves nothing, and the step stays uncertain (R23). ``None`` for
    a store whose takeover proves the holder let go or died (it lacks
    :class:`~cuaderno.journal.base.KnowsEarlierHolders`), or for a step never started."""
    return Capabilities(store).earlier_holder(run_id, first_intent)


class Capabilities:
    """A store's optional capabilities (holds, group commit), checked once (a ``runtime_checkable`` isinstance costs tens of
    microseconds per call: once per step it was a tenth of a tool step's CPU), then asked per step."""

    __slots__ = ("_confirm", "_earlier", "group", "store")

    def __init__(self, store: Checkpointer) -> None:
        self.store = store
        self.group = store if isinstance(store, CommitsInGroups) else shared_group(store)
        """The store as a group committer, when it is one; else the store's shared group (SQLite,
        PostgreSQL): concurrent runs on one store share commits by default, and a run alone
        commits at once as it would on the store (see :func:`cuaderno.journal.shared_group`)."""
        self._confirm = store if isinstance(store, ConfirmsHold) else None
        self._earlier = store if isinstance(store, KnowsEarlierHolders) else None

    def confirm_hold(self, run_id: str, epoch: int | None) -> None:
        """See :func:`confirm_hold`."""
        if self._confirm is not None:
            self._confirm.confirm_hold(run_id, epoch)

    def earlier_holder(self, run_id: str, first_intent: StepEvent | None) -> dict[str, Any] | None:
        """See :func:`earlier_holder`."""
        if first_intent is None or self._earlier is None:
            return None
        found = self._earlier.earlier_holder(run_id, first_intent.seq)
        return found if isinstance(found, dict) else None


class JournalLog:
    """A :class:`StepLog` that appends each commit to a store at the holder's epoch.

    For a durable step whose caller is not the runner: the episode parent, the Temporal
    activities, an adapter under another agent framework. It keeps the run's index (``index``:
    the events loaded when the run was opened, by ``(step_id, phase)``) up to date with what it
    writes. ``append`` replaces the store's append (a caller that caches the journal keeps its
    cache in step); it receives the events and returns them stamped.

    Crash points: the points a staged event names (``model.K1``, ``tool.K6``...) are armed for the
    transaction of the commit that holds it, as the runner arms them (the journal passes them
    inside its transaction, and ``K8`` between the events and the summary); after that commit,
    each ``K6`` named passes its ``K7``. A kill test of any caller can so name the same points as
    the runner's sweep, not only ``append.W*``.

    Args:
        store: the journal.
        run_id: the run.
        epoch: the fencing epoch this writer holds the run at (``None``: not checked, for a
            writer that is the run's only one by construction, as a Temporal activity of its
            workflow is).
        index: the run's events by ``(step_id, phase)``; updated in place.
        append: how to append (default: ``store.append(events, epoch=epoch)``).
    """

    def __init__(self, store: Checkpointer, run_id: str, *, epoch: int | None = None,
                 index: dict[tuple[str, str], StepEvent] | None = None,
                 append: Callable[[list[StepEvent]], Sequence[StepEvent]] | None = None) -> None:
        self.store = store
        self._run_id = run_id
        self.epoch = epoch
        self.index = index if index is not None else {}
        self._append = append or (lambda events: store.append(events, epoch=self.epoch))
        self._staged: list[StepEvent] = []
        self._points: list[str] = []
        self._caps = Capabilities(store)

    @property
    def run_id(self) -> str:
        return self._run_id

    def get(self, step_id: str, phase: str) -> StepEvent | None:
        return self.index.get((step_id, phase))

    def stage(self, event: StepEvent, *points: str) -> None:
        self._staged.append(event)
        self._points.extend(points)

    def commit(self) -> None:
        if not self._staged:
            return
        staged, self._staged = self._staged, []
        points, self._points = self._points, []
        faults.set_txn_points(*points)
        try:
            stamped = self._append(staged)
        finally:
            faults.set_txn_points()  # named for this transaction only, not for a later append
        for ev in stamped:
            self.index[(ev.step_id, ev.phase)] = ev
        if faults.armed():
            for name in points:  # K7: after the commit that holds a step's result
                if name.endswith(".K6"):
                    faults.point(name[:-1] + "7")

    async def commit_before_acting(self) -> None:
        self.commit()

    def confirm_hold(self) -> None:
        if self.epoch is not None:  # a writer that holds no epoch (a Temporal activity) has no hold to lose
            self._caps.confirm_hold(self._run_id, self.epoch)

    def earlier_holder(self, step_id: str) -> dict[str, Any] | None:
        return self._caps.earlier_holder(self._run_id, self.get(step_id, "intent"))
