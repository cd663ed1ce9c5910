"""A worker process SIGKILLed inside a model activity and inside a non-idempotent tool activity.

The proof comes from records cuaderno does not write: the ledger's receipts (another process)
and the fake provider's billing log (one line per billed generation, fsynced before the answer).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from temporal_app import POLICY
from temporalio.testing import WorkflowEnvironment

from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow, RunInput
from cuaderno.testing.ledger import LedgerProcess
from cuaderno.testing.records import read_records

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def start_worker(env: WorkflowEnvironment, queue: str, journal: str, ledger: str, billing: Path, policy: Path,
                 crash_at: str | None, dedup: bool, extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    environ.update(extra or {})
    environ["PROVIDER_DEDUP"] = "1" if dedup else "0"
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), environ.get("PYTHONPATH")) if p)
    if crash_at:
        environ["CUADERNO_CRASH_AT"] = crash_at
    target = env.client.service_client.config.target_host
    proc = subprocess.Popen([sys.executable, str(HERE / "worker_main.py"), target, queue, journal, ledger,
                             str(billing), str(policy)], env=environ, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "READY"  # synchronised on the worker's own line
    return proc


@pytest.mark.parametrize(("point", "dedup"), [
    # Billed, not journaled: only the provider can tell, by the same idempotency key (which it honours).
    ("temporal.model.A1", True),
    # Journaled: the re-send finds the response in cuaderno's journal; a provider that bills every
    # request (its key ignored) is not asked again.
    ("temporal.model.A2", False),
    ("temporal.tool.A1", False),
    ("temporal.tool.A2", False),
])
async def test_a_worker_killed_inside_an_activity_pays_nothing_twice(env: WorkflowEnvironment, tmp_path: Path,
                                                                     point: str, dedup: bool) -> None:
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    billing = tmp_path / "billing.jsonl"
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    with LedgerProcess(mode="nodedup") as ledger:  # nodedup: a second send would be a second transfer
        first = start_worker(env, queue, journal, ledger.url, billing, policy, point, dedup)
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="payer", task="pay bob"),
                                                 id=run_id, task_queue=queue)
        assert first.wait(timeout=60) == -signal.SIGKILL  # it died at the point, inside the activity
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
    assert len(receipts) == 1  # one transfer, from the ledger's own record
    billed = Counter(r["key"] for r in read_records(billing))
    assert len(billed) == 3 and set(billed.values()) == {1}  # every model call billed once
    cp = open_journal(journal).checkpoint(run_id)
    assert cp is not None and cp.count("model_calls") == 3
