"""The activities' journal on PostgreSQL: workers that share no host.

The worker says at start which store it journals to (and refuses one only its own process could
read); a run continued-as-new reads its earlier steps from the Postgres journal up to its mark;
a worker process SIGKILLed inside the non-idempotent tool's activity and after a model response
was journaled: one ledger receipt, every model call billed once (the ledger's and the provider's
own records, not the journal's).
"""

from __future__ import annotations

import logging
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from long_app import long_agent, script
from temporal_app import POLICY
from temporalio.testing import WorkflowEnvironment
from test_temporal_kill import start_worker

from cuaderno.errors import UsageError
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker, cuaderno_activities
from cuaderno.testing.ledger import LedgerProcess
from cuaderno.testing.records import read_records

pytestmark = pytest.mark.postgres


async def test_a_long_run_on_the_postgres_journal_continues_as_new_and_completes(
        env: WorkflowEnvironment, pg_schemas: list[str],  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    schema = new_schema()
    pg_schemas.append(schema)
    journal = schema_url(schema)
    turns, queue, run_id = 30, f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    gateway = ScriptedGateway(script(turns))
    agent = long_agent(turns)
    with caplog.at_level(logging.INFO, logger="cuaderno.temporal"):
        worker = build_worker(env.client, agent, task_queue=queue, journal_url=journal,
                              gateway_factory=lambda: gateway)
    assert f"journal PostgreSQL {journal}" in caplog.text  # the store it uses, said at start
    async with worker:
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent=agent.name, task="read",
                                                                                max_history_events=100),
                                                 id=run_id, task_queue=queue)
        result = await handle.result()
        description = await handle.describe()
    assert result == {"status": "completed", "output": f"read {turns} documents"}
    assert description.run_id != handle.first_execution_run_id  # it continued as new, read Postgres at its mark
    assert gateway.billed == turns + 1
    cp = open_journal(journal).checkpoint(run_id)
    assert cp is not None and cp.status == "completed" and cp.count("model_calls") == turns + 1


def test_a_journal_only_one_process_reads_is_refused_at_worker_start(tmp_path: Path) -> None:
    for url in ("memory://", "sqlite:///:memory:"):
        with pytest.raises(UsageError, match="one process's memory"):
            cuaderno_activities(long_agent(1), lambda: ScriptedGateway([]), url)


@pytest.mark.parametrize(("point", "dedup"), [("temporal.tool.A1", False), ("temporal.model.A2", False)])
async def test_a_worker_on_postgres_killed_inside_an_activity_pays_nothing_twice(
        env: WorkflowEnvironment, tmp_path: Path, pg_schemas: list[str],  # noqa: F811
        point: str, dedup: bool) -> None:
    schema = new_schema()
    pg_schemas.append(schema)
    journal = schema_url(schema)
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    billing = tmp_path / "billing.jsonl"
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    with LedgerProcess(mode="nodedup") as ledger:
        first = start_worker(env, queue, journal, ledger.url, billing, policy, point, dedup)
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="payer", task="pay bob"),
                                                 id=run_id, task_queue=queue)
        assert first.wait(timeout=60) == -signal.SIGKILL
        assert first.stdout is not None
        first.stdout.close()
        second = start_worker(env, queue, journal, ledger.url, billing, policy, None, dedup)
        try:
            result = await handle.result()
        finally:
            second.kill()
            second.wait()
            assert second.stdout is not None
            second.stdout.close()
        receipts = ledger.receipts()
    assert result == {"status": "completed", "output": "done: bob has his 5"}
    assert len(receipts) == 1
    billed = Counter(r["key"] for r in read_records(billing))
    assert len(billed) == 3 and set(billed.values()) == {1}
    cp = open_journal(journal).checkpoint(run_id)
    assert cp is not None and cp.status == "completed" and cp.count("model_calls") == 3
