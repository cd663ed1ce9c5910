"""Bad input under Temporal: typed errors, nothing journaled, the workflow not left half-changed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporal_app import POLICY, SCRIPT, make_agent
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from cuaderno import Agent
from cuaderno.errors import ErrorClass, GatewayError, JournalError
from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker, cuaderno_activities
from cuaderno.testing.ledger import LedgerProcess


def failure_type(exc: WorkflowFailureError) -> str | None:
    cause = exc.cause
    return cause.type if isinstance(cause, ApplicationError) else None


async def test_a_worker_whose_agent_differs_from_the_recorded_run_refuses_it(env: WorkflowEnvironment,
                                                                            tmp_path: Path) -> None:
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    journal = f"sqlite:///{tmp_path / 'j.db'}"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with LedgerProcess(mode="nodedup") as ledger:
        first = make_agent(ledger.url, name="drifter")
        queue = f"q-{uuid.uuid4().hex[:8]}"
        async with build_worker(env.client, first, task_queue=queue, journal_url=journal, effect_policy=policy,
                                gateway_factory=lambda: ScriptedGateway(SCRIPT)):
            await env.client.execute_workflow(CuadernoWorkflow.run, RunInput(agent="drifter", task="pay bob"),
                                              id=run_id, task_queue=queue)
        before = open_journal(journal).load(run_id)
        changed = make_agent(ledger.url, name="drifter")
        changed.instructions = "Pay bob twice."  # another agent under the same name: other versions
        queue = f"q-{uuid.uuid4().hex[:8]}"
        async with build_worker(env.client, changed, task_queue=queue, journal_url=journal, effect_policy=policy,
                                gateway_factory=lambda: ScriptedGateway(SCRIPT)):
            with pytest.raises(WorkflowFailureError) as refused:
                await env.client.execute_workflow(CuadernoWorkflow.run, RunInput(agent="drifter", task="pay bob"),
                                                  id=run_id, task_queue=queue)
        assert failure_type(refused.value) == "VersionMismatch"
        assert len(ledger.receipts()) == 1
    assert [e.row_hash for e in open_journal(journal).load(run_id)] == [e.row_hash for e in before]


async def test_a_workflow_for_an_agent_the_worker_does_not_run_fails_typed(env: WorkflowEnvironment,
                                                                           tmp_path: Path) -> None:
    queue = f"q-{uuid.uuid4().hex[:8]}"
    agent = Agent(instructions="i", name="known")
    async with build_worker(env.client, agent, task_queue=queue, journal_url=f"sqlite:///{tmp_path / 'j.db'}",
                            gateway_factory=lambda: ScriptedGateway([ScriptedGateway.text("hi")])):
        with pytest.raises(WorkflowFailureError) as refused:
            await env.client.execute_workflow(CuadernoWorkflow.run, RunInput(agent="unknown", task="t"),
                                              id=f"run-{uuid.uuid4().hex[:8]}", task_queue=queue)
    assert failure_type(refused.value) == "UsageError"


def test_a_journal_the_worker_cannot_open_is_refused_at_worker_start(tmp_path: Path) -> None:
    with pytest.raises(JournalError):
        cuaderno_activities(Agent(instructions="i"), lambda: ScriptedGateway([]),
                            f"sqlite:///{tmp_path / 'missing' / 'j.db'}")


async def test_a_model_call_the_loop_gives_up_on_fails_the_workflow_typed(env: WorkflowEnvironment,
                                                                          tmp_path: Path) -> None:
    def refused(request: ModelRequest) -> ModelResponse:
        raise GatewayError("400 bad request", error_class=ErrorClass.PERMANENT, sent=True, status=400)

    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with build_worker(env.client, Agent(instructions="i", name="refused"), task_queue=queue,
                            journal_url=f"sqlite:///{tmp_path / 'j.db'}",
                            gateway_factory=lambda: ScriptedGateway(refused)):
        with pytest.raises(WorkflowFailureError) as failed:
            await env.client.execute_workflow(CuadernoWorkflow.run, RunInput(agent="refused", task="t"),
                                              id=f"run-{uuid.uuid4().hex[:8]}", task_queue=queue)
    assert failure_type(failed.value) == "GatewayError"
