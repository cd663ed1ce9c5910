"""The unchanged runner inside a workflow: it completes, each model turn and tool call is an
activity, the journal the activities wrote is cuaderno's, and the history holds no conversation."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporal_app import POLICY, SCRIPT, make_agent
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.journal import open_journal
from cuaderno.temporal import (
    MODEL_TURN,
    RECORD,
    TOOL_CALL,
    CuadernoWorkflow,
    EffectPolicyError,
    RunInput,
    build_worker,
    load_effect_policy,
)
from cuaderno.testing.ledger import LedgerProcess


async def run_once(env: WorkflowEnvironment, tmp_path: Path, ledger: LedgerProcess, gateway: ScriptedGateway,
                   policy_text: str = POLICY) -> tuple[dict[str, object], WorkflowHistory, str]:
    policy = tmp_path / "effects.toml"
    policy.write_text(policy_text)
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    async with build_worker(env.client, make_agent(ledger.url), task_queue=queue, journal_url=journal,
                            effect_policy=policy, gateway_factory=lambda: gateway):
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="payer", task="pay bob"),
                                                 id=run_id, task_queue=queue)
        result = await handle.result()
        history = await handle.fetch_history()
    return result, history, journal


async def test_a_workflow_runs_the_loop_to_its_answer(env: WorkflowEnvironment, tmp_path: Path) -> None:
    gateway = ScriptedGateway(SCRIPT, stripe=True)
    with LedgerProcess(mode="nodedup") as ledger:
        result, history, journal = await run_once(env, tmp_path, ledger, gateway)
        assert result == {"status": "completed", "output": "done: bob has his 5"}
        assert len(ledger.receipts()) == 1
    assert gateway.billed == 3
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert scheduled == [MODEL_TURN, TOOL_CALL, MODEL_TURN, TOOL_CALL, MODEL_TURN, RECORD]
    # The 5 KB document is in cuaderno's journal, not in the history.
    assert "x" * 5000 not in history.to_json()
    store = open_journal(journal)
    cp = store.checkpoint(history.workflow_id)
    assert cp is not None and cp.count("model_calls") == 3 and cp.count("tool_calls") == 2
    assert cp.status == "completed" and (cp.outcome or {}).get("output") == "done: bob has his 5"
    # The third request still saw the document: the model activity re-derived it from the journal.
    assert any("x" * 5000 in str(m.get("content")) for m in gateway.requests[2].messages)


def test_a_policy_without_a_production_timeout_is_refused_at_worker_start(tmp_path: Path) -> None:
    bad = tmp_path / "effects.toml"
    agent = make_agent("http://127.0.0.1:1")
    for text, what in [("", "not idempotent"), ('[tools.transfer]\neffect = "production"\n', "timeout_s"),
                       ('[tools.transfer]\neffect = "fast"\ntimeout_s = 3\n', "not an effect class"),
                       ('[tools.nope]\neffect = "code"\n', "does not have"),
                       ('[tools.transfer]\neffect = "code"\n', "cannot take the 'code' profile")]:
        bad.write_text(text)
        with pytest.raises(EffectPolicyError, match=what):
            load_effect_policy(agent, bad)


async def test_each_activity_is_scheduled_with_its_effect_class_profile(env: WorkflowEnvironment,
                                                                         tmp_path: Path) -> None:
    # What the server was told, read from the history: the production timeout is the one written in
    # the policy file (47 s here, not a default), model turns 210 s with 1 attempt, code 25 s with 3.
    policy = POLICY.replace("timeout_s = 30", "timeout_s = 47").replace("heartbeat_s = 1", "heartbeat_s = 2")
    with LedgerProcess(mode="nodedup") as ledger:
        result, history, _ = await run_once(env, tmp_path, ledger, ScriptedGateway(SCRIPT, stripe=True), policy)
    assert result["status"] == "completed"
    scheduled = [e.activity_task_scheduled_event_attributes for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    got = [(a.activity_type.name, a.start_to_close_timeout.seconds, a.retry_policy.maximum_attempts,
            a.heartbeat_timeout.seconds) for a in scheduled]
    assert got[:5] == [(MODEL_TURN, 210, 1, 2), (TOOL_CALL, 47, 1, 2), (MODEL_TURN, 210, 1, 2),
                       (TOOL_CALL, 25, 3, 2), (MODEL_TURN, 210, 1, 2)], got
    assert got[5][0] == RECORD and got[5][1:3] == (25, 3), got
