"""Activity and workflow names, and their inputs: stable forever.

A step cannot be deleted from a live workflow history: a worker replaying a history recorded
by an older cuaderno must find every activity it scheduled under the same name, with inputs of
the same shape. New fields may be added with defaults; nothing here is renamed or removed.
``tests/temporal/histories/`` holds recorded histories that every test run replays.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Required, TypedDict

from cuaderno.events import EventHeader, StepEvent
from cuaderno.events.payloads import Response
from cuaderno.loop.agent import RetryPolicy

__all__ = ["APPLY", "DECIDE", "EPISODE_CHILD", "EPISODE_LOAD", "EPISODE_RECORD", "EPISODE_WORKFLOW", "EarlierSteps", "EventRow", "GivenDecision", "event_row", "row_event", "JOURNAL_MARK", "JournalMark", "Replayed", "ReplayedModel", "ReplayedTool", "LOOKUP", "MODEL_TURN", "RECORD", "REPLAY_RUN", "TASK_REF", "RecordInput", "TOOL_CALL", "WORKER_SHUTDOWN", "WORKFLOW",
           "ReplayInput", "ModelTurnInput", "RunInput", "ToolCallInput", "slim_input"]

WORKFLOW: Final = "cuaderno.run"
MODEL_TURN: Final = "cuaderno.model_turn"
TOOL_CALL: Final = "cuaderno.tool_call"
LOOKUP: Final = "cuaderno.tool_lookup"
REPLAY_RUN: Final = "cuaderno.replay_run"
RECORD: Final = "cuaderno.record"
JOURNAL_MARK: Final = "cuaderno.journal_mark"
# The episodes' workflows and activities (cuaderno.temporal._child).
EPISODE_WORKFLOW: Final = "cuaderno.episode"
EPISODE_CHILD: Final = "cuaderno.episode_child"
DECIDE: Final = "cuaderno.episode_decide"
APPLY: Final = "cuaderno.episode_apply"
EPISODE_RECORD: Final = "cuaderno.episode_record"
EPISODE_LOAD: Final = "cuaderno.episode_load"
TASK_REF: Final = {"role": "user", "ref": "task"}
"""The task's message in a model input: the activity reads the text from the workflow's start
event (turn 0 of the first run, before the journal has the run) or from the journal's ``run
start`` row; the history holds the task once, in the start event."""
WORKER_SHUTDOWN: Final = "WorkerShutdown"
"""The failure type an activity reports when its worker shuts down under it (a deploy)."""


class EventRow(EventHeader):
    """A journal event as an activity input or result carries it (workflow to journal, journal to
    workflow): the row without its run, seq, time and hash, which the receiving journal assigns.
    The row is found again by ``(step_id, phase)``: an event already there is not written twice."""

    payload: Mapping[str, Any]
    """The event's payload as journaled; held to its (kind, phase) type before it is written."""


def event_row(ev: StepEvent) -> EventRow:
    """``ev`` as it crosses Temporal's data converter."""
    return {"step_id": ev.step_id, "phase": ev.phase, "kind": ev.kind, "name": ev.name, "decision": ev.decision,
            "fingerprint": ev.fingerprint, "payload": ev.payload}


def row_event(run_id: str, row: EventRow) -> StepEvent:
    """The event ``row`` describes, in run ``run_id`` (rows from older histories may lack the
    optional fields)."""
    return StepEvent(run_id=run_id, step_id=row["step_id"], phase=row["phase"], kind=row["kind"],
                     name=row.get("name"), decision=row.get("decision"), fingerprint=row.get("fingerprint"),
                     payload=dict(row.get("payload") or {}))


class GivenDecision(TypedDict):
    """A person's approval decision the workflow received (by approval step id in
    :attr:`RunInput.decisions`): applied to its journal when the loop reaches the step, and carried
    across continue-as-new so nobody is asked twice. ``fingerprint``, when given, must match the
    pending call's (a decision about other arguments is refused)."""

    approve: bool
    fingerprint: str | None
    approver: str | None
    reason: str | None


class JournalMark(TypedDict):
    """The run's last row in the activities' journal when a run continued-as-new: the next run
    reads the journal up to it. Both fields are checked against that row (same seq, same row
    hash), so a journal restored from an older copy, or another journal, is refused."""

    seq: int
    hash: str


class ReplayedModel(TypedDict):
    """A model step journaled by an earlier run of the workflow: handed back when the loop asks
    again with the same ``key`` (a different key is a different send)."""

    key: str | None
    response: Response | None


class ReplayedTool(TypedDict, total=False):
    """A tool step journaled by an earlier run of the workflow: handed back when the loop asks
    with the same ``effect_key``; ``error`` when its outcome was one, else ``value`` (a large
    value as a reference to its row, :data:`REF`)."""

    effect_key: Required[str | None]
    outcome: Required[str | None]
    error: Mapping[str, Any]
    value: Any


class Replayed(TypedDict):
    """What earlier runs of a workflow journaled, by step id (the ``replay_run`` activity's result)."""

    model: dict[str, ReplayedModel]
    tools: dict[str, ReplayedTool]


class EarlierSteps(Replayed, total=False):
    """:class:`Replayed` read up to a :class:`JournalMark`, with the run's task from its ``run
    start`` row (``None`` when the rows hold none)."""

    task: str | None


@dataclass
class RunInput:
    """The workflow's input (and what a continue-as-new carries): the run is the workflow id.

    ``decisions`` are the approvals people gave in earlier runs of this workflow (small decision
    data, by approval step id), so a run continued-as-new does not ask again.
    """

    agent: str
    task: str
    tenant: str = "default"
    decisions: dict[str, GivenDecision] = field(default_factory=dict[str, GivenDecision])
    max_history_events: int = 0
    """Continue-as-new once the history holds this many events (0: when the server suggests it)."""
    mark: JournalMark | None = None
    """Set by a continue-as-new: ``{"seq", "hash"}`` of the run's last row in the activities'
    journal when the earlier run ended. The new run reads the journal up to that row (rows there
    never change: append-only and hash-chained, the hash checked) instead of carrying results in
    its history. ``None`` on a first run, and on runs continued before marks existed (those ask
    ``cuaderno.replay_run``)."""
    task_in_journal: bool = False
    """Set by a continue-as-new (with ``task`` empty): the task is the journal's ``run start``
    row, read with the earlier steps at the mark, so its text is not in every run's history."""
    retry: RetryPolicy | None = None
    """The loop's retry bounds for this run (``None``: the agent's, from :func:`cuaderno.temporal.register`
    or the policy file's ``[retry]``, else :class:`~cuaderno.RetryPolicy`'s defaults). A
    continue-as-new carries the bounds the run used, so a worker deployed with other bounds does
    not change a run in flight at its next run."""


@dataclass
class ModelTurnInput:
    """One model call, by reference. The request is re-derived from cuaderno's journal.

    ``new_messages`` holds only what the conversation gained since the previous request of this
    run: tool messages and the task on turn 0. A tool message whose result the tool activity
    journaled is a reference (``{"role": "tool", "tool_call_id", "name", "ref": STEP_ID}``), and a
    large result returned to the workflow as a reference stays one; only denials, errors and
    results found by a lookup travel as text. The assistant messages are references (``{"role": "assistant", "ref":
    STEP_ID}``) to the responses the journal holds, so nothing the history already has is sent
    twice. Since the history-size work, both are usually a bare step id instead (``"t0003.model"``,
    ``"t0003.tool00"``: the tool message's call id and name are those of call 00 of ``t0003.model``,
    checked by the workflow before it sends the bare form); the dict forms stay readable forever.

    The workflow sends this (and :class:`ToolCallInput`) without the fields that hold their
    defaults (:func:`slim_input`); the activity gets them back as defaults.
    """

    agent: str
    run_id: str
    step_id: str
    turn: int
    idempotency_key: str
    """hash(run id, step id, request fingerprint): names the request without its body."""
    new_messages: list[dict[str, Any] | str]
    n_messages: int
    tenant: str = "default"
    send: int = 1
    """Which send of the step this is: 2 and more are re-sends after a send of unknown fate
    (journaled ``intent.N``, as the local loop does)."""
    retries: int = 0
    """Failed sends of the step the loop tried again (transient failures): the result's counter."""
    lost: int = 0
    """Activities of this step lost with their worker before this one (heartbeat timeout, worker
    shut down): each may have written its intent and reached the provider. The activity journals
    this send as a re-send (``intent.N``, possibly billed twice) only when an earlier intent of
    the step is in the journal, i.e. when an earlier send may have reached the provider."""


@dataclass
class ToolCallInput:
    """One run (or lookup) of a tool: plain arguments and the step's context fields."""

    agent: str
    run_id: str
    step_id: str
    tool: str
    arguments: dict[str, Any]
    effect_key: str
    attempt: int = 1
    tenant: str = "default"
    data: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None


@dataclass
class ReplayInput:
    """What a run continued-as-new asks once: the results its earlier runs already journaled."""

    agent: str
    run_id: str


@dataclass
class RecordInput:
    """Events only the workflow knows (a person's decision, the final answer, a cancellation or
    failure record), copied into the activities' journal: small decision data."""

    agent: str
    run_id: str
    events: list[EventRow]


def slim_input(inp: Any) -> dict[str, Any]:
    """An activity input as a dict without the fields that equal their defaults (the tenant
    ``default``, attempt 1, empty data, no call id): the activity's dataclass fills them back in.
    Dozens of bytes per activity, in every activity of the history."""
    out = {}
    for f in dataclasses.fields(inp):
        value = getattr(inp, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        if f.default_factory is not dataclasses.MISSING and value == f.default_factory():
            continue
        out[f.name] = value
    return out
