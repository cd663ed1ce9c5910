"""Fork a run at a step and export a journal: counted from records cuaderno does not write (the
fake provider's billing log, the tools' own lists of what they did)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cuaderno import Agent, Policy, ScriptedGateway, Session, SqliteCheckpointer, StepEvent, ToolContext, approve, tool
from cuaderno.cli import app
from cuaderno.errors import RunNotFound, UsageError
from cuaderno.forks import export_lines, fork
from cuaderno.testing.records import read_records

DONE: list[tuple[str, str]] = []
"""(tool, effect key) of every tool body that ran: the receiving systems' own record."""


@tool(idempotent=True)
def read_file(path: str, ctx: ToolContext) -> str:
    """Read a file."""
    DONE.append(("read_file", ctx.effect_key))
    return f"contents of {path}"


@tool
def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
    """Move money."""
    DONE.append(("transfer", ctx.effect_key))
    return {"paid": amount, "to": to}


AGENT = Agent(instructions="Pay what is asked.", tools=[read_file, transfer],
              policy=Policy({"transfer": "require_approval"}, version="2026-12"))
TASK = "pay ana 100"


def gateway(billing: Path) -> ScriptedGateway:
    return ScriptedGateway([ScriptedGateway.call("read_file", path="invoice.txt", cost=0.002),
                            ScriptedGateway.call("transfer", to="ana", amount=100, cost=0.003),
                            ScriptedGateway.text("Paid.", cost=0.001)], billing_log=billing)


def run(db: Path, run_id: str, billing: Path) -> str:
    async def go() -> None:
        with SqliteCheckpointer(db) as store:
            async for _ in AGENT.run(TASK, session=Session(run_id, gateway(billing), store)):
                pass

    asyncio.run(go())
    with SqliteCheckpointer(db) as store:
        cp = store.checkpoint(run_id)
    assert cp is not None
    return cp.status


def run_to_the_end(db: Path, run_id: str, billing: Path) -> None:
    assert run(db, run_id, billing) == "suspended"
    with SqliteCheckpointer(db) as store:
        approve(store, run_id, "t0001.tool00", approver="ana")
    assert run(db, run_id, billing) == "completed"


@pytest.fixture
def original(tmp_path: Path) -> Path:
    DONE.clear()
    db = tmp_path / "runs.db"
    run_to_the_end(db, "orig", tmp_path / "billing-orig.jsonl")
    assert len(read_records(tmp_path / "billing-orig.jsonl")) == 3
    assert [name for name, _ in DONE] == ["read_file", "transfer"]
    return db


def test_a_fork_replays_up_to_its_step_without_paying_or_running_anything_again(original: Path,
                                                                               tmp_path: Path) -> None:
    orig_keys = dict(DONE)
    DONE.clear()
    with SqliteCheckpointer(original) as store:
        cp = fork(store, "orig", at="t0001.model", new_run_id="fork-1")
        assert cp.status == "running" and cp.count("model_calls") == 1 and cp.count("tool_calls") == 1
        start = store.load("fork-1")[0]
        assert start.payload["forked_from"] == {"run_id": "orig", "at": "t0001.model", "seq": 5}

    billing = tmp_path / "billing-fork.jsonl"
    run_to_the_end(original, "fork-1", billing)
    # The provider billed only the turns from the fork point on (turns 1 and 2): turn 0's call,
    # journaled before the fork point, was not paid again.
    billed = read_records(billing)
    assert len(billed) == 2
    # read_file (before the fork point) did not run again; the transfer (after it) ran once, under
    # a key of the fork's own, so the bank never takes it for the original's transfer.
    assert [name for name, _ in DONE] == ["transfer"]
    assert DONE[0][1] != orig_keys["transfer"]
    with SqliteCheckpointer(original) as store:
        fork_cp, orig_cp = store.checkpoint("fork-1"), store.checkpoint("orig")
    assert fork_cp is not None and orig_cp is not None and orig_cp.status == "completed"
    assert fork_cp.count("model_calls") == 3 and fork_cp.count("tool_calls") == 2


def test_a_fork_after_the_effect_keeps_it_and_pays_only_the_last_turn(original: Path, tmp_path: Path) -> None:
    DONE.clear()
    with SqliteCheckpointer(original) as store:
        fork(store, "orig", at="t0002.model", new_run_id="fork-2")
    billing = tmp_path / "billing-fork-2.jsonl"
    assert run(original, "fork-2", billing) == "completed"  # approved in the original: no person asked again
    assert len(read_records(billing)) == 1 and DONE == []  # turns 0 and 1 not paid; no tool ran again


@pytest.mark.parametrize(("at", "needle"), [
    ("t0009.model", "has no step 't0009.model'"),
    ("run", "cannot fork at 'run'"),
])
def test_a_fork_point_that_does_not_exist_is_refused(original: Path, at: str, needle: str) -> None:
    with SqliteCheckpointer(original) as store, pytest.raises(UsageError, match=needle):
        fork(store, "orig", at=at, new_run_id="fork-x")
    with SqliteCheckpointer(original) as store:
        assert store.checkpoint("fork-x") is None


def ev(step: str, phase: str, kind: str, **kw: Any) -> StepEvent:
    return StepEvent(run_id="h", step_id=step, phase=phase, kind=kind, **kw)


@pytest.mark.parametrize(("events", "at", "needle"), [
    # Two tool calls of one turn in flight together: at the second, the first had no result yet.
    ([ev("t0000.tool00", "intent", "tool", name="a", payload={"effect_key": "k0"}),
      ev("t0000.tool01", "intent", "tool", name="a", payload={"effect_key": "k1"}),
      ev("t0000.tool01", "result", "tool", name="a", payload={"outcome": "ok", "value": 1}),
      ev("t0000.tool00", "result", "tool", name="a", payload={"outcome": "ok", "value": 0})],
     "t0000.tool01", "step 't0000.tool00' was in flight"),
    # A person was asked and had not answered yet at that point.
    ([ev("t0000.tool00.approval", "request", "approval", name="a", fingerprint="fp",
         payload={"tool_step": "t0000.tool00", "arguments": {}}),
      ev("t0000.tool00.approval", "decision", "approval", name="a", decision="approved", fingerprint="fp",
         payload={"tool_step": "t0000.tool00"}),
      ev("t0001.model", "intent", "model", payload={})],
     "t0000.tool00.approval", None),
])
def test_a_point_with_something_in_flight_or_waiting_is_refused(tmp_path: Path, events: list[StepEvent], at: str,
                                                                 needle: str | None) -> None:
    with SqliteCheckpointer(tmp_path / "h.db") as store:
        store.append([ev("run", "start", "run", fingerprint="f", payload={"task": "t", "versions": {}})])
        for event in events:
            store.append([event])
        if needle is None:  # forking at the approval itself: the request is done anew, fine
            assert fork(store, "h", at=at, new_run_id="h2").status == "running"
            return
        with pytest.raises(UsageError, match=needle):
            fork(store, "h", at=at, new_run_id="h2")
        assert store.checkpoint("h2") is None


def test_a_point_where_a_person_was_waiting_is_refused(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "w.db") as store:
        store.append([ev("run", "start", "run", fingerprint="f", payload={"task": "t", "versions": {}})])
        store.append([ev("t0000.tool00.approval", "request", "approval", name="a", fingerprint="fp",
                         payload={"tool_step": "t0000.tool00", "arguments": {}})])
        store.append([ev("side.model", "intent", "model", payload={})])
        with pytest.raises(UsageError, match="waiting for 't0000.tool00.approval'"):
            fork(store, "h", at="side.model", new_run_id="h2")
        assert store.checkpoint("h2") is None


def test_an_existing_new_run_id_is_refused(original: Path) -> None:
    with SqliteCheckpointer(original) as store:
        fork(store, "orig", at="t0001.model", new_run_id="f")
        events = store.load("f")
        with pytest.raises(UsageError, match="already exists"):
            fork(store, "orig", at="t0002.model", new_run_id="f")
        with pytest.raises(UsageError, match="new run id"):
            fork(store, "orig", at="t0002.model", new_run_id="orig")
        with pytest.raises(RunNotFound):
            fork(store, "nope", at="t0002.model", new_run_id="g")
        assert store.load("f") == events


def test_export_writes_every_event_as_a_json_line(original: Path) -> None:
    with SqliteCheckpointer(original) as store:
        lines = list(export_lines(store, "orig"))
        events = store.load("orig")
    records = [json.loads(line) for line in lines]
    assert [r["seq"] for r in records] == list(range(1, len(events) + 1))
    assert records[-1]["row_hash"] == events[-1].row_hash
    assert records[0]["payload"]["task"] == TASK


def test_the_command_line(original: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["--db", str(original), "fork", "orig", "--at", "t0001.model", "--as", "fork-cli"])
    assert out.exit_code == 0, out.output
    assert "fork-cli" in out.stdout and "5 events copied (1 model call, 1 tool call" in out.stdout
    again = runner.invoke(app, ["--db", str(original), "fork", "orig", "--at", "t0001.model", "--as", "fork-cli"])
    assert again.exit_code == 2 and again.stderr.startswith("error: ") and "already exists" in again.stderr
    exported = runner.invoke(app, ["--db", str(original), "export", "orig"])
    assert exported.exit_code == 0
    assert [json.loads(line)["seq"] for line in exported.stdout.splitlines()][:3] == [1, 2, 3]
    target = tmp_path / "orig.jsonl"
    assert runner.invoke(app, ["--db", str(original), "export", "orig", "--output", str(target)]).exit_code == 0
    assert target.read_text() == exported.stdout
    refused = runner.invoke(app, ["--db", str(original), "export", "orig", "--output", str(target)])
    assert refused.exit_code == 4 and "exists" in refused.stderr
    missing = runner.invoke(app, ["--db", str(original), "export", "nope"])
    assert missing.exit_code == 3 and "no run 'nope'" in missing.stderr


def test_the_page_says_where_a_fork_came_from(original: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from cuaderno.ui.app import create_app

    with SqliteCheckpointer(original) as store:
        fork(store, "orig", at="t0001.model", new_run_id="fork-page")
    with TestClient(create_app(original, allowed_hosts=["testserver"])) as client:
        page = client.get("/run", params={"id": "fork-page"}).text
    assert 'forked from</dt><dd><a href="/run?id=orig">orig</a> at <span class="mono">t0001.model</span>' in page


def test_export_keeps_unicode_readable_and_escapes_a_lone_surrogate(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "u.db") as store:
        store.append([StepEvent(run_id="u", step_id="run", phase="start", kind="run", fingerprint="f",
                                payload={"task": "pagar a Añá", "versions": {}})])
        store.append([StepEvent(run_id="u", step_id="final", phase="result", kind="final",
                                payload={"output": "half a pair: \ud800"})])
        lines = list(export_lines(store, "u"))
    assert "Añá" in lines[0]  # readable as it is
    assert lines[1].isascii() and json.loads(lines[1])["payload"]["output"] == "half a pair: \ud800"
