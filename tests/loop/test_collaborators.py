"""The loop's collaborators work on a run's state without a ``Runner`` (issue 33, part 3): a
:class:`~cuaderno.loop._tool_steps.ToolSteps` over a state made by ``new_state`` and its
``RunLog`` writes a tool step through the effect protocol, and a second one over the journal
replays it without running the body again (the tool's own count of calls says so)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, tool
from cuaderno.events import StepEvent, tool_step_id
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
