"""The run's journal as the loop's steps read and write it: a :class:`~cuaderno.durable.StepLog`
over one :class:`~._state.RunState`, plus the bookkeeping every step shares (the budgets charged,
the conversation and its fingerprint, the steps shown once committed).

Writes of the state's ``pending``, ``points``, ``ready``, ``flushes``, ``unvisited``, ``spent``,
``over_budget``, ``messages``, ``unhashed`` and ``chain`` go through here. Nothing here is read on
replay that the journal does not hold: ``pending`` is what the next commit makes durable, and the
rest is rebuilt from the journal when a run is opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import itemgetter
from typing import Any

from cuaderno import faults
from cuaderno.durable import log as durable_log
from cuaderno.errors import ReplayDivergence
from cuaderno.events import StepEvent, starts_a_step
from cuaderno.fingerprint import chain, fingerprint
from cuaderno.gateway.base import Message
from cuaderno.loop import _snapshots
from cuaderno.loop._state import RunState
from cuaderno.loop.steps import Step

__all__ = ["RunLog", "StepsOver"]

_step_of = itemgetter(0)
"""The step of a ``(step, flushes)`` pair of ``RunState.ready``."""


class RunLog:
    """One run's :class:`~cuaderno.durable.StepLog` (what the model-call and effect protocols
    write through) and the loop's shared bookkeeping, over the state ``state``."""

    __slots__ = ("_caps", "journal", "run_id", "state", "store")

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.run_id = state.run_id
        """The run every staged event belongs to (fixed for the run: a plain attribute)."""
        # The same objects as the state's, for the empty-generation ladder (it reads them): the
        # state's ``journal`` dict is filled in place and its ``store`` never replaced.
        self.journal = state.journal
        self.store = state.store
        self._caps: durable_log.Capabilities | None = None

    # -- what the empty-generation ladder reads (cuaderno.gateway.ladder._Loop) --------------------

    @property
    def pending(self) -> list[StepEvent]:
        return self.state.pending

    @pending.setter
    def pending(self, value: list[StepEvent]) -> None:  # the ladder's protocol declares an attribute
        self.state.pending = value

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:  # the ladder's protocol declares an attribute
        self.state.epoch = value

    # -- budgets and shown steps --------------------------------------------------------------------

    def charge(self, counters: Mapping[str, int]) -> None:
        """Count second attempts against the agent's budgets; note the first bound exceeded."""
        st = self.state
        spent = st.spent
        for name, n in counters.items():
            spent[name] = spent.get(name, 0) + n
            limit = st.agent.budgets.limit(name)
            if limit is not None and spent[name] > limit and st.over_budget is None:
                st.over_budget = (name, limit)

    def show(self, step: Step) -> None:
        # A step is shown only once its events are committed: if any are pending, it waits for
        # the next flush (the one that commits the next intent).
        st = self.state
        st.ready.append((step, st.flushes + (1 if st.pending else 0)))

    def drain(self) -> list[Step]:
        st = self.state
        ready = st.ready
        if not ready:
            return []  # the common case on replay: nothing was shown since the last drain
        flushes = st.flushes
        if ready[-1][1] <= flushes:  # the common case running: every step shown is committed
            st.ready = []
            return [*map(_step_of, ready)]  # not a comprehension: its frame and loop run per step
        # Some wait for the next flush (a model step whose result rides on the next intent: the
        # common case after a model turn): one pass, not two comprehensions (a frame each, per step).
        shown: list[Step] = []
        waiting: list[tuple[Step, int]] = []
        for pair in ready:
            if pair[1] <= flushes:
                shown.append(pair[0])
            else:
                waiting.append(pair)
        st.ready = waiting
        return shown

    # -- journal helpers ----------------------------------------------------------------------------

    def recorded(self, step_id: str, phase: str, kind: str, name: str | None, fp: str | None) -> StepEvent | None:
        """The recorded event at ``(step_id, phase)``, checked to be the step the code is at
        (kind, name, request fingerprint); the step is then visited."""
        st = self.state
        ev = st.journal.get((step_id, phase))
        if ev is None:
            return None
        if ev.kind != kind or (name is not None and ev.name != name):
            raise ReplayDivergence(st.run_id, step_id, f"a {ev.kind} step {ev.name or ''}".strip(),
                                   f"a {kind} step {name or ''}".strip())
        if fp is not None and ev.fingerprint is not None and ev.fingerprint != fp:
            raise ReplayDivergence(st.run_id, step_id, f"{kind} request {ev.fingerprint[:12]}",
                                   f"{kind} request {fp[:12]}")
        st.unvisited.pop(step_id, None)
        return ev

    def stage(self, event: StepEvent, *points: str) -> None:
        st = self.state
        if st.unvisited:
            self.diverged(f"to write {event.kind} step {event.step_id} ({event.phase})")
        st.pending.append(event)
        st.points.extend(points)

    def diverged(self, instead: str) -> None:
        """About to write something new (or to end the run) while recorded steps were never
        reached: the code took another path than the journal (a step was removed or reordered,
        ``max_turns`` lowered). Raises :class:`ReplayDivergence` naming the first such step."""
        st = self.state
        if not st.unvisited:
            return
        first = min(st.unvisited, key=st.unvisited.__getitem__)
        seen = min((ev for (step_id, _), ev in st.journal.items() if step_id == first), key=lambda ev: ev.seq)
        name = f" ({seen.name})" if seen.name else ""
        raise ReplayDivergence(st.run_id, first, f"{seen.kind} step {first}{name} ({seen.phase}) at this point",
                               f"{instead} without reaching it")

    def commit(self) -> None:
        st = self.state
        if not st.pending:
            return
        if st.pass_marker is not None:
            st.pending.insert(0, st.pass_marker)
            st.pass_marker = None
        self._snapshot_if_due()
        group = self._capabilities().group
        if group is not None:  # joins the next group; the group names its points
            group.append(st.pending, epoch=st.epoch, points=tuple(st.points))
        else:
            faults.set_txn_points(*st.points)
            try:
                st.store.append(st.pending, epoch=st.epoch)
            finally:
                faults.set_txn_points()  # named for this transaction only, not for a later direct append
        self._flushed()

    async def commit_before_acting(self) -> None:
        """:meth:`commit` before an action (a model call, a tool body): with a :class:`GroupCommit`
        the commit waits for the end of the loop's turn, so the loop's other runs join its group
        meanwhile; this run goes on only once its events are durable."""
        st = self.state
        caps = self._caps  # self._capabilities(), its common case inline: twice per step
        group = (caps if caps is not None and caps.store is st.store else self._capabilities()).group
        if not st.pending or group is None or not group.share_loop:
            self.commit()
            return
        if st.pass_marker is not None:
            st.pending.insert(0, st.pass_marker)
            st.pass_marker = None
        snaps = st.snaps
        if snaps.since + len(st.pending) >= _snapshots.EVERY:  # _snapshot_if_due's own test first: no call per step
            self._snapshot_if_due()
        else:
            snaps.since += len(st.pending)
        await group.append_async(st.pending, epoch=st.epoch, points=tuple(st.points))
        self._flushed()

    def flush_results(self) -> None:
        """Commit what is pending except anything that would start new work."""
        st = self.state
        st.pending = [e for e in st.pending if not starts_a_step(e)]
        st.points = []
        self.commit()

    def _flushed(self) -> None:
        st = self.state
        st.flushes += 1
        if faults.armed():
            for name in st.points:  # K7: after the commit that holds a step's result
                if name.endswith(".K6"):
                    faults.point(name[:-1] + "7")
        st.pending, st.points = [], []

    def _snapshot_if_due(self) -> None:
        """Put a snapshot before a model turn's first send once :data:`._snapshots.EVERY` rows
        were written since the last (one more row of the same transaction; see :mod:`._snapshots`)."""
        st = self.state
        snaps = st.snaps
        snaps.since += len(st.pending)
        last = st.pending[-1]
        if snaps.since < _snapshots.EVERY or last.phase != "intent" or last.kind != "model" or st.migrated:
            return
        snap = _snapshots.snapshot_event(st, last)
        if snap is not None:
            st.pending.insert(len(st.pending) - 1, snap)
            st.points.append("snapshot.K6")  # K0 before, K6/K8 inside, K7 after its commit
            faults.point("snapshot.K0")
            snaps.since = 1

    def conversation(self) -> list[Message]:
        """The messages a model request sends: after a resume from a snapshot, the turns before it
        are rebuilt from the journal at the first request (:func:`._snapshots.conversation_before`)."""
        st = self.state
        if st.snaps.restored is not None:
            st.messages[1:1] = _snapshots.conversation_before(st, st.snaps.restored)
            st.snaps.restored = None
        return st.messages

    # -- the step log (cuaderno.durable.StepLog) ----------------------------------------------------

    def get(self, step_id: str, phase: str) -> StepEvent | None:
        """The event the journal held at ``(step_id, phase)`` when this pass opened the run."""
        return self.state.journal.get((step_id, phase))

    def _capabilities(self) -> durable_log.Capabilities:
        store = self.state.store
        if self._caps is None or self._caps.store is not store:
            self._caps = durable_log.Capabilities(store)
        return self._caps

    def confirm_hold(self) -> None:
        self._capabilities().confirm_hold(self.run_id, self.state.epoch)

    def earlier_holder(self, step_id: str) -> dict[str, Any] | None:
        return self._capabilities().earlier_holder(self.run_id, self.state.journal.get((step_id, "intent")))

    def event(self, step_id: str, phase: str, kind: str, **fields: Any) -> StepEvent:
        return StepEvent(run_id=self.run_id, step_id=step_id, phase=phase, kind=kind, **fields)

    # -- the conversation ---------------------------------------------------------------------------

    def add_message(self, message: Message) -> None:
        st = self.state
        st.messages.append(message)
        st.unhashed.append(message)

    def request_fingerprint(self) -> str:
        """The request fingerprint for the current conversation: the chain over every message."""
        st = self.state
        for message in st.unhashed:
            st.chain = chain(st.chain, fingerprint(message))
        st.unhashed.clear()
        return st.chain


class StepsOver:
    """What the loop's model steps and tool steps share: one run's state and log, and the log's
    per-step methods bound once (they run on every step: an attribute lookup saved each time)."""

    __slots__ = ("_add_message", "_recorded", "_show", "log", "state")

    def __init__(self, state: RunState, log: RunLog) -> None:
        self.state = state
        self.log = log
        self._add_message = log.add_message
        self._recorded = log.recorded
        self._show = log.show
