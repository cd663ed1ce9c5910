"""A person decides while the workflow waits durably: an update (its validator refuses a stale
fingerprint or a step that is not waiting, with typed errors) or a signal; cancellation by signal."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporal_app import waiting_run
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from cuaderno import Agent, tool
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow, Decision, RunInput, build_worker
from cuaderno.testing.ledger import LedgerProcess


def refused_as(exc: WorkflowUpdateFailedError) -> str | None:
    cause = exc.cause
    return cause.type if isinstance(cause, ApplicationError) else None


async def test_an_update_approves_and_its_validator_refuses_stale_or_unknown_steps(
        env: WorkflowEnvironment, tmp_path: Path) -> None:
    with LedgerProcess(mode="nodedup") as ledger:
        async with waiting_run(env, tmp_path, ledger) as (handle, step_id, fp):
            assert ledger.receipts() == []  # nothing ran while it waited
            with pytest.raises(WorkflowUpdateFailedError) as stale:
                await handle.execute_update(CuadernoWorkflow.decide, Decision(step_id, True, fingerprint="0" * 64))
            assert refused_as(stale.value) == "ApprovalMismatch"
            # A prefix of the right fingerprint is refused, and the message does not cut both
            # values to one length (they printed as the same 12 characters).
            with pytest.raises(WorkflowUpdateFailedError) as prefix:
                await handle.execute_update(CuadernoWorkflow.decide, Decision(step_id, True, fingerprint=fp[:12]))
            assert refused_as(prefix.value) == "ApprovalMismatch"
            said = str(prefix.value.cause)
            assert "prefix" in said and "64-character" in said and "got 12 characters" in said, said
            with pytest.raises(WorkflowUpdateFailedError) as unknown:
                await handle.execute_update(CuadernoWorkflow.decide, Decision("t0009.tool00.approval", True))
            assert refused_as(unknown.value) == "NotWaitingForApproval"
            assert await handle.execute_update(CuadernoWorkflow.decide,
                                               Decision(step_id, True, fingerprint=fp, approver="ana")) == step_id
            assert await handle.result() == {"status": "completed", "output": "done: bob has his 5"}
        assert len(ledger.receipts()) == 1
    # The decision is in the activities' journal as cuaderno's approve writes it locally.
    decided = [e for e in open_journal(f"sqlite:///{tmp_path / 'j.db'}").load(handle.id)
               if e.kind == "approval" and e.phase == "decision"]
    assert [(e.step_id, e.decision, e.payload.get("approver")) for e in decided] == [(step_id, "approved", "ana")]


async def test_a_signal_denies(env: WorkflowEnvironment, tmp_path: Path) -> None:
    with LedgerProcess(mode="nodedup") as ledger:
        async with waiting_run(env, tmp_path, ledger) as (handle, step_id, fp):
            await handle.signal(CuadernoWorkflow.decide_signal, Decision(step_id, False, fingerprint=fp))
            assert (await handle.result())["status"] == "completed"
        assert ledger.receipts() == []  # denied: the model was told, the transfer never ran


async def test_a_cancel_signal_closes_a_waiting_run_with_the_local_record(env: WorkflowEnvironment,
                                                                          tmp_path: Path) -> None:
    with LedgerProcess(mode="nodedup") as ledger:
        async with waiting_run(env, tmp_path, ledger) as (handle, _, _):
            await handle.signal(CuadernoWorkflow.cancel, "changed my mind")
            result = await handle.result()
        assert ledger.receipts() == []
    assert result["status"] == "cancelled" and result["record"]["reason"] == "changed my mind"


async def test_a_cancel_signal_during_a_tool_call_stops_at_the_next_step(env: WorkflowEnvironment,
                                                                         tmp_path: Path) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool(idempotent=True)
    async def slow(name: str) -> dict[str, Any]:
        """Wait until the test lets it finish."""
        started.set()
        await release.wait()
        return {"name": name}

    agent = Agent(instructions="i", tools=[slow], name="slowpoke")
    script = [ScriptedGateway.call("slow", name="a"), ScriptedGateway.text("never reached")]
    gateway = ScriptedGateway(script)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with build_worker(env.client, agent, task_queue=queue, journal_url=f"sqlite:///{tmp_path / 'j.db'}",
                            gateway_factory=lambda: gateway):
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="slowpoke", task="t"),
                                                 id=f"run-{uuid.uuid4().hex[:8]}", task_queue=queue)
        await started.wait()  # the tool's body is running in its activity
        # The signal is in the history once this returns, before the tool's completion can be.
        await handle.signal(CuadernoWorkflow.cancel, "stop")
        release.set()
        result = await handle.result()
    assert result["status"] == "cancelled"
    assert [c["step_id"] for c in result["record"]["completed"]] == ["t0000.tool00"]
    assert gateway.billed == 1  # no model turn after the cancellation


async def test_a_temporal_cancellation_gives_the_local_cancelled_record(env: WorkflowEnvironment,
                                                                        tmp_path: Path) -> None:
    started, release = asyncio.Event(), asyncio.Event()

    @tool
    async def send(text: str) -> dict[str, Any]:
        """Send a message (not idempotent, no lookup): cancelled mid-call, nobody knows if it went."""
        started.set()
        await release.wait()
        return {"sent": text}

    policy = tmp_path / "effects.toml"
    policy.write_text('[activities]\nheartbeat_s = 1\n[tools.send]\neffect = "production"\ntimeout_s = 30\n')
    agent = Agent(instructions="i", tools=[send], name="sender")
    gateway = ScriptedGateway([ScriptedGateway.call("send", text="hi"), ScriptedGateway.text("never reached")])
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with build_worker(env.client, agent, task_queue=queue, journal_url=f"sqlite:///{tmp_path / 'j.db'}",
                            effect_policy=policy, gateway_factory=lambda: gateway):
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="sender", task="t"),
                                                 id=f"run-{uuid.uuid4().hex[:8]}", task_queue=queue)
        await started.wait()
        await handle.cancel()
        result = await handle.result()
    assert result["status"] == "cancelled"
    assert result["record"]["reason"] == "the Temporal workflow was cancelled"
    assert [u["step_id"] for u in result["record"]["uncertain"]] == ["t0000.tool00"]
    assert gateway.billed == 1


async def test_a_decision_takes_the_tool_step_id_as_the_command_line_does(env: WorkflowEnvironment,
                                                                          tmp_path: Path) -> None:
    """``cuaderno approve RUN t0000.tool00`` names the tool step; the same id in a ``Decision``
    decides its approval (the update returns the approval's own id)."""
    with LedgerProcess(mode="nodedup") as ledger:
        async with waiting_run(env, tmp_path, ledger) as (handle, step_id, fp):
            short = step_id.removesuffix(".approval")
            assert short != step_id
            assert await handle.execute_update(CuadernoWorkflow.decide,
                                               Decision(short, True, fingerprint=fp, approver="ana")) == step_id
            assert await handle.result() == {"status": "completed", "output": "done: bob has his 5"}
        assert len(ledger.receipts()) == 1


async def test_a_signal_takes_the_tool_step_id(env: WorkflowEnvironment, tmp_path: Path) -> None:
    with LedgerProcess(mode="nodedup") as ledger:
        async with waiting_run(env, tmp_path, ledger) as (handle, step_id, fp):
            await handle.signal(CuadernoWorkflow.decide_signal, Decision(step_id.removesuffix(".approval"), False,
                                                                         fingerprint=fp))
            assert (await handle.result())["status"] == "completed"
        assert ledger.receipts() == []  # denied by the short form, not dropped (which would wait forever)
