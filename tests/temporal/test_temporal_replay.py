"""Recorded histories replay on every run; removing an activity call breaks replay.

``histories/payer.json`` was recorded from :mod:`temporal_app`'s run (regenerate with
``CUADERNO_RECORD_HISTORY=1``, only when a change is meant to break old histories — it never is:
activity names and inputs are forever).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from long_app import long_agent, script
from temporal_app import POLICY, SCRIPT, make_agent
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError
from test_temporal_giveup import agent as giving_up_agent
from test_temporal_giveup import flaky

from cuaderno.errors import ErrorClass
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker, register
from cuaderno.temporal._seams import ActivityTools
from cuaderno.testing.ledger import LedgerProcess

HISTORIES = Path(__file__).parent / "histories"
HISTORY = HISTORIES / "payer.json"
"""Recorded before the cuaderno.record activity existed: still replays (workflow.patched)."""
LATEST = HISTORIES / "payer_record.json"
CONTINUED_TURNS = 6


def registered(tmp_path: Path) -> None:
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    register(make_agent("http://127.0.0.1:1"), policy)
    register(giving_up_agent())  # looker_gave_up.json
    register(long_agent(CONTINUED_TURNS))  # reader_continued.json


def recorded(path: Path = HISTORY) -> WorkflowHistory:
    return WorkflowHistory.from_json("run-recorded", path.read_text())


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.name)
async def test_every_recorded_history_replays(tmp_path: Path, path: Path) -> None:
    registered(tmp_path)
    result = await Replayer(workflows=[CuadernoWorkflow]).replay_workflow(recorded(path),
                                                                          raise_on_replay_failure=False)
    assert result.replay_failure is None


async def test_removing_an_activity_call_breaks_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registered(tmp_path)
    original = ActivityTools.invoke

    async def read_in_the_workflow(self: ActivityTools, name: str, arguments: dict[str, Any], ctx: Any) -> Any:
        if name == "read_doc":  # the tool's activity removed: its body run in the workflow instead
            return await self.tools[name].invoke(self.tools[name].validate(arguments), ctx)
        return await original(self, name, arguments, ctx)

    monkeypatch.setattr(ActivityTools, "invoke", read_in_the_workflow)
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=[CuadernoWorkflow]).replay_workflow(recorded())


@pytest.mark.skipif(os.environ.get("CUADERNO_RECORD_HISTORY") != "1", reason="records the history on demand")
async def test_record_history(env: WorkflowEnvironment, tmp_path: Path) -> None:
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    with LedgerProcess(mode="nodedup") as ledger:
        async with build_worker(env.client, make_agent(ledger.url), task_queue=queue,
                                journal_url=f"sqlite:///{tmp_path / 'j.db'}", effect_policy=policy,
                                gateway_factory=lambda: ScriptedGateway(SCRIPT)):
            handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="payer", task="pay bob"),
                                                     id="run-recorded", task_queue=queue)
            await handle.result()
            LATEST.write_text((await handle.fetch_history()).to_json())


@pytest.mark.skipif(os.environ.get("CUADERNO_RECORD_HISTORY") != "1", reason="records the histories on demand")
async def test_record_the_give_up_and_continue_as_new_histories(env: WorkflowEnvironment, tmp_path: Path) -> None:
    """A run whose model calls keep failing (it records the loop's give-up: cuaderno.record behind
    its patch) and the first run of one that continues as new (cuaderno.journal_mark behind its
    patch); neither replay reads the journal."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with build_worker(env.client, giving_up_agent(), task_queue=queue, journal_url=f"sqlite:///{tmp_path / 'g.db'}",
                            gateway_factory=lambda: flaky({0: ErrorClass.TRANSIENT})):
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="looker", task="find x"),
                                                 id="run-recorded", task_queue=queue)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        (HISTORIES / "looker_gave_up.json").write_text((await handle.fetch_history()).to_json())
    queue = f"q-{uuid.uuid4().hex[:8]}"
    agent = long_agent(CONTINUED_TURNS)
    async with build_worker(env.client, agent, task_queue=queue, journal_url=f"sqlite:///{tmp_path / 'c.db'}",
                            gateway_factory=lambda: ScriptedGateway(script(CONTINUED_TURNS))):
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent=agent.name, task="read",
                                                                                max_history_events=30),
                                                 id="run-recorded-2", task_queue=queue)
        await handle.result()
        first = env.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
        (HISTORIES / "reader_continued.json").write_text((await first.fetch_history()).to_json())
