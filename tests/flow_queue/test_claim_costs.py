"""What a claim of a fleet does not spend (issue 36 part 5): it reads a window of the best
candidates before all of them, marks the rows of ended runs done inside its takeover, probes holds
from the lock bytes alone; a worker skips reading the open runs while every open run is the queue's;
a claiming PostgreSQL store keeps its lock connection between runs. Each still claims what it did."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cuaderno import Agent, ScriptedGateway, Session, StepEvent, open_journal, tool
from cuaderno.fingerprint import fingerprint
from cuaderno.flow import submit
from cuaderno.journal import canonical_versions, queue_of
from cuaderno.journal._claims import held_by_lock


@tool(effect_free=True)
def mark(label: str) -> str:
    """Mark a run."""
    return label


agent = Agent(instructions="mark your task", tools=[mark], name="claim-costs")
VERSIONS = canonical_versions(agent.versions())


def _gateway() -> ScriptedGateway:
    return ScriptedGateway([ScriptedGateway.text("done")])


def _done(store: Any, run_id: str) -> bool:
    q = queue_of(store)
    with q._read() as db:
        return bool(db.execute(q._sql("SELECT done FROM cuaderno_queue WHERE run_id = ?"), (run_id,)).fetchone()[0])


def test_a_claim_finds_a_waiting_run_behind_more_held_runs_than_its_first_read(store: Any) -> None:
    runs = [submit(store, agent, f"task {i}").run_id for i in range(70)]
    for run_id in runs[:66]:  # the first 66 in claim order are held (here, by this store)
        store.acquire(run_id, "elsewhere")
    q = queue_of(store)
    # free=1, nothing skipped: the first read is 2 * 1 + 64 = 66 rows, every one of them held.
    claim = q.claim(versions=VERSIONS, owner="w", free=1, skip=set())
    assert [run_id for run_id, _ in claim.taken] == [runs[66]]
    assert claim.lost == 0 and claim.stale == 0


def test_a_claim_marks_the_rows_of_ended_runs_done_in_its_takeover(store: Any) -> None:
    first = submit(store, agent, "first").run_id
    second = submit(store, agent, "second").run_id
    result = asyncio.run(agent.run_to_end("first", session=Session(first, _gateway(), store)))
    assert result.status == "completed"
    assert not _done(store, first)
    claim = queue_of(store).claim(versions=VERSIONS, owner="w", free=4, skip=set())
    assert [run_id for run_id, _ in claim.taken] == [second]
    assert _done(store, first) and not _done(store, second)
    # Nothing left to take: a claim that finds only ended runs still marks them done.
    store.release(second, claim.taken[0][1])
    asyncio.run(agent.run_to_end("second", session=Session(second, _gateway(), store)))
    assert queue_of(store).claim(versions=VERSIONS, owner="w", free=4, skip=set()).taken == []
    assert _done(store, second)


def test_work_outside_the_queue_is_seen(store: Any) -> None:
    q = queue_of(store)
    assert not q.work_outside()
    submit(store, agent, "queued")
    assert not q.work_outside()  # a running run with a queue row: the queue's
    start = {"task": "by hand", "versions": agent.versions(), "tenant": "default"}
    store.append([StepEvent(run_id="by-hand", step_id="run", phase="start", kind="run", name=agent.name,
                            fingerprint=fingerprint({"task": "by hand"}), payload=start)])
    assert q.work_outside()  # started by an application that went away: a worker finds it by looking
    asyncio.run(agent.run_to_end("by hand", session=Session("by-hand", _gateway(), store)))
    assert not q.work_outside()


_HOLDER = """
import sys, time
from cuaderno import open_journal
store = open_journal(sys.argv[1])
store.acquire(sys.argv[2], "holder")
open(sys.argv[3], "w").close()
time.sleep(60)
"""


def test_held_by_lock_sees_another_process_hold_and_its_death(tmp_path: Path) -> None:
    path = str(tmp_path / "runs.db")
    store = open_journal(path)
    try:
        a, b, c = (submit(store, agent, f"task {i}").run_id for i in range(3))
        assert held_by_lock(path, [a, b, c]) == set()
        ready = tmp_path / "ready"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        holder = subprocess.Popen([sys.executable, "-c", _HOLDER, path, a, str(ready)], env=env)
        try:
            deadline = time.monotonic() + 30
            while not ready.exists():
                assert holder.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            store.acquire(b, "me")
            assert held_by_lock(path, [a, b, c]) == {a, b}
            assert set(store.holders([a, b, c])) == {a, b}  # the same answer as the described holds
        finally:
            holder.kill()
            holder.wait()
        assert held_by_lock(path, [a, b, c]) == {b}
    finally:
        store.close()
    assert held_by_lock(":memory:", ["x"]) is None


@pytest.mark.postgres
def test_a_claiming_postgres_store_keeps_its_lock_connection_between_runs(fq_journal: str) -> None:
    if not fq_journal.startswith("postgresql"):
        pytest.skip("PostgreSQL's lock connection")
    store = open_journal(fq_journal)
    try:
        runs = [submit(store, agent, f"task {i}").run_id for i in range(2)]
        q = queue_of(store)
        claim = q.claim(versions=VERSIONS, owner="w", free=1, skip=set())
        backend = store.holder_pid()
        assert backend is not None
        store.release(runs[0], claim.taken[0][1])
        assert store.holder_pid() is None  # it holds no run
        assert store._holds is not None and not store._holds.closed  # but its connection stays
        claim = q.claim(versions=VERSIONS, owner="w", free=1, skip={runs[0]})
        assert [run_id for run_id, _ in claim.taken] == [runs[1]]
        assert store.holder_pid() == backend  # the same session took the next run
    finally:
        store.close()
