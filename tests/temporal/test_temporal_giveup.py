"""A model step's failures journaled under Temporal as the local loop journals them.

The same agent and the same scripted provider (failing on the same calls) run once by the local
loop on a SQLite journal and once under Temporal; the activities' journal must say what the
local one says: the failure the loop gave up with (``error.N``, its class and what the step
spent), re-sends (``intent.N``), retries, rejected empty answers, unpriced calls, and the
counters ``cuaderno show`` reads.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from cuaderno import Agent, tool
from cuaderno.errors import ErrorClass, GatewayError
from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.journal import open_journal
from cuaderno.loop.agent import Session
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker

COUNTERS = ("model_calls", "model_sends", "retries", "rejected_responses", "escalations", "unpriced_calls",
            "calls_paid", "possibly_billed_twice")


def agent() -> Agent:
    @tool(idempotent=True)
    def look(name: str) -> dict[str, Any]:
        """Look something up."""
        return {"name": name, "found": True}

    return Agent(instructions="Look it up.", tools=[look], name="looker", max_turns=4)


def flaky(failures: dict[int, ErrorClass | str]) -> ScriptedGateway:
    """A provider answering look(x) then a text, failing (or answering empty) on the calls named
    (1-based): the same calls fail for the local loop and under Temporal."""
    calls = [0]

    def answer(request: ModelRequest) -> ModelResponse:
        calls[0] += 1
        failure = failures.get(calls[0], failures.get(0))  # 0: every call
        if failure == "empty":
            return ScriptedGateway.empty()
        if isinstance(failure, ErrorClass):
            raise GatewayError(f"call {calls[0]} failed", error_class=failure,
                               sent=failure is ErrorClass.AMBIGUOUS)
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        return ScriptedGateway.call("look", name="x") if turn == 0 else ScriptedGateway.text("found x")

    return ScriptedGateway(answer)


def what_it_says(journal: str, run_id: str) -> dict[str, Any]:
    store = open_journal(journal)
    cp = store.checkpoint(run_id)
    assert cp is not None
    events = store.load(run_id)
    return {
        "counters": {name: cp.count(name) for name in COUNTERS},
        "errors": [(e.step_id, e.phase, e.payload["error"]["error_class"], e.payload.get("counters"))
                   for e in events if e.kind == "model" and e.phase.startswith("error")],
        "sends": [(e.step_id, e.phase, e.payload.get("after")) for e in events
                  if e.kind == "model" and e.phase.startswith("intent")],
        "status": cp.status,
    }


async def local(tmp_path: Path, failures: dict[int, ErrorClass | str]) -> tuple[str, dict[str, Any]]:
    async def no_wait(_: float) -> None:
        return None

    journal, run_id = f"sqlite:///{tmp_path / 'local.db'}", f"run-{uuid.uuid4().hex[:8]}"
    outcome = "completed"
    try:
        async for _ in agent().run("find x", session=Session(run_id, flaky(failures), open_journal(journal),
                                                             sleep=no_wait)):
            pass
    except GatewayError as exc:
        outcome = f"gave up: {type(exc).__name__}"
    return outcome, what_it_says(journal, run_id)


async def temporal(env: WorkflowEnvironment, tmp_path: Path,
                   failures: dict[int, ErrorClass | str]) -> tuple[str, dict[str, Any]]:
    journal, run_id = f"sqlite:///{tmp_path / 'temporal.db'}", f"run-{uuid.uuid4().hex[:8]}"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    gateway = flaky(failures)
    outcome = "completed"
    async with build_worker(env.client, agent(), task_queue=queue, journal_url=journal,
                            gateway_factory=lambda: gateway):
        try:
            await env.client.execute_workflow(CuadernoWorkflow.run, RunInput(agent="looker", task="find x"),
                                               id=run_id, task_queue=queue)
        except WorkflowFailureError as exc:
            assert isinstance(exc.cause, ApplicationError) and exc.cause.type == "GatewayError"
            outcome = f"gave up: {exc.cause.type}"
    return outcome, what_it_says(journal, run_id)


@pytest.mark.parametrize("failures", [
    pytest.param({1: ErrorClass.TRANSIENT, 2: ErrorClass.TRANSIENT}, id="retried-then-answered"),
    pytest.param({0: ErrorClass.TRANSIENT}, id="retries-exhausted"),
    pytest.param({2: ErrorClass.AMBIGUOUS}, id="resent-after-unknown-fate"),
    pytest.param({2: ErrorClass.AMBIGUOUS, 3: ErrorClass.AMBIGUOUS}, id="resends-exhausted"),
    pytest.param({1: ErrorClass.PERMANENT}, id="permanent-at-once"),
    pytest.param({1: "empty", 2: "empty"}, id="empty-answers-asked-again"),
])
async def test_the_activities_journal_says_what_the_local_journal_says(
        env: WorkflowEnvironment, tmp_path: Path, failures: dict[int, ErrorClass | str]) -> None:
    here = await local(tmp_path, failures)
    there = await temporal(env, tmp_path, failures)
    assert there == here
