"""Empty generations and tiers inside the model activity, with the local loop's own code: a cheap
tier that answers empty 200s is escalated to the strong tier in the same turn (counted), and an
empty answer on a single tier is journaled as rejected, counted, and the turn asked again."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from temporal_app import POLICY, SCRIPT, make_agent
from temporalio.testing import WorkflowEnvironment

from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.gateway.tiered import TieredGateway
from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker
from cuaderno.testing.ledger import LedgerProcess


async def run(env: WorkflowEnvironment, tmp_path: Path, ledger: LedgerProcess, gateway: Any) -> tuple[Any, Any]:
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    journal = f"sqlite:///{tmp_path / 'j.db'}"
    async with build_worker(env.client, make_agent(ledger.url, name="emptiness"), task_queue=queue,
                            journal_url=journal, effect_policy=policy, gateway_factory=lambda: gateway):
        result = await env.client.execute_workflow(CuadernoWorkflow.run, RunInput(agent="emptiness", task="pay bob"),
                                                   id=run_id, task_queue=queue)
    return result, open_journal(journal).checkpoint(run_id)


async def test_an_empty_cheap_tier_is_escalated_inside_the_activity(env: WorkflowEnvironment,
                                                                    tmp_path: Path) -> None:
    cheap = ScriptedGateway([ScriptedGateway.empty()])  # every cheap answer is an empty 200
    strong = ScriptedGateway(SCRIPT)
    with LedgerProcess(mode="nodedup") as ledger:
        result, cp = await run(env, tmp_path, ledger, TieredGateway(cheap, strong))
        assert len(ledger.receipts()) == 1
    assert result["status"] == "completed"
    assert cheap.calls == 3 and strong.billed == 3
    assert cp.count("escalations") == 3  # counted in the journal the activities wrote


async def test_an_empty_answer_is_rejected_counted_and_asked_again(env: WorkflowEnvironment,
                                                                   tmp_path: Path) -> None:
    sent = []

    def first_empty(request: ModelRequest) -> ModelResponse:
        sent.append(request)
        if len(sent) == 1:
            return ScriptedGateway.empty()
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        return SCRIPT[turn]

    with LedgerProcess(mode="nodedup") as ledger:
        result, cp = await run(env, tmp_path, ledger, ScriptedGateway(first_empty))
    assert result["status"] == "completed"
    assert len(sent) == 4 and sent[0].messages == sent[1].messages  # the same request, asked again
    assert cp.count("rejected_responses") == 1 and cp.count("unpriced_calls") == 1
