"""A lookup of a step the journal does not hold changes nothing (``RunLog.recorded``).

``ToolSteps._decide`` looks an approval request and a tool decision up only where the journal
holds one (it runs on every tool step, and most calls were never asked about). Skipping the
lookup is the same as making it only because a lookup that finds nothing leaves the run's state
as it was: no step visited, no divergence raised, nothing staged. A lookup that finds its event
visits it (which is why the skipped lookups are still made where an event is recorded)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, tool
from cuaderno.events import StepEvent, approval_step_id, tool_step_id
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import ToolCall
from cuaderno.loop._log import RunLog
from cuaderno.loop._state import RunState, new_state
from cuaderno.loop._tool_steps import ToolSteps


@tool(idempotent=False)
def bump(n: int) -> int:
    """Add one."""
    return n + 1


AGENT = Agent(name="a", instructions="bump", model="m", tools=[bump])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteCheckpointer]:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


def _opened(store: SqliteCheckpointer, run_id: str) -> tuple[RunState, RunLog, ToolSteps]:
    session = Session(run_id, ScriptedGateway([ScriptedGateway.text("unused")]), store)
    state = new_state(AGENT, "bump", session)
    if store.checkpoint(run_id) is None:
        store.append([StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", name=AGENT.name,
                                fingerprint=fingerprint({"task": "bump"}),
                                payload={"task": "bump", "versions": AGENT.versions(), "tenant": session.tenant})])
    state.epoch = session.ownership.acquire(store, run_id, session.owner, force=False, open_only=True)
    for ev in store.load(run_id):
        state.journal[(ev.step_id, ev.phase)] = ev
    log = RunLog(state)
    return state, log, ToolSteps(state, log)


def _what_a_lookup_may_change(state: RunState) -> tuple[object, ...]:
    return (dict(state.unvisited), dict(state.journal), list(state.pending), list(state.points), list(state.ready))


async def test_a_missing_step_lookup_changes_nothing_and_a_found_one_visits_it(store: SqliteCheckpointer) -> None:
    _, log, steps = _opened(store, "r")
    call = ToolCall(id="c1", name="bump", arguments={"n": 1})
    assert await steps.call(0, 0, call) is False
    log.commit()

    state, log, _ = _opened(store, "r")  # a second pass over the journal
    step_id = tool_step_id(0, 0)
    intent = state.journal[(step_id, "intent")]
    args_fp = intent.fingerprint
    state.unvisited[step_id] = intent.seq or 0  # as the runner marks a recorded step it has not replayed
    before = copy.deepcopy(_what_a_lookup_may_change(state))

    # The two lookups ToolSteps._decide skips when the journal holds neither event.
    assert (approval_step_id(step_id), "request") not in state.journal
    assert (step_id, "decision") not in state.journal
    assert log.recorded(approval_step_id(step_id), "request", "approval", call.name, args_fp) is None
    assert log.recorded(step_id, "decision", "tool", call.name, args_fp) is None
    # Even one under another kind or fingerprint: nothing is compared when nothing is found.
    assert log.recorded(step_id, "decision", "model", "other", "0" * 64) is None
    assert _what_a_lookup_may_change(state) == before

    # A lookup that finds its event visits the step: the effect a skipped lookup would have had
    # were the event there, which is why _decide still looks up every event the journal holds.
    assert log.recorded(step_id, "intent", "tool", call.name, args_fp) is not None
    assert step_id not in state.unvisited
