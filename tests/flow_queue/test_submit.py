"""Submitting runs (issue 36 parts 3 and 4's ``start_at``): what a submit writes, the order
workers claim in, idempotent starts, and refusals that write nothing. Both backends."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from cuaderno import Agent, MemoryCheckpointer, ScriptedGateway, Session, SubmitConflict, UsageError, open_journal, tool
from cuaderno.flow import limits, set_limit, submit, waiting_for
from cuaderno.journal import queue_of
from cuaderno.worker import Worker

ORDER: list[str] = []

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "journals"
"""Journal files as earlier releases wrote them."""


@tool
def note(label: str) -> str:
    """Note that this run ran (the order runs were driven in)."""
    ORDER.append(label)
    return label


agent = Agent(instructions="note your task", tools=[note], name="noter")


def _gateway() -> ScriptedGateway:
    def script(request: Any) -> Any:
        task = next(str(m["content"]) for m in request.messages if m.get("role") == "user")
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        return ScriptedGateway.call("note", label=task) if turn == 0 else ScriptedGateway.text("ok")
    return ScriptedGateway(script)


def _drain(url: str, concurrency: int = 1) -> None:
    store = open_journal(url)
    try:
        Worker(store, agent, _gateway, concurrency=concurrency, poll_interval=0.05, log=None).run_sync(until_idle=True)
    finally:
        store.close()


def test_a_submitted_run_starts_as_the_loop_would_and_a_worker_claims_it_at_once(store: Any, fq_journal: str) -> None:
    handle = submit(store, agent, "first")
    assert handle.created and handle.run_id.startswith("q-")
    events = store.load(handle.run_id)
    assert [(e.kind, e.step_id, e.phase) for e in events] == [("run", "run", "start")]
    assert events[0].payload == {"task": "first", "versions": agent.versions(), "tenant": "default"}
    # The application may also drive it itself: the loop finds its own first event and resumes.
    import asyncio

    result = asyncio.run(agent.run_to_end("first", session=Session(handle.run_id, _gateway(), store)))
    assert result.status == "completed"
    assert [e.phase for e in store.load(handle.run_id)].count("start") == 1
    other = submit(store, agent, "second")
    ORDER.clear()
    started = time.monotonic()
    store.close()
    _drain(fq_journal)
    # Claimed at the first poll (never-held runs started by an application wait for a second look).
    assert time.monotonic() - started < 5
    assert "second" in ORDER
    again = open_journal(fq_journal)
    try:
        assert again.checkpoint(other.run_id).status == "completed"  # type: ignore[union-attr]
    finally:
        again.close()


def test_higher_priority_first_then_oldest(store: Any, fq_journal: str) -> None:
    for label, priority in [("low-1", 0), ("high-1", 5), ("low-2", 0), ("mid", 2), ("high-2", 5)]:
        submit(store, agent, label, priority=priority)
    store.close()
    ORDER.clear()
    _drain(fq_journal, concurrency=1)
    assert ORDER == ["high-1", "high-2", "mid", "low-1", "low-2"]


def test_start_at_is_not_claimed_before_its_time(store: Any, fq_journal: str) -> None:
    at = queue_of(store).now() + 1.5
    later = submit(store, agent, "later", start_at=at)
    now = submit(store, agent, "now")
    assert later.start_at == at
    assert waiting_for(store, later.run_id) is not None and waiting_for(store, later.run_id).startswith("its start time")
    assert waiting_for(store, now.run_id) is None
    store.close()
    ORDER.clear()
    _drain(fq_journal)
    assert ORDER == ["now"]
    time.sleep(max(0.0, at - time.time()) + 0.3)
    _drain(fq_journal)
    assert ORDER == ["now", "later"]


def test_an_idempotency_key_names_its_open_run_and_debounce_its_recent_one(store: Any, fq_journal: str) -> None:
    first = submit(store, agent, "pay invoice 7", idempotency_key="invoice-7")
    second = submit(store, agent, "pay invoice 7 (again)", idempotency_key="invoice-7")
    assert (second.run_id, second.created, first.created) == (first.run_id, False, True)
    store.close()
    _drain(fq_journal)
    store = open_journal(fq_journal)
    try:
        assert store.checkpoint(first.run_id).status == "completed"
        # Within the debounce window after it was submitted: the closed run answers.
        debounced = submit(store, agent, "pay invoice 7", idempotency_key="invoice-7", debounce=3600)
        assert (debounced.run_id, debounced.created) == (first.run_id, False)
        # Without it, a closed run's key starts a new run.
        fresh = submit(store, agent, "pay invoice 7", idempotency_key="invoice-7")
        assert fresh.created and fresh.run_id != first.run_id
        assert submit(store, agent, "x", idempotency_key="invoice-7").run_id == fresh.run_id
    finally:
        store.close()


def test_a_run_id_is_submitted_once(store: Any) -> None:
    a = submit(store, agent, "same", run_id="order-1")
    b = submit(store, agent, "same", run_id="order-1")
    assert (a.created, b.created, b.run_id) == (True, False, "order-1")
    with pytest.raises(SubmitConflict, match="queued with another task"):
        submit(store, agent, "different", run_id="order-1")


def test_a_run_started_outside_the_queue_is_refused(store: Any) -> None:
    import asyncio

    asyncio.run(agent.run_to_end("mine", session=Session("app-run", _gateway(), store)))
    before = store.load("app-run")
    with pytest.raises(SubmitConflict, match="started outside the queue"):
        submit(store, agent, "mine", run_id="app-run")
    assert store.load("app-run") == before
    assert queue_of(store).entry("app-run") is None


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"priority": 1.5}, "priority must be a 32-bit integer"),
    ({"priority": 2**40}, "priority must be a 32-bit integer"),
    ({"start_at": float("nan")}, "start_at must be seconds"),
    ({"start_at": "tomorrow"}, "start_at must be seconds"),
    ({"debounce": 5}, "debounce needs an idempotency_key"),
    ({"idempotency_key": "k", "debounce": -1}, "debounce must be a positive number"),
    ({"concurrency_key": ""}, "concurrency_key must be a non-empty string"),
    ({"idempotency_key": "x" * 201}, "idempotency_key must be a non-empty string"),
    ({"run_id": "a\x00b"}, "run_id must be"),
])
def test_bad_input_is_refused_typed_and_writes_nothing(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    path = tmp_path / "j.db"
    s = open_journal(str(path))
    s.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    s = open_journal(str(path))
    try:
        with pytest.raises(UsageError, match=match):
            submit(s, agent, "task", **kwargs)
    finally:
        s.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


def test_a_memory_store_has_no_queue() -> None:
    with pytest.raises(UsageError, match="has no queue"):
        submit(MemoryCheckpointer(), agent, "task")


def test_limits_are_stored_in_the_journal(store: Any) -> None:
    set_limit(store, "tenant-a", 2)
    set_limit(store, "tenant-b", 1)
    set_limit(store, "tenant-b", None)
    assert limits(store) == {"tenant-a": 2}
    with pytest.raises(UsageError, match="limit must be a positive integer"):
        set_limit(store, "tenant-a", 0)
    assert limits(store) == {"tenant-a": 2}


def test_a_schema_2_sqlite_journal_migrates_forward(tmp_path: Path) -> None:
    """A journal written before the queue (schema 2, as that release wrote it: the golden file)
    opens, keeps its runs readable, and takes submits."""
    path = tmp_path / "old.db"
    shutil.copyfile(GOLDEN / "schema_v2.sqlite", path)
    s = open_journal(str(path))
    try:
        assert s.checkpoint("golden-support").status == "completed"  # type: ignore[union-attr]
        assert len(s.load("golden-support")) > 3
        assert submit(s, agent, "new").created
    finally:
        s.close()


@pytest.mark.postgres
def test_a_postgres_journal_of_the_previous_schema_migrates_forward() -> None:
    """A PostgreSQL journal of version 1 (before the queue's tables and the rows' digest keys),
    holding a run this agent completed, opens, keeps that run, and takes submits."""
    import asyncio

    from _pg import drop_schemas, new_schema, schema_url, server_or_skip, version_1_journal

    from cuaderno.journal import MemoryCheckpointer

    server_or_skip()
    schema = new_schema()
    try:
        mem = MemoryCheckpointer()
        asyncio.run(agent.run_to_end("old", session=Session("old-run", _gateway(), mem)))
        version_1_journal(schema, mem)
        s = open_journal(schema_url(schema))
        try:
            assert s.checkpoint("old-run").status == "completed"  # type: ignore[union-attr]
            assert submit(s, agent, "new").created
        finally:
            s.close()
    finally:
        drop_schemas([schema])


def test_status_says_what_holds_a_queued_run_back(store: Any, fq_journal: str) -> None:
    """``cuaderno status``: a queued run over its key's limit, or before its start time, says so."""
    import subprocess
    import sys

    set_limit(store, "tenant-a", 1)
    first = submit(store, agent, "one", concurrency_key="tenant-a")
    second = submit(store, agent, "two", concurrency_key="tenant-a")
    later = submit(store, agent, "later", start_at=queue_of(store).now() + 3600)
    epoch = store.acquire(first.run_id, "a worker")  # in progress: held by a live process (this one)

    def status(run_id: str) -> str:
        done = subprocess.run([sys.executable, "-m", "cuaderno", "--db", fq_journal, "status", run_id],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    try:
        assert status(second.run_id) == (f"run {second.run_id}: queued, waiting for a slot of concurrency key "
                                         "'tenant-a' (1 of 1 in progress)")
        assert status(later.run_id).startswith(f"run {later.run_id}: queued, waiting for its start time (")
        assert status(first.run_id).startswith(f"run {first.run_id}: running, held by a worker")
    finally:
        store.release(first.run_id, epoch)
    assert status(second.run_id) == f"run {second.run_id}: waiting for a worker"


def test_submit_conflict_survives_a_round_trip() -> None:
    import pickle

    error = SubmitConflict("order-1", "the run is queued with another task")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is SubmitConflict and str(again) == str(error) and again.run_id == "order-1"


def test_the_flow_limit_commands(fq_journal: str) -> None:
    import json
    import subprocess
    import sys

    open_journal(fq_journal).close()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cuaderno", "--db", fq_journal, "flow", *args],
                              capture_output=True, text=True, timeout=60)

    assert cli("limit", "tenant-a", "3").returncode == 0
    assert cli("limit", "tenant-b", "1").returncode == 0
    assert cli("limit", "tenant-b", "none").returncode == 0
    assert json.loads(cli("limits", "--json").stdout) == {"tenant-a": 3}
    for bad in ("0", "-2", "many"):
        refused = cli("limit", "tenant-a", bad)
        assert refused.returncode == 2 and refused.stderr.startswith("error: ") and "Traceback" not in refused.stderr
    assert json.loads(cli("limits", "--json").stdout) == {"tenant-a": 3}
