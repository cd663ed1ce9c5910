"""The loop's collaborators work on a run's state without a ``Runner`` (issue 33, part 3): a
:class:`~cuaderno.loop._tool_steps.ToolSteps` over a state made by ``new_state`` and its
``RunLog`` writes a tool step through the effect protocol, and a second one over the journal
replays it without running the body again (the tool's own count of calls says so)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, tool
from cuaderno.events import StepEvent, approval_step_id, tool_step_id
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import ToolCall
from cuaderno.loop._log import RunLog
from cuaderno.loop._state import new_state
from cuaderno.loop._tool_steps import ToolSteps
from cuaderno.loop.steps import ToolStep


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteCheckpointer]:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


def _agent(ran: list[int]) -> Agent:
    @tool(idempotent=False)
    def add(n: int) -> int:
        """Add one (counts its calls: the receipt the journal is checked against)."""
        ran.append(n)
        return n + 1

    return Agent(name="a", instructions="add", model="m", tools=[add])


def _opened(agent: Agent, store: SqliteCheckpointer, run_id: str) -> tuple[ToolSteps, RunLog]:
    session = Session(run_id, ScriptedGateway([ScriptedGateway.text("unused")]), store)
    state = new_state(agent, "add one", session)
    if store.checkpoint(run_id) is None:
        store.append([StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", name=agent.name,
                                fingerprint=fingerprint({"task": "add one"}),
                                payload={"task": "add one", "versions": agent.versions(), "tenant": session.tenant})])
    state.epoch = session.ownership.acquire(store, run_id, session.owner, force=False, open_only=True)
    for ev in store.load(run_id):
        state.journal[(ev.step_id, ev.phase)] = ev
    log = RunLog(state)
    return ToolSteps(state, log), log


async def test_tool_steps_run_and_replay_a_step_without_a_runner(store: SqliteCheckpointer) -> None:
    ran: list[int] = []
    agent = _agent(ran)
    steps, log = _opened(agent, store, "r")
    call = ToolCall(id="c1", name="add", arguments={"n": 41})
    assert await steps.call(0, 0, call) is False
    log.commit()  # the result waits for the next intent's commit in the loop: committed here
    assert ran == [41]
    phases = [(e.step_id, e.phase) for e in store.load("r") if e.kind == "tool"]
    assert phases == [(tool_step_id(0, 0), "intent"), (tool_step_id(0, 0), "result")]
    shown = log.drain()
    assert len(shown) == 1 and isinstance(shown[0], ToolStep) and shown[0].outcome == "ok" and shown[0].result == 42
    assert steps.state.messages[-1]["content"] == "42"

    log.state.s.ownership.release(store, "r", log.state.epoch)  # this "process" lets the run go
    again, log2 = _opened(agent, store, "r")
    assert await again.call(0, 0, call) is False
    assert ran == [41]  # replayed from the journal: the body did not run again
    assert again.state.messages[-1]["content"] == "42"
    assert log2.state.pending == []  # nothing new to write


async def test_a_missing_step_lookup_changes_nothing_and_a_found_one_visits_it(store: SqliteCheckpointer) -> None:
    """``ToolSteps._decide`` looks an approval request and a tool decision up only where the
    journal holds one (it runs on every tool step). Skipping the lookup is the same as making it
    only because a lookup that finds nothing leaves the run's state as it was: no step visited, no
    divergence raised, nothing staged. One that finds its event visits the step, which is why the
    lookups are still made wherever an event is recorded."""
    agent = _agent([])
    steps, log = _opened(agent, store, "r")
    call = ToolCall(id="c1", name="add", arguments={"n": 1})
    assert await steps.call(0, 0, call) is False
    log.commit()

    _, log = _opened(agent, store, "r")  # a second pass over the journal
    state = log.state
    step_id = tool_step_id(0, 0)
    intent = state.journal[(step_id, "intent")]
    state.unvisited[step_id] = intent.seq or 0  # as the runner marks a recorded step not replayed yet

    def what_a_lookup_may_change() -> tuple[object, ...]:
        return (dict(state.unvisited), dict(state.journal), list(state.pending), list(state.points), list(state.ready))

    before = what_a_lookup_may_change()
    assert (approval_step_id(step_id), "request") not in state.journal
    assert (step_id, "decision") not in state.journal
    assert log.recorded(approval_step_id(step_id), "request", "approval", call.name, intent.fingerprint) is None
    assert log.recorded(step_id, "decision", "tool", call.name, intent.fingerprint) is None
    # Even under another kind or fingerprint: nothing is compared when nothing is found.
    assert log.recorded(step_id, "decision", "model", "other", "0" * 64) is None
    assert what_a_lookup_may_change() == before

    assert log.recorded(step_id, "intent", "tool", call.name, intent.fingerprint) is intent
    assert step_id not in state.unvisited
