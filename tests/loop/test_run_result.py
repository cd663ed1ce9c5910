"""``run_to_end`` / ``run_sync``: one call, a RunResult that says how the run stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cuaderno import (
    Agent,
    Budgets,
    ErrorClass,
    FinalStep,
    ModelResponse,
    Policy,
    RunResult,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolContext,
    ToolError,
    Usage,
    UsageError,
    approve,
    cancel,
    tool,
)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


@tool
def send(to: str) -> str:
    """Send a message."""
    return f"sent to {to}"


def test_run_to_end_returns_output_usage_cost_steps_and_checkpoint(store: Any) -> None:
    agent = Agent(instructions="i", tools=[send])
    gw = ScriptedGateway([ScriptedGateway.call("send", to="ana"), ScriptedGateway.text("done")], cost=0.25)
    result = asyncio.run(agent.run_to_end("t", session=Session("r", gw, store)))
    assert isinstance(result, RunResult)
    assert result.status == "completed" and result.completed and result.output == "done" and result.text == "done"
    assert result.usage.input_tokens == 20 and result.usage.output_tokens == 10 and result.usage.total_tokens == 30
    assert result.cost_usd == 0.5 and result.unpriced_calls == 0
    assert [type(s).__name__ for s in result.steps] == ["ModelStep", "ToolStep", "ModelStep", "FinalStep"]
    assert result.checkpoint is not None and result.checkpoint.status == "completed"
    assert not result.replayed

    again = asyncio.run(agent.run_to_end("t", session=Session("r", gw, store)))
    assert again.replayed and again.output == "done" and gw.billed == 2, "the closed run was paid again"
    assert [type(s) for s in again.steps] == [FinalStep]


def test_unpriced_calls_are_counted_not_free(store: Any) -> None:
    agent = Agent(instructions="i")
    gw = ScriptedGateway([ModelResponse(text="ok", finish_reason="stop", usage=Usage(input_tokens=3))], cost=None)
    result = asyncio.run(agent.run_to_end("t", session=Session("r", gw, store)))
    assert result.status == "completed" and result.unpriced_calls == 1 and result.cost_usd == 0.0


def test_a_suspended_run_returns_its_pending_approvals(store: Any) -> None:
    agent = Agent(instructions="i", tools=[send], policy=Policy({"send": "require_approval"}))
    gw = ScriptedGateway([ScriptedGateway.call("send", to="ana"), ScriptedGateway.text("done")])
    result = asyncio.run(agent.run_to_end("t", session=Session("r", gw, store)))
    assert result.status == "suspended" and result.output is None
    [(step_id, pending)] = result.pending.items()
    assert pending["tool"] == "send" and pending["arguments"] == {"to": "ana"}
    approve(store, "r", step_id, approver="ops")
    done = asyncio.run(agent.run_to_end("t", session=Session("r", gw, store)))
    assert done.status == "completed" and done.output == "done" and not done.pending


def test_needs_human_returns_the_evidence(store: Any) -> None:
    @tool
    def charge(amount: int) -> str:
        """Charge (the answer was lost)."""
        raise ToolError("timed out after sending", error_class=ErrorClass.AMBIGUOUS, sent=True)

    agent = Agent(instructions="i", tools=[charge])
    gw = ScriptedGateway([ScriptedGateway.call("charge", amount=5), ScriptedGateway.text("done")])
    result = asyncio.run(agent.run_to_end("t", session=Session("r", gw, store)))
    assert result.status == "needs_human" and result.output is None
    [evidence] = result.uncertain.values()
    assert evidence["tool"] == "charge" and evidence["effect_key"]


def test_failed_and_cancelled_runs_are_results_not_exceptions(store: Any) -> None:
    agent = Agent(instructions="i", budgets=Budgets(rejected_responses=1))
    gw = ScriptedGateway([ScriptedGateway.empty()] * 5)
    failed = asyncio.run(agent.run_to_end("t", session=Session("r", gw, store)))
    assert failed.status == "failed" and failed.outcome is not None and failed.outcome["budget"] == "rejected_responses"
    assert asyncio.run(agent.run_to_end("t", session=Session("r", gw, store))).status == "failed"

    @tool
    def slow(ctx: ToolContext) -> str:
        """Cancelled from outside while it runs."""
        cancel(store, ctx.run_id, "stop", by="test")
        return "ok"

    agent2 = Agent(instructions="i", tools=[slow])
    gw2 = ScriptedGateway([ScriptedGateway.call("slow"), ScriptedGateway.text("done")])
    cancelled = asyncio.run(agent2.run_to_end("t", session=Session("c", gw2, store)))
    assert cancelled.status == "cancelled" and cancelled.output is None


def test_run_sync_runs_from_synchronous_code(store: Any) -> None:
    agent = Agent(instructions="i")
    result = agent.run_sync("t", session=Session("r", ScriptedGateway([ScriptedGateway.text("hi")]), store))
    assert result.status == "completed" and result.output == "hi"


def test_run_sync_inside_an_event_loop_is_a_usage_error(store: Any) -> None:
    agent = Agent(instructions="i")
    gw = ScriptedGateway([ScriptedGateway.text("hi")])

    async def inside() -> None:
        with pytest.raises(UsageError, match="await agent.run_to_end"):
            agent.run_sync("t", session=Session("r", gw, store))

    asyncio.run(inside())
    assert store.checkpoint("r") is None and gw.calls == 0, "the refused call still ran something"
