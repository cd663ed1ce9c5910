"""``Agent(output_type=...)``: the final answer must validate; a failing one is a rejected response."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pydantic
import pytest

from cuaderno import Agent, Budgets, ScriptedGateway, Session, SqliteCheckpointer, UsageError, tool
from cuaderno.testing.records import read_records


class Invoice(pydantic.BaseModel):
    customer: str
    total: int


VALID = '{"customer": "ana", "total": 12}'
FENCED = 'Here it is:\n```json\n{"customer": "ana", "total": 12}\n```'
INVALID = '{"customer": "ana", "total": "twelve"}'


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


def test_a_valid_answer_is_the_model_instance_and_the_journal_stores_the_json(store: Any) -> None:
    agent = Agent(instructions="i", output_type=Invoice)
    result = agent.run_sync("t", session=Session("r", ScriptedGateway([ScriptedGateway.text(FENCED)]), store))
    assert result.status == "completed" and result.output == Invoice(customer="ana", total=12)
    assert result.text == FENCED
    assert store.checkpoint("r").outcome["data"] == {"customer": "ana", "total": 12}
    assert store.checkpoint("r").count("rejected_responses") == 0


def test_invalid_then_valid_is_repaired_counted_and_told_why(store: Any) -> None:
    agent = Agent(instructions="i", output_type=Invoice)
    gw = ScriptedGateway([ScriptedGateway.text(INVALID), ScriptedGateway.text(VALID)])
    result = agent.run_sync("t", session=Session("r", gw, store))
    assert result.status == "completed" and result.output == Invoice(customer="ana", total=12)
    assert result.checkpoint is not None and result.checkpoint.count("rejected_responses") == 1
    assert gw.billed == 2
    retry = gw.requests[1].messages
    assert retry[-2]["role"] == "assistant" and retry[-2]["content"] == INVALID
    assert retry[-1]["role"] == "user" and "total" in retry[-1]["content"] and "not a valid Invoice" in retry[-1]["content"]
    rejected = [e for e in store.load("r") if e.kind == "model" and e.phase == "result"][0]
    assert rejected.payload["verdict"]["outcome"] == "invalid_output" and "output" not in rejected.payload

    # A resume of the completed run replays the journaled value: nothing is paid or validated again.
    again = agent.run_sync("t", session=Session("r", ScriptedGateway([]), store))
    assert again.replayed and again.output == Invoice(customer="ana", total=12)


def test_replay_uses_the_recorded_verdict_not_a_new_validation(store: Any, monkeypatch: Any) -> None:
    from cuaderno.durable import model_call as _model_steps

    agent = Agent(instructions="i", output_type=Invoice, tools=[_noop])
    gw = ScriptedGateway([ScriptedGateway.text(INVALID), ScriptedGateway.call("noop"), ScriptedGateway.text(VALID)])
    steps = agent.run("t", session=Session("r", gw, store))

    async def two_steps() -> None:
        async for step in steps:
            if type(step).__name__ == "ToolStep":
                break
        await steps.aclose()  # type: ignore[attr-defined]

    asyncio.run(two_steps())

    def no_validation(*_: Any) -> Any:
        raise AssertionError("a replayed answer was validated again")

    # The tool step is shown once the next intent committed: by then turn 2 was answered, and
    # stopping committed its result. The resume replays all three turns and writes the final.
    assert store.checkpoint("r").count("model_calls") == 3 and store.checkpoint("r").status == "running"
    monkeypatch.setattr(_model_steps, "check_output", no_validation)
    result = agent.run_sync("t", session=Session("r", gw, store))
    assert result.status == "completed" and result.output == Invoice(customer="ana", total=12)
    cp = store.checkpoint("r")
    assert cp.count("rejected_responses") == 1 and cp.count("model_calls") == 3 and gw.billed == 3


@tool
def _noop() -> str:
    """Do nothing."""
    return "ok"


def test_invalid_forever_is_bounded_failed_and_counted(store: Any) -> None:
    agent = Agent(instructions="i", output_type=Invoice, budgets=Budgets(rejected_responses=2), max_turns=20)
    gw = ScriptedGateway([ScriptedGateway.text(INVALID)])
    result = agent.run_sync("t", session=Session("r", gw, store))
    assert result.status == "failed" and result.output is None
    assert result.outcome is not None and result.outcome["budget"] == "rejected_responses"
    assert result.checkpoint is not None and result.checkpoint.count("rejected_responses") == 3
    assert gw.billed == 3, "past the cap the model was asked again"


def test_output_type_must_be_a_pydantic_model() -> None:
    with pytest.raises(UsageError, match="output_type"):
        Agent(instructions="i", output_type=dict)  # type: ignore[arg-type]


def test_output_type_is_part_of_the_agent_version() -> None:
    assert Agent(instructions="i").versions() != Agent(instructions="i", output_type=Invoice).versions()


CHILD = textwrap.dedent("""
    import sys, pydantic
    from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer

    class Invoice(pydantic.BaseModel):
        customer: str
        total: int

    db, billing = sys.argv[1], sys.argv[2]
    gw = ScriptedGateway([ScriptedGateway.text('{"customer": "ana", "total": "twelve"}'),
                          ScriptedGateway.text('{"customer": "ana", "total": 12}')], billing_log=billing)
    store = SqliteCheckpointer(db)
    result = Agent(instructions="i", output_type=Invoice).run_sync("t", session=Session("run", gw, store))
    print(result.status, result.output.total, result.checkpoint.count("rejected_responses"))
    store.close()
""")


def _child(db: Path, billing: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at is not None:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-c", CHILD, str(db), str(billing)], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("crash_at", ["model.K7:1", "model.K2:2"])
def test_killed_after_the_invalid_answer_was_journaled(tmp_path: Path, crash_at: str) -> None:
    db, billing = tmp_path / "runs.db", tmp_path / "billing.jsonl"
    killed = _child(db, billing, crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(read_records(billing)) == 1
    store = SqliteCheckpointer(db)
    try:
        cp = store.checkpoint("run")
        assert cp is not None and cp.count("rejected_responses") == 1 and cp.status == "running"
    finally:
        store.close()

    resumed = _child(db, billing, None)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split() == ["completed", "12", "1"], "the invalid answer was counted twice"
    paid = read_records(billing)
    assert len(paid) == 2 and len({r["key"] for r in paid}) == 2, "the journaled invalid answer was paid again"
