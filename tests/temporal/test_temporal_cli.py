"""``cuaderno approve|deny|cancel RUN --temporal ADDR[/NAMESPACE]`` reach a run under Temporal.

Run as the console script runs (a real process): the client's exit is part of what is tested
(temporalio/sdk-python#300 crashed 12 of 40 short client processes at interpreter exit here).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from temporal_app import waiting_run
from temporalio.testing import WorkflowEnvironment

from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow
from cuaderno.testing.ledger import LedgerProcess

SRC = Path(__file__).resolve().parents[2] / "src"


async def cuaderno(*args: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)}
    # In a thread: the dev server and this test's worker share the event loop the command waits on.
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "cuaderno.cli", *args], env=environ,
                                   capture_output=True, text=True, timeout=60)


def target(env: WorkflowEnvironment) -> str:
    return f"{env.client.service_client.config.target_host}/{env.client.namespace}"


async def test_approve_binds_the_call_it_prints_and_the_workflow_goes_on(env: WorkflowEnvironment,
                                                                         tmp_path: Path) -> None:
    with LedgerProcess(mode="nodedup") as ledger:
        async with waiting_run(env, tmp_path, ledger) as (handle, step_id, fp):
            done = await cuaderno("approve", handle.id, step_id.removesuffix(".approval"), "--temporal", target(env),
                                  "--by", "ana", "--reason", "checked")
            assert done.returncode == 0, done.stderr
            assert fp in done.stdout and "approved by ana" in done.stdout and done.stderr == ""
            assert await handle.result() == {"status": "completed", "output": "done: bob has his 5"}
        assert len(ledger.receipts()) == 1
    decided = [e for e in open_journal(f"sqlite:///{tmp_path / 'j.db'}").load(handle.id)
               if e.kind == "approval" and e.phase == "decision"]
    assert [(e.decision, e.payload.get("approver"), e.payload.get("reason")) for e in decided] == [
        ("approved", "ana", "checked")]


async def test_a_stale_fingerprint_is_refused_by_the_workflow_and_it_still_waits(env: WorkflowEnvironment,
                                                                                tmp_path: Path) -> None:
    with LedgerProcess(mode="nodedup") as ledger:
        async with waiting_run(env, tmp_path, ledger) as (handle, step_id, fp):
            stale = await cuaderno("deny", handle.id, step_id, "--temporal", target(env), "--fingerprint", "0" * 64)
            assert stale.returncode == 4 and "ApprovalMismatch" in stale.stderr
            assert len(stale.stderr.splitlines()) == 1 and stale.stderr.startswith("error: ")
            assert (await handle.query(CuadernoWorkflow.pending))[step_id]["fingerprint"] == fp  # nothing recorded
            # Pasted with a newline and in capitals: the same fingerprint, as the local deny reads it.
            denied = await cuaderno("deny", handle.id, step_id, "--temporal", target(env), "--fingerprint",
                                    f" {fp.upper()}\n")
            assert denied.returncode == 0, denied.stderr
            assert (await handle.result())["status"] == "completed"
        assert ledger.receipts() == []  # denied: the transfer never ran


async def test_cancel_closes_a_waiting_run_with_the_local_record(env: WorkflowEnvironment, tmp_path: Path) -> None:
    with LedgerProcess(mode="nodedup") as ledger:
        async with waiting_run(env, tmp_path, ledger) as (handle, _, _):
            done = await cuaderno("cancel", handle.id, "--temporal", target(env), "--reason", "not today",
                                  "--by", "ana")
            assert done.returncode == 0, done.stderr
            result = await handle.result()
            again = await cuaderno("cancel", handle.id, "--temporal", target(env))
        assert ledger.receipts() == []
    assert result["status"] == "cancelled"
    assert (result["record"]["reason"], result["record"]["by"]) == ("not today", "ana")
    assert again.returncode == 4 and "already ended" in again.stderr
    cp = open_journal(f"sqlite:///{tmp_path / 'j.db'}").checkpoint(handle.id)
    assert cp is not None and cp.status == "cancelled"  # the activities' journal has the record too


async def test_refusals_are_one_line_with_their_exit_status(env: WorkflowEnvironment) -> None:
    missing = await cuaderno("approve", "no-such-run", "t0000.tool00", "--temporal", target(env))
    assert missing.returncode == 3 and "no workflow 'no-such-run'" in missing.stderr
    bad = await cuaderno("cancel", "r", "--temporal", "localhost")
    assert bad.returncode == 2 and "host:port" in bad.stderr
    down = await cuaderno("cancel", "r", "--temporal", "127.0.0.1:1")
    assert down.returncode == 4 and "cannot reach the Temporal server" in down.stderr
    for result in (missing, bad, down):
        assert len(result.stderr.splitlines()) == 1 and result.stdout == ""
