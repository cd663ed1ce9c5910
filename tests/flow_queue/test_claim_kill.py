"""SIGKILLs at the queue's named points (``cuaderno.faults``): a submitter between its queue row
and the run's first event (``flow.S1``), a worker inside the one transaction that takes over
every run of its claim (``queue.C0``) and right after it (``queue.C1``). The fake ledger's
receipts prove each run did its work once."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

from cuaderno import open_journal
from cuaderno.flow import submit
from cuaderno.journal import queue_of

HERE = Path(__file__).resolve().parent


def _drain(world: Any) -> None:
    worker = world.worker("--concurrency", "4", "--until-idle")
    _, err = worker.communicate(timeout=180)
    assert worker.returncode == 0, err


def test_a_submitter_killed_before_the_first_event_leaves_nothing_to_run_and_a_resubmit_starts_it(
        fq_world: Any) -> None:
    go = fq_world.dir / "go"
    go.touch()
    child = fq_world.python(str(HERE / "flowq_submit.py"), fq_world.journal, str(go), "order-9",
                            CUADERNO_CRASH_AT="flow.S1")
    child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    store = open_journal(fq_world.journal)
    try:
        assert store.list_runs(limit=10) == []  # the queue row only: no run, nothing for a worker
    finally:
        store.close()
    _drain(fq_world)
    assert fq_world.receipts() == []
    again = fq_world.python(str(HERE / "flowq_submit.py"), fq_world.journal, str(go), "order-9")
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    handle = json.loads(out.strip().splitlines()[-1])
    assert handle["created"] is False  # the dead submit's run, started now from its queue row
    _drain(fq_world)
    assert fq_world.statuses() == {handle["run_id"]: "completed"}
    assert Counter(r["effect"] for r in fq_world.receipts()) == {"begin": 1, "finish": 1}


def test_a_worker_killed_right_after_its_claim_leaves_the_runs_to_the_next(fq_world: Any) -> None:
    import flowq_agent

    store = open_journal(fq_world.journal)
    try:
        runs = [submit(store, flowq_agent.agent, f"key=k{i} claimed then killed").run_id for i in range(6)]
    finally:
        store.close()
    doomed = fq_world.worker("--concurrency", "4", CUADERNO_CRASH_AT="queue.C1")
    doomed.communicate(timeout=60)
    assert doomed.returncode == -signal.SIGKILL
    store = open_journal(fq_world.journal)
    try:
        taken = [r for r in runs if store.checkpoint(r).epoch > 0]  # type: ignore[union-attr]
        assert len(taken) == 4 and store.holders(runs) == {}  # taken over, and free since its death
        assert queue_of(store).waiting_for(taken[0]) is None
    finally:
        store.close()
    _drain(fq_world)
    assert fq_world.statuses() == dict.fromkeys(runs, "completed")
    per_run = Counter((r["business_id"], r["effect"]) for r in fq_world.receipts())
    assert set(per_run.values()) == {1} and len(per_run) == 2 * len(runs)




def test_a_worker_killed_inside_its_batched_takeover_leaves_every_run_as_before_the_claim(fq_world: Any) -> None:
    """``queue.C0``: the claim's four runs locked and their rows written in one transaction, not
    committed. Nothing of it is durable (every run still at epoch 0, none held), the next worker
    claims them at once, and the ledger shows each run's work done once."""
    import flowq_agent

    store = open_journal(fq_world.journal)
    try:
        runs = [submit(store, flowq_agent.agent, f"key=k{i} claim killed mid-transaction").run_id for i in range(6)]
    finally:
        store.close()
    doomed = fq_world.worker("--concurrency", "4", CUADERNO_CRASH_AT="queue.C0")
    doomed.communicate(timeout=60)
    assert doomed.returncode == -signal.SIGKILL
    store = open_journal(fq_world.journal)
    try:
        assert {r: store.checkpoint(r).epoch for r in runs} == dict.fromkeys(runs, 0)  # type: ignore[union-attr]
        assert store.holders(runs) == {}
        assert all(queue_of(store).waiting_for(r) is None for r in runs)
    finally:
        store.close()
    assert fq_world.receipts() == []  # nothing ran
    _drain(fq_world)
    assert fq_world.statuses() == dict.fromkeys(runs, "completed")
    per_run = Counter((r["business_id"], r["effect"]) for r in fq_world.receipts())
    assert set(per_run.values()) == {1} and len(per_run) == 2 * len(runs)
