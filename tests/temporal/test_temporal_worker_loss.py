"""R25 ``engine_worker_loss``: the worker lost 1, 2 and 3 times during one model call is a lost
send sent again under the run's policy, never a failed run; each key billed as the journal counts.

The truth comes from the fake provider's billing log (one fsynced line per billed generation,
written by the worker processes, not by cuaderno's journal) and from the ledger's receipts.
A worker is SIGKILLed at a named point of the model activity (``temporal.model.A1``: the
provider billed the call, nothing journaled yet; ``append.W0:1``: the restarted worker's first
journal write, before the re-send's intent, so before the re-send could reach the provider), or,
in the soak, at a random moment.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from temporal_app import POLICY
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from test_temporal_kill import start_worker

from cuaderno.checkpoint import Checkpoint
from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow, RunInput
from cuaderno.testing.ledger import LedgerProcess
from cuaderno.testing.records import read_records

FIRST_CALL = "t0000.model"


def stop(proc: subprocess.Popen[str]) -> None:
    """End a worker this test started (by its own handle), and close its pipe."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


async def outcome(handle: Any) -> dict[str, Any]:
    """The run's result, or ``{"status": "workflow failed", ...}`` when the workflow failed."""
    try:
        result: dict[str, Any] = await handle.result()
    except WorkflowFailureError as exc:
        return {"status": "workflow failed", "reason": str(exc.cause)}
    return result


def step_intents(journal: str, run_id: str, step_id: str) -> list[dict[str, Any]]:
    store = open_journal(journal)
    try:
        return [{"phase": e.phase, **e.payload} for e in store.load(run_id)
                if e.step_id == step_id and e.kind == "model" and e.phase.split(".")[0] == "intent"]
    finally:
        store.close()


def summary(journal: str, run_id: str) -> Checkpoint:
    store = open_journal(journal)
    try:
        cp = store.checkpoint(run_id)
        assert cp is not None
        return cp
    finally:
        store.close()


async def run_with_kills(env: WorkflowEnvironment, tmp_path: Path, points: list[str],
                         policy_text: str = POLICY) -> tuple[dict[str, Any], str, str, Path, int]:
    """One run of the payer agent; the first worker of each point dies there (SIGKILL of itself),
    a fresh worker is started after each death, the last one has no point armed. Returns the
    result, the run id, the journal URL, the billing log and the receipts."""
    policy = tmp_path / "effects.toml"
    policy.write_text(policy_text)
    billing = tmp_path / "billing.jsonl"
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    with LedgerProcess(mode="nodedup") as ledger:
        handle: WorkflowHandle[Any, Any] | None = None
        for point in points:
            worker = start_worker(env, queue, journal, ledger.url, billing, policy, point, dedup=False)
            if handle is None:
                handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="payer", task="pay bob"),
                                                         id=run_id, task_queue=queue)
            code = await asyncio.to_thread(worker.wait, 120)
            stop(worker)
            assert code == -signal.SIGKILL, f"the worker armed at {point} exited {code}"
        last = start_worker(env, queue, journal, ledger.url, billing, policy, None, dedup=False)
        try:
            assert handle is not None
            result = await outcome(handle)
        finally:
            stop(last)
        receipts = len(ledger.receipts())
    return result, run_id, journal, billing, receipts


@pytest.mark.parametrize("kills", [1, 2, 3])
async def test_a_model_call_lost_with_its_worker_again_and_again_completes(env: WorkflowEnvironment, tmp_path: Path,
                                                                          kills: int) -> None:
    """Each worker dies after the provider billed the call (the provider bills every request: its
    key ignored), before the journal has the response: every send reached the provider, so the
    journal must count each re-send as possibly billed twice, and the billing log must agree."""
    result, run_id, journal, billing, receipts = await run_with_kills(env, tmp_path, ["temporal.model.A1"] * kills)
    assert result == {"status": "completed", "output": "done: bob has his 5"}
    assert receipts == 1  # the transfer once, from the ledger's own record
    billed = Counter(r["key"] for r in read_records(billing))
    intents = step_intents(journal, run_id, FIRST_CALL)
    key = intents[0]["key"]
    assert billed[key] == kills + 1 == len(intents)  # every send billed, every send journaled
    assert [i["phase"] for i in intents] == ["intent"] + [f"intent.{n}" for n in range(2, kills + 2)]
    assert all(i["after"] == "crash" for i in intents[1:])
    cp = summary(journal, run_id)
    assert cp.count("model_calls") == 3 and cp.count("model_sends") == sum(billed.values()) == 3 + kills
    assert cp.count("possibly_billed_twice") == kills == sum(n - 1 for n in billed.values())


async def test_a_send_lost_before_its_intent_is_not_counted_as_billed_twice(env: WorkflowEnvironment,
                                                                            tmp_path: Path) -> None:
    """First worker: killed after the provider billed the first send. Second worker: killed at its
    first journal write, the re-send's intent, so that send never reached the provider. The third
    sends once more: two bills for the key, two sends counted, one possibly billed twice."""
    result, run_id, journal, billing, receipts = await run_with_kills(env, tmp_path,
                                                                      ["temporal.model.A1", "append.W0:1"])
    assert result == {"status": "completed", "output": "done: bob has his 5"}
    assert receipts == 1
    billed = Counter(r["key"] for r in read_records(billing))
    intents = step_intents(journal, run_id, FIRST_CALL)
    assert billed[intents[0]["key"]] == 2 == len(intents)
    cp = summary(journal, run_id)
    assert cp.count("model_sends") == sum(billed.values()) == 4
    assert cp.count("possibly_billed_twice") == 1


async def test_the_bound_on_worker_losses_fails_the_step_past_it(env: WorkflowEnvironment, tmp_path: Path) -> None:
    """``[activities] max_worker_losses = 1``: the second loss goes to the loop's retry layer as a
    send of unknown fate, and the run's ``[retry] max_resends = 0`` gives up there."""
    bounded = POLICY.replace("heartbeat_s = 1", "heartbeat_s = 1\nmax_worker_losses = 1") + "\n[retry]\nmax_resends = 0\n"
    result, run_id, journal, billing, receipts = await run_with_kills(env, tmp_path, ["temporal.model.A1"] * 2,
                                                                      bounded)
    assert result["status"] == "workflow failed" and "model activity failed" in result["reason"], result
    assert receipts == 0
    billed = Counter(r["key"] for r in read_records(billing))
    assert sum(billed.values()) == 2 == len(step_intents(journal, run_id, FIRST_CALL))


@pytest.mark.soak
@pytest.mark.timeout(3600)
@pytest.mark.skipif(os.environ.get("CUADERNO_SOAK") != "1", reason="soak: CUADERNO_SOAK=1")
async def test_random_worker_kills_never_fail_a_run(env: WorkflowEnvironment, tmp_path: Path) -> None:
    """50 runs; in each, the worker is SIGKILLed 1 to 3 times in a row, each time at a random
    moment within 0.6 s after a model call left it (the worker says SENDING; the provider answers
    after 0.4 s: before the bill, between the bill and the journal, or after), so the kills fall
    on the same call again and again; then a worker runs it to the end. No run may fail; each key
    billed at most as many times as the journal counts its sends, and the ledger's transfer
    happened at most once (``needs_human`` when its fate could not be told)."""
    rng = random.Random(int(os.environ.get("CUADERNO_SEED") or 32))
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    outcomes: Counter[str] = Counter()
    kills = over_billed = duplicates = resent = 0
    with LedgerProcess(mode="nodedup") as ledger:
        for trial in range(int(os.environ.get("CUADERNO_TRIALS") or 50)):
            billing = tmp_path / f"billing-{trial}.jsonl"
            journal = f"sqlite:///{tmp_path / f'journal-{trial}.db'}"
            queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
            extra = {"PROVIDER_DELAY": "0.4", "PROVIDER_SAYS_SENDING": "1"}
            handle = None
            for _ in range(rng.randint(1, 3)):
                worker = start_worker(env, queue, journal, ledger.url, billing, policy, None, False, extra)
                if handle is None:
                    handle = await env.client.start_workflow(CuadernoWorkflow.run,
                                                             RunInput(agent="payer", task="pay bob"),
                                                             id=run_id, task_queue=queue)
                assert worker.stdout is not None
                try:  # the run may end before another call leaves this worker: then no kill
                    said = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 30)
                except TimeoutError:
                    said = ""
                if said.strip() == "SENDING":
                    await asyncio.sleep(rng.uniform(0.0, 0.6))
                if said.strip() == "SENDING" and worker.poll() is None:
                    worker.send_signal(signal.SIGKILL)
                    kills += 1
                stop(worker)
            last = start_worker(env, queue, journal, ledger.url, billing, policy, None, False, extra)
            assert handle is not None
            try:
                result = await outcome(handle)
            finally:
                stop(last)
            outcomes[result["status"]] += 1
            store = open_journal(journal)
            try:
                events = store.load(run_id)
            finally:
                store.close()
            sends = Counter(e.payload.get("key") for e in events if e.kind == "model" and e.phase.startswith("intent"))
            resent += sum(1 for e in events if e.phase.startswith("intent.") and e.payload.get("after") == "crash")
            for key, n in Counter(r["key"] for r in read_records(billing)).items():
                over_billed += n > sends[key]
        receipts = Counter(r["key"] for r in ledger.receipts())
        duplicates = sum(1 for n in receipts.values() if n > 1)
    print(f"R25 soak: {sum(outcomes.values())} runs, {kills} kills, {resent} sends lost with their worker and "
          f"sent again, outcomes {dict(outcomes)}, "
          f"keys billed more than counted {over_billed}, duplicate receipts {duplicates}")
    assert outcomes["workflow failed"] == 0 and outcomes["failed"] == 0, outcomes
    assert over_billed == 0 and duplicates == 0



async def test_a_worker_shut_down_twice_during_one_model_call_is_not_a_failed_send(env: WorkflowEnvironment,
                                                                                  tmp_path: Path) -> None:
    """A deploy: the worker is asked to stop (SIGTERM: it shuts down gracefully) while a model call
    is in flight, twice. Each shutdown is a send lost with its worker, sent again; the loop's
    max_resends=1 is not spent, and the held sends, never answered, were never billed."""
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    journal, billing = f"sqlite:///{tmp_path / 'journal.db'}", tmp_path / "billing.jsonl"
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    with LedgerProcess(mode="nodedup") as ledger:
        handle = None
        for _ in range(2):
            worker = start_worker(env, queue, journal, ledger.url, billing, policy, None, False,
                                  {"PROVIDER_DELAY": "600", "PROVIDER_SAYS_SENDING": "1"})
            if handle is None:
                handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="payer", task="pay bob"),
                                                         id=run_id, task_queue=queue)
            try:
                assert worker.stdout is not None
                assert (await asyncio.to_thread(worker.stdout.readline)).strip() == "SENDING"  # the call is in flight
                worker.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(worker.wait, 60) == 0  # it shut down, gracefully
            finally:
                stop(worker)
        last = start_worker(env, queue, journal, ledger.url, billing, policy, None, False)
        try:
            assert handle is not None
            result = await handle.result()
        finally:
            stop(last)
        receipts = len(ledger.receipts())
    assert result == {"status": "completed", "output": "done: bob has his 5"}
    assert receipts == 1
    intents = step_intents(journal, run_id, FIRST_CALL)
    assert [(i["phase"], i.get("after")) for i in intents] == [("intent", None), ("intent.2", "crash"),
                                                                ("intent.3", "crash")]
    assert len(read_records(billing)) == 3  # three calls billed once each: the held sends never were


@pytest.mark.parametrize(("points", "receipts_seen", "status"), [
    # Killed after the transfer's intent, before its body, twice: the lookup proves it absent each
    # time; the second re-send is past max_resends=1, so the run stops for a person, never failed.
    (["append.W2:4", "append.W2:1"], 0, "needs_human"),
    # Killed after the ledger took the transfer, before the journal has it: the lookup finds it.
    (["temporal.tool.A1"], 1, "completed"),
])
async def test_a_tool_call_lost_with_its_worker_never_fails_the_run(env: WorkflowEnvironment, tmp_path: Path,
                                                                   points: list[str], receipts_seen: int,
                                                                   status: str) -> None:
    """A non-idempotent tool lost with its worker is reconciled as after a local crash (its
    lookup), never a failed run, never a second transfer."""
    result, _, _, _, receipts = await run_with_kills(env, tmp_path, points)
    assert result["status"] == status, result
    assert receipts == receipts_seen
