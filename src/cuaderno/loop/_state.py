"""State and journal helpers shared by the model and tool halves of the loop."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from cuaderno import faults
from cuaderno.durable import log as durable_log
from cuaderno.durable.effect import effect_key
from cuaderno.errors import ReplayDivergence
from cuaderno.events import StepEvent, numbered
from cuaderno.events.payloads import ToolResult
from cuaderno.fingerprint import chain, fingerprint
from cuaderno.gateway.base import Message, ToolCall
from cuaderno.loop import _snapshots
from cuaderno.loop.agent import Agent, Session
from cuaderno.loop.executor import AgentTools, ToolExecutor, TracedTools
from cuaderno.loop.model_calls import ModelCaller, TracedGateway
from cuaderno.loop.steps import Step
from cuaderno.plainjson import sorted_compact_nan
from cuaderno.telemetry import AgentPassSpan

__all__ = ["RunState", "Turn", "Unrecorded", "effect_key", "tool_message"]


class Turn(NamedTuple):
    """What the loop reads of a model response: its text and its tool calls, in order."""

    text: str
    tool_calls: tuple[ToolCall, ...]


class Unrecorded(NamedTuple):
    """A model call the journal holds no response for: the call to make, and with what body."""

    step_id: str
    fp: str
    """The request fingerprint (the chain over the configuration and every message so far)."""


def tool_message(call_id: str, name: str, payload: ToolResult) -> Message:
    """The tool message the model sees for a journaled tool result (same text on every replay)."""
    outcome = payload.get("outcome")
    if outcome == "ok":
        content = sorted_compact_nan(payload.get("value"))
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content, "is_error": False}
    if outcome == "denied":
        content = f"denied: {payload.get('reason') or 'not allowed'}. The tool did not run."
    else:
        err = payload.get("error") or {}
        content = f"error [{err.get('error_class', 'bug')}]: {err.get('message', '')}"
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content, "is_error": True}


class RunState:
    """What one run of one agent knows while it runs: the journal index, the conversation, and
    the events waiting for the next commit."""

    def __init__(self, agent: Agent, task: str, session: Session) -> None:
        self.agent = agent
        self.task = task
        self.s = session
        self.run_id = session.run_id
        self.store = session.store
        self.tools: ToolExecutor = session.tools or TracedTools(AgentTools(agent.tools))
        """Runs the agent's tools (:mod:`cuaderno.loop.executor`)."""
        self.model: ModelCaller = session.model_caller or TracedGateway(session.gateway)
        """Sends the model requests (:mod:`cuaderno.loop.model_calls`)."""
        self.journal: dict[tuple[str, str], StepEvent] = {}
        self.unvisited: dict[str, int] = {}
        self.pending: list[StepEvent] = []
        self.pass_span = AgentPassSpan()  # the do-nothing one until a pass starts (Runner.steps)
        self.pass_marker: StepEvent | None = None
        """This pass's marker for the next pass's trace link (:func:`cuaderno.telemetry.agent_pass`):
        committed with the first write of the pass, never alone (a pass that writes nothing leaves none)."""
        self.tool_sends: dict[str, int] = {}
        self.where: tuple[str, str] = ("", session.run_id)
        """The journal and run, as the loops of this process know them (``cuaderno.loop.holds``)."""
        """Tool intents per step, recorded or written by this process (names the next one)."""
        self.points: list[str] = []
        self.ready: list[tuple[Step, int]] = []
        self.flushes = 0
        self.epoch = 0
        self.messages: list[Message] = []
        self.config_fp = fingerprint(agent.config())
        self.chain = self.config_fp
        self.unhashed: list[Message] = []
        self.spent: dict[str, int] = {}
        """What this run has spent of each budget: the checkpoint's counters plus this process's."""
        self.over_budget: tuple[str, int] | None = None
        self.cancel_found = False
        self.migrated = False
        """The run was migrated to this agent's versions: recorded turns are adopted as they are."""
        self.rebase_turn: int | None = None
        """The first model turn after the migration (its request carries a migration marker)."""
        self.rebased = False
        self.migrate_seq = 0
        self.snaps = _snapshots.Cursor()
        """Where this loop stands with snapshots (:mod:`._snapshots` keeps it)."""
        """The seq of the last migration record (0: never migrated)."""

    def charge(self, counters: Mapping[str, int]) -> None:
        """Count second attempts against the agent's budgets; note the first bound exceeded."""
        for name, n in counters.items():
            self.spent[name] = self.spent.get(name, 0) + n
            limit = self.agent.budgets.limit(name)
            if limit is not None and self.spent[name] > limit and self.over_budget is None:
                self.over_budget = (name, limit)

    def _show(self, step: Step) -> None:
        # A step is shown only once its events are committed: if any are pending, it waits for
        # the next flush (the one that commits the next intent).
        self.ready.append((step, self.flushes + (1 if self.pending else 0)))

    def _drain(self) -> list[Step]:
        if not self.ready:
            return []  # the common case on replay: nothing was shown since the last drain
        if self.ready[-1][1] <= self.flushes:  # the common case running: every step shown is committed
            out = [step for step, _ in self.ready]
            self.ready = []
            return out
        out = [step for step, needs in self.ready if needs <= self.flushes]
        self.ready = [(step, needs) for step, needs in self.ready if needs > self.flushes]
        return out

    # -- journal helpers --------------------------------------------------------------------------

    def _recorded(self, step_id: str, phase: str, kind: str, name: str | None, fp: str | None) -> StepEvent | None:
        ev = self.journal.get((step_id, phase))
        if ev is None:
            return None
        if ev.kind != kind or (name is not None and ev.name != name):
            raise ReplayDivergence(self.run_id, step_id, f"a {ev.kind} step {ev.name or ''}".strip(),
                                   f"a {kind} step {name or ''}".strip())
        if fp is not None and ev.fingerprint is not None and ev.fingerprint != fp:
            raise ReplayDivergence(self.run_id, step_id, f"{kind} request {ev.fingerprint[:12]}",
                                   f"{kind} request {fp[:12]}")
        self.unvisited.pop(step_id, None)
        return ev

    def stage(self, event: StepEvent, *points: str) -> None:
        if self.unvisited:
            self._diverged(f"to write {event.kind} step {event.step_id} ({event.phase})")
        self.pending.append(event)
        self.points.extend(points)

    def _diverged(self, instead: str) -> None:
        """About to write something new (or to end the run) while recorded steps were never
        reached: the code took another path than the journal (a step was removed or reordered,
        ``max_turns`` lowered). Raises :class:`ReplayDivergence` naming the first such step."""
        if not self.unvisited:
            return
        first = min(self.unvisited, key=self.unvisited.__getitem__)
        seen = min((ev for (step_id, _), ev in self.journal.items() if step_id == first), key=lambda ev: ev.seq)
        name = f" ({seen.name})" if seen.name else ""
        raise ReplayDivergence(self.run_id, first, f"{seen.kind} step {first}{name} ({seen.phase}) at this point",
                               f"{instead} without reaching it")


    def commit(self) -> None:
        if not self.pending:
            return
        if self.pass_marker is not None:
            self.pending.insert(0, self.pass_marker)
            self.pass_marker = None
        self._snapshot_if_due()
        group = self._capabilities().group
        if group is not None:  # joins the next group; the group names its points
            group.append(self.pending, epoch=self.epoch, points=tuple(self.points))
        else:
            faults.set_txn_points(*self.points)
            try:
                self.store.append(self.pending, epoch=self.epoch)
            finally:
                faults.set_txn_points()  # named for this transaction only, not for a later direct append
        self._flushed()

    async def commit_before_acting(self) -> None:
        """:meth:`commit` before an action (a model call, a tool body): with a :class:`GroupCommit`
        the commit waits for the end of the loop's turn, so the loop's other runs join its group
        meanwhile; this run goes on only once its events are durable."""
        group = self._capabilities().group
        if not self.pending or group is None or not group.share_loop:
            self.commit()
            return
        if self.pass_marker is not None:
            self.pending.insert(0, self.pass_marker)
            self.pass_marker = None
        self._snapshot_if_due()
        await group.append_async(self.pending, epoch=self.epoch, points=tuple(self.points))
        self._flushed()

    def _flushed(self) -> None:
        self.flushes += 1
        if faults.armed():
            for name in self.points:  # K7: after the commit that holds a step's result
                if name.endswith(".K6"):
                    faults.point(name[:-1] + "7")
        self.pending, self.points = [], []

    def _snapshot_if_due(self) -> None:
        """Put a snapshot before a model turn's first send once :data:`._snapshots.EVERY` rows
        were written since the last (one more row of the same transaction; see :mod:`._snapshots`)."""
        self.snaps.since += len(self.pending)
        last = self.pending[-1]
        if self.snaps.since < _snapshots.EVERY or last.phase != "intent" or last.kind != "model" or self.migrated:
            return
        snap = _snapshots.snapshot_event(self, last)
        if snap is not None:
            self.pending.insert(len(self.pending) - 1, snap)
            self.points.append("snapshot.K6")  # K0 before, K6/K8 inside, K7 after its commit
            faults.point("snapshot.K0")
            self.snaps.since = 1

    def _conversation(self) -> list[Message]:
        """The messages a model request sends: after a resume from a snapshot, the turns before it
        are rebuilt from the journal at the first request (:func:`._snapshots.conversation_before`)."""
        if self.snaps.restored is not None:
            self.messages[1:1] = _snapshots.conversation_before(self, self.snaps.restored)
            self.snaps.restored = None
        return self.messages

    # -- the step log (cuaderno.durable.StepLog) --------------------------------------------------

    def get(self, step_id: str, phase: str) -> StepEvent | None:
        """The event the journal held at ``(step_id, phase)`` when this pass opened the run."""
        return self.journal.get((step_id, phase))

    _caps: durable_log.Capabilities | None = None

    def _capabilities(self) -> durable_log.Capabilities:
        if self._caps is None or self._caps.store is not self.store:
            self._caps = durable_log.Capabilities(self.store)
        return self._caps

    def confirm_hold(self) -> None:
        self._capabilities().confirm_hold(self.run_id, self.epoch)

    def earlier_holder(self, step_id: str) -> dict[str, Any] | None:
        return self._capabilities().earlier_holder(self.run_id, self.journal.get((step_id, "intent")))

    def _recorded_count(self, step_id: str, phase: str) -> int:
        """How many numbered events (``phase``, ``phase.2``, ``phase.3``...) the journal holds for a
        step (probing keys: a resumed run of thousands of events must not pay O(journal) per step)."""
        return len(numbered(self.journal, step_id, phase))

    def _latest(self, step_id: str, phase: str) -> StepEvent | None:
        """The last of a step's numbered events (``phase``, ``phase.2``...) in the journal."""
        found = numbered(self.journal, step_id, phase)
        return found[-1] if found else None

    def _event(self, step_id: str, phase: str, kind: str, **fields: Any) -> StepEvent:
        return StepEvent(run_id=self.run_id, step_id=step_id, phase=phase, kind=kind, **fields)

    def _add_message(self, message: Message) -> None:
        self.messages.append(message)
        self.unhashed.append(message)

    def _request_fingerprint(self) -> str:
        """The request fingerprint for the current conversation: the chain over every message."""
        for message in self.unhashed:
            self.chain = chain(self.chain, fingerprint(message))
        self.unhashed.clear()
        return self.chain

    # -- model turns ------------------------------------------------------------------------------
