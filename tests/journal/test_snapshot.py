"""Snapshots (``cuaderno.loop._snapshots``) on SQLite: written every 256 rows in the chain, a resume
goes on from the latest one and the rows after it, and a damaged one is never trusted.

The proof that a resume from a snapshot changes nothing the world sees: the requests the model
gets (first pass + resumed pass) are exactly those of the same run never stopped, and every tool
body ran once (counted by the tools, outside the journal).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from _snapshot_world import TailSpy, World, bodies, drive

from cuaderno import ReplayDivergence, Session, VersionMismatch, open_journal
from cuaderno.checkpoint import rebuild, verified
from cuaderno.errors import JournalCorrupt, RunNotFound
from cuaderno.events import StepEvent
from cuaderno.loop import _snapshots

TURNS = 200


def _url(tmp_path: Path, name: str = "runs.db") -> str:
    return f"sqlite:///{(tmp_path / name).resolve()}"


def _rows(url: str, run_id: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return db.execute("SELECT seq, step_id, phase, row_hash FROM cuaderno_events WHERE run_id=? ORDER BY seq",
                          (run_id,)).fetchall()
    finally:
        db.close()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[World, list[Any], list[StepEvent]]:
    """The run never stopped: its requests and its journal."""
    world = World(TURNS)
    gateway = world.gateway()
    url = _url(tmp_path_factory.mktemp("base"))
    asyncio.run(drive(world, url, "r", gateway))
    store = open_journal(url)
    try:
        events = store.load("r")
    finally:
        store.close()
    return world, bodies(gateway), events


def test_snapshot_rows_every_256_rows_in_the_chain(baseline: tuple[World, list[Any], list[StepEvent]]) -> None:
    _, _, events = baseline
    snaps = [ev for ev in events if ev.kind == "snapshot"]
    assert len(snaps) == len(events) // 256 >= 2
    last = 0
    for snap in snaps:
        after = events[snap.seq]  # the next row, in the same transaction: the turn's first send
        assert (after.kind, after.phase) == ("model", "intent")
        assert snap.payload["turn"] == after.payload["turn"] and snap.payload["chain"] == after.fingerprint
        base = int(snap.phase.removeprefix("base."))
        assert base < snap.seq and snap.payload["base"]["last_seq"] == base
        assert 256 <= snap.seq - last <= 256 + 8  # every 256 rows, at the next turn's start
        last = snap.seq
    # A snapshot is never a run's next step (the send after it, in the same commit, is).
    for snap in snaps:
        assert rebuild("r", events[:snap.seq + 1]).next_step == f"{events[snap.seq].step_id}:intent"


@pytest.mark.parametrize("stop_after", [150, 301, 333, 380])
def test_resume_goes_on_from_the_snapshot_and_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, baseline: tuple[World, list[Any], list[StepEvent]],
        stop_after: int) -> None:
    _, want, whole = baseline
    world = World(TURNS)
    url = _url(tmp_path)
    first = world.gateway()
    asyncio.run(drive(world, url, "r", first, stop_after=stop_after))
    spy = TailSpy()
    monkeypatch.setattr(_snapshots, "tail_open", spy)
    second = world.gateway()
    last = asyncio.run(drive(world, url, "r", second))
    assert spy.used == [True]
    assert bodies(first) + bodies(second) == want  # no request re-sent, none different
    assert last.output == "done"
    assert all(n == 1 for n in world.ran.values()) and not any(k.startswith("secret") for k in world.ran)
    store = open_journal(url)
    try:
        cp, events = verified(store, "r")  # the summary is the projection of the whole chain
    finally:
        store.close()
    assert cp.status == "completed"
    assert [(e.step_id, e.phase, _unchained(e.payload)) for e in events if e.kind != "run"] == \
        [(e.step_id, e.phase, _unchained(e.payload)) for e in whole if e.kind != "run"]


def test_ready_without_reading_the_whole_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening reads the tail only; the whole journal is read once, for the first model call's
    conversation (and checked against the snapshot's chain) -- after the run was taken over."""
    world = World(TURNS)
    url = _url(tmp_path)
    asyncio.run(drive(world, url, "r", world.gateway(), stop_after=333))
    from cuaderno.journal.sqlite import SqliteCheckpointer

    log: list[str] = []
    orig_load = SqliteCheckpointer.load

    def load(self: SqliteCheckpointer, run_id: str) -> list[StepEvent]:
        log.append("load")
        return orig_load(self, run_id)

    monkeypatch.setattr(SqliteCheckpointer, "load", load)
    gateway = world.gateway()
    orig_complete = gateway.complete

    async def complete(request: Any, *, idempotency_key: str) -> Any:
        log.append("model")
        return await orig_complete(request, idempotency_key=idempotency_key)

    monkeypatch.setattr(gateway, "complete", complete)
    asyncio.run(drive(world, url, "r", gateway, stop_after=1))
    assert log[:2] == ["load", "model"]  # one whole read, right before the first request


def _corrupt_snapshot(url: str) -> None:
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        (rowid, payload, codec), = db.execute(
            "SELECT rowid, payload, codec FROM cuaderno_events WHERE step_id='snapshot' ORDER BY seq DESC LIMIT 1")
        assert codec in ("json", "json+zstd")
        db.execute("UPDATE cuaderno_events SET codec='json', payload=? WHERE rowid=?",
                   (b'{"format":1,"turn":1,"chain":"x","first":"y","base":{}}', rowid))
        db.commit()
    finally:
        db.close()


def test_damaged_snapshot_is_journal_corrupt_and_nothing_is_written(tmp_path: Path) -> None:
    world = World(TURNS)
    url = _url(tmp_path)
    asyncio.run(drive(world, url, "r", world.gateway(), stop_after=333))
    _corrupt_snapshot(url)
    before = _rows(url, "r")
    gateway = world.gateway()
    with pytest.raises(JournalCorrupt, match="altered"):
        asyncio.run(drive(world, url, "r", gateway))
    assert gateway.calls == 0 and _rows(url, "r") == before


def test_forged_snapshot_that_chains_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    baseline: tuple[World, list[Any], list[StepEvent]]) -> None:
    """A snapshot appended as an ordinary row (it chains) whose base is not the run's state is
    refused by the check, and the run resumes from the whole journal as before."""
    _, want, _ = baseline
    world = World(TURNS)
    url = _url(tmp_path)
    first = world.gateway()
    asyncio.run(drive(world, url, "r", first, stop_after=333))
    store = open_journal(url)
    try:
        cp = store.checkpoint("r")
        assert cp is not None
        base = cp.to_json()
        base.pop("epoch")
        base["counters"] = {**base.get("counters", {}), "model_sends": 1}  # the wrong state
        store.append([StepEvent(run_id="r", step_id="snapshot", phase=f"base.{cp.last_seq}", kind="snapshot",
                                payload={"format": 1, "turn": 150, "chain": "0" * 64, "first": "0" * 64,
                                         "base": base})])
    finally:
        store.close()
    spy = TailSpy()
    monkeypatch.setattr(_snapshots, "tail_open", spy)
    second = world.gateway()
    assert asyncio.run(drive(world, url, "r", second)).output == "done"
    assert spy.used == [False]
    assert bodies(first) + bodies(second) == want


@pytest.mark.parametrize("change", ["instructions", "instructions-resume", "task"])
def test_other_configuration_is_refused_before_the_takeover(tmp_path: Path, change: str) -> None:
    """As from the whole journal: other instructions (other versions; resumed anyway, turn 0's
    request differs) or another task are refused, nothing written."""
    world = World(TURNS)
    url = _url(tmp_path)
    asyncio.run(drive(world, url, "r", world.gateway(), stop_after=333))
    before = _rows(url, "r")
    gateway = world.gateway()
    agent = world.agent
    task, choice, error = "task", "refuse", ReplayDivergence
    if change.startswith("instructions"):
        agent = type(agent)(instructions="other", tools=world.tools, policy=agent.policy, max_turns=agent.max_turns,
                            budgets=agent.budgets)
        choice, error = ("resume", ReplayDivergence) if change.endswith("resume") else ("refuse", VersionMismatch)
    else:
        task = "another task"

    async def go() -> None:
        async for _ in agent.run(task, session=Session("r", gateway, store, on_version_mismatch=choice)):
            pass

    with open_journal(url) as store, pytest.raises(error):
        asyncio.run(go())
    assert gateway.calls == 0 and _rows(url, "r") == before


def test_damage_before_the_snapshot_is_found_before_the_first_request(tmp_path: Path) -> None:
    """A row before the snapshot is not read to get ready; the conversation's whole read finds
    it, before the first request leaves (nothing sent, nothing billed)."""
    world = World(TURNS)
    url = _url(tmp_path)
    asyncio.run(drive(world, url, "r", world.gateway(), stop_after=333))
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        db.execute("UPDATE cuaderno_events SET codec='json', payload=? WHERE run_id='r' AND seq=10",
                   (b'{"outcome":"ok","value":"forged"}',))
        db.commit()
    finally:
        db.close()
    gateway = world.gateway()
    with pytest.raises(JournalCorrupt):
        asyncio.run(drive(world, url, "r", gateway))
    assert gateway.calls == 0


def test_the_index_is_there_before_the_first_snapshot_and_made_if_missing(tmp_path: Path) -> None:
    """The loop has the (run_id, seq) index created before the first snapshot commits; a journal
    without it (dropped here) is read whole by a read-only store, and a writable one creates it."""
    world = World(TURNS)
    url = _url(tmp_path)
    asyncio.run(drive(world, url, "r", world.gateway(), stop_after=333))
    ro = open_journal(url, readonly=True)
    try:
        tail = ro.load_tail("r", "snapshot")  # type: ignore[attr-defined]
        assert tail is not None and tail.events[-1].seq == tail.summary.last_seq
    finally:
        ro.close()
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        db.execute("DROP INDEX cuaderno_events_run_seq")
        db.commit()
    finally:
        db.close()
    ro = open_journal(url, readonly=True)
    try:
        assert ro.load_tail("r", "snapshot") is None  # type: ignore[attr-defined]
    finally:
        ro.close()
    rw = open_journal(url)
    try:
        tail = rw.load_tail("r", "snapshot")  # type: ignore[attr-defined]
        assert tail is not None and tail.events[-1].seq == tail.summary.last_seq
        with pytest.raises(RunNotFound):
            rw.load_tail("nope", "snapshot")  # type: ignore[attr-defined]
    finally:
        rw.close()


def _killed_child(url: str, at: str) -> None:
    from cuaderno.testing import crash

    crash.arm(at)
    world = World(TURNS)
    asyncio.run(drive(world, url, "r", world.gateway()))
    os._exit(3)  # not reached: the armed point kills the process


def test_resume_after_a_sigkill_reads_the_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               baseline: tuple[World, list[Any], list[StepEvent]]) -> None:
    """A process killed mid-run (its -wal holds commits, so the resumer reads on a connection
    that cannot write until it writes): the resume still goes on from the snapshot, whose index
    was created before the first snapshot was committed."""
    import multiprocessing

    _, want, _ = baseline
    url = _url(tmp_path)
    proc = multiprocessing.get_context("fork").Process(target=_killed_child, args=(url, "model.K2:120"))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -9
    assert Path(url.removeprefix("sqlite:///") + "-wal").stat().st_size > 0
    spy = TailSpy()
    monkeypatch.setattr(_snapshots, "tail_open", spy)
    world = World(TURNS)
    gateway = world.gateway()
    assert asyncio.run(drive(world, url, "r", gateway)).output == "done"
    assert spy.used == [True]
    assert bodies(gateway) == want[119:]  # turn 119's request sent again (its answer was lost), none other


def _unchained(payload: dict[str, Any]) -> dict[str, Any]:
    """A payload without the chain head a snapshot's base records: each row's digest key is random
    (issue 35), so two journals of the same steps chain to other hashes."""
    base = payload.get("base")
    if not isinstance(base, dict) or "last_hash" not in base:
        return payload
    return {**payload, "base": {k: v for k, v in base.items() if k != "last_hash"}}
