"""One run's state: a plain record the loop's collaborators share (no behaviour here).

The record is written by the collaborators that receive it (:mod:`._log`, :mod:`._snapshots`,
:mod:`._model_steps`, :mod:`._tool_steps`, :mod:`.runner`), each writing only the fields its
docstring below names. Replay needs nothing from it across processes: every field is rebuilt on
opening from the journal (``journal``, ``unvisited``, ``chain``, ``messages``, ``spent``...) or
is this process's own bookkeeping (``pending``, ``points``, ``ready``, ``flushes``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cuaderno.durable.effect import effect_key
from cuaderno.events import StepEvent
from cuaderno.events.payloads import ToolResult
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import Message, ToolCall
from cuaderno.journal.base import Checkpointer
from cuaderno.loop.agent import Agent, Session
from cuaderno.loop.executor import AgentTools, ToolExecutor, TracedTools
from cuaderno.loop.model_calls import ModelCaller, TracedGateway
from cuaderno.loop.steps import Step
from cuaderno.plainjson import sorted_compact_nan
from cuaderno.telemetry import AgentPassSpan

__all__ = ["Cursor", "Restored", "RunState", "Turn", "Unrecorded", "effect_key", "journalable_call", "new_state",
           "tool_message"]


class Turn(NamedTuple):
    """What the loop reads of a model response: its text and its tool calls, in order."""

    text: str
    tool_calls: tuple[ToolCall, ...]


class Unrecorded(NamedTuple):
    """A model call the journal holds no response for: the call to make, and with what body."""

    step_id: str
    fp: str
    """The request fingerprint (the chain over the configuration and every message so far)."""


class Restored(NamedTuple):
    """A checked snapshot the loop goes on from (:mod:`._snapshots`)."""

    seq: int
    turn: int
    chain: str
    first: str


@dataclass(slots=True)
class Cursor:
    """Where one loop stands with snapshots: what :mod:`._snapshots` keeps on the run's state (the
    loop reads ``start_turn`` and hands ``restored`` back once)."""

    since: int = 0
    """Journal rows since the run's last snapshot, as this loop counts them."""
    restored: Restored | None = None
    """The snapshot this loop went on from, until the conversation before it is rebuilt."""
    prepared: bool = False
    """Whether the store was asked to prepare tail reads (before this loop's first snapshot)."""
    start_turn: int = 0
    """The first turn the loop runs (the snapshot's: every turn before it has ended)."""


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


def journalable_call(call: ToolCall) -> ToolCall:
    """The call with a name the journal can hold. The model may write anything as a tool name
    (a megabyte, a NUL, a lone surrogate); such a call never runs, and is journaled under a
    stable stand-in (the raw name stays in the journaled response)."""
    name = call.name
    ok = 0 < len(name) <= 256 and "\x00" not in name
    if ok and not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            ok = False
    if ok:
        return call
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return dataclasses.replace(call, name=f"invalid-name-{digest}")


@dataclass(slots=True, eq=False)
class RunState:
    """What one run of one agent knows while it runs: the journal index, the conversation, and
    the events waiting for the next commit. Made by :func:`new_state`."""

    agent: Agent
    task: str
    s: Session
    run_id: str
    store: Checkpointer
    tools: ToolExecutor
    """Runs the agent's tools (:mod:`cuaderno.loop.executor`)."""
    model: ModelCaller
    """Sends the model requests (:mod:`cuaderno.loop.model_calls`)."""
    config_fp: str
    """The fingerprint of the agent's configuration: the chain's start."""
    chain: str
    """The request fingerprint so far (the chain over the configuration and ``messages`` hashed)."""
    journal: dict[tuple[str, str], StepEvent] = field(default_factory=dict)
    """The journal as this pass opened it, by ``(step_id, phase)`` (the runner fills it once)."""
    unvisited: dict[str, int] = field(default_factory=dict)
    """Recorded steps not replayed yet, with their first seq (:meth:`._log.RunLog.diverged`)."""
    pending: list[StepEvent] = field(default_factory=list)
    """Events staged for the next commit (:mod:`._log`)."""
    points: list[str] = field(default_factory=list)
    """The crash points of the next commit's transaction."""
    pass_span: AgentPassSpan = field(default_factory=AgentPassSpan)
    """The do-nothing span until a pass starts (``Runner.steps``)."""
    pass_marker: StepEvent | None = None
    """This pass's marker for the next pass's trace link (:func:`cuaderno.telemetry.agent_pass`):
    committed with the first write of the pass, never alone (a pass that writes nothing leaves none)."""
    where: tuple[str, str] = ("", "")
    """The journal and run, as the loops of this process know them (``cuaderno.loop.holds``)."""
    ready: list[tuple[Step, int]] = field(default_factory=list)
    """Steps to show, each with the number of flushes after which its events are committed."""
    flushes: int = 0
    epoch: int = 0
    """This loop's takeover epoch (0: it never took the run over)."""
    messages: list[Message] = field(default_factory=list)
    unhashed: list[Message] = field(default_factory=list)
    """Messages added to ``messages`` and not yet folded into ``chain``."""
    spent: dict[str, int] = field(default_factory=dict)
    """What this run has spent of each budget: the checkpoint's counters plus this process's."""
    over_budget: tuple[str, int] | None = None
    cancel_found: bool = False
    migrated: bool = False
    """The run was migrated to this agent's versions: recorded turns are adopted as they are."""
    rebase_turn: int | None = None
    """The first model turn after the migration (its request carries a migration marker)."""
    rebased: bool = False
    migrate_seq: int = 0
    """The seq of the last migration record (0: never migrated)."""
    snaps: Cursor = field(default_factory=Cursor)
    """Where this loop stands with snapshots (:mod:`._snapshots` keeps it)."""
    output_data: Any = None
    """The validated structured answer of the last accepted response (``output_type`` only)."""


def new_state(agent: Agent, task: str, session: Session) -> RunState:
    """The state of a run of ``agent`` on ``task`` through ``session``, before it is opened."""
    config_fp = fingerprint(agent.config())
    return RunState(agent=agent, task=task, s=session, run_id=session.run_id, store=session.store,
                    tools=session.tools or TracedTools(AgentTools(agent.tools)),
                    model=session.model_caller or TracedGateway(session.gateway),
                    config_fp=config_fp, chain=config_fp, where=("", session.run_id))
