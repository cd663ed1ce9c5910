"""Bad input found by a review: each gets a clear, typed error, and nothing paid for or done is lost."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cuaderno import (
    Agent,
    ApprovalMismatch,
    Compensation,
    ErrorClass,
    FinalStep,
    JournalCorrupt,
    ModelRequest,
    ModelResponse,
    Policy,
    RunClosed,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    StepEvent,
    ToolCall,
    ToolContext,
    ToolError,
    ToolResultInvalid,
    UncertainEffect,
    UsageError,
    approve,
    cancel,
    resolve,
    tool,
)
from cuaderno.cli import app
from cuaderno.gateway._common import parse_tool_call


@tool
def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
    """Move money."""
    return {"ok": True}


async def collect(agent: Agent, task: str, session: Session) -> list[Any]:
    return [step async for step in agent.run(task, session=session)]


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


async def test_a_lone_surrogate_in_what_the_checkpoint_copies_is_stored_exactly(store: Any) -> None:
    gw = ScriptedGateway([ScriptedGateway.text("ok \ud800")])
    steps = await collect(Agent(instructions="x"), "t", Session("final", gw, store))
    assert isinstance(steps[-1], FinalStep) and store.checkpoint("final").outcome["output"] == "ok \ud800"
    agent = Agent(instructions="x", tools=[transfer], policy=Policy({"transfer": "require_approval"}))
    gw = ScriptedGateway([ScriptedGateway.call("transfer", to="a\ud800", amount=1), ScriptedGateway.text("x")])
    await collect(agent, "t", Session("approval", gw, store))
    cp = store.checkpoint("approval")
    assert cp.status == "suspended" and cp.pending["t0000.tool00.approval"]["arguments"]["to"] == "a\ud800"
    assert cancel(store, "approval", "bad \udcff reason").status == "cancelled"


@pytest.mark.parametrize("arguments", ['{"to": "ana", "amount": NaN}', '{"x": ' + "[" * 1000 + "]" * 1000 + "}",
                                       '{"x": ' + "[" * 300 + "]" * 300 + "}", {"amount": float("inf")}],
                         ids=["nan", "deep-1000", "deep-300", "dict-inf"])
def test_arguments_that_are_not_plain_json_are_for_the_model_to_repair(arguments: Any) -> None:
    call = parse_tool_call("c1", "transfer", arguments)
    assert call.arguments == {} and call.arguments_error and call.raw_arguments


async def test_a_paid_response_with_unusable_arguments_is_journaled_once(store: Any) -> None:
    calls = []

    class Custom:
        async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
            calls.append(idempotency_key)
            if len(calls) == 1:  # a gateway that passes NaN on
                return ModelResponse(tool_calls=(ToolCall(id="c", name="transfer",
                                                          arguments={"to": "a", "amount": float("nan")}),))
            return ModelResponse(text="fixed")

    steps = await collect(Agent(instructions="x", tools=[transfer]), "t", Session("nan", Custom(), store))
    assert isinstance(steps[-1], FinalStep) and len(calls) == 2
    result = next(e for e in store.load("nan") if e.step_id == "t0000.tool00" and e.phase == "result")
    assert result.payload["outcome"] == "error" and "(nan)" in result.payload["error"]["message"]
    assert store.checkpoint("nan").count("model_calls") == 2  # the first response was journaled, not lost


def _circular() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("value", [float("nan"), {"x": float("inf")}, 10**5000, object(), _circular(), _deep(3000),
                                   _deep(250)],
                         ids=["nan", "inf", "bigint", "object", "circular", "deep-3000", "deep-250"])
async def test_a_result_json_cannot_hold_ends_the_run_as_a_bug_with_its_evidence(store: Any, value: Any) -> None:
    """Issue 19 item 7a: the caller used to get a plain TypeError or ValueError (pydantic's)."""
    ran: list[int] = []

    @tool
    def pay(to: str) -> Any:
        """Pay."""
        ran.append(1)
        return value

    agent = Agent(instructions="x", tools=[pay])
    script = [ScriptedGateway.call("pay", to="a"), ScriptedGateway.text("x")]
    with pytest.raises(ToolResultInvalid) as caught:
        await collect(agent, "t", Session("r", ScriptedGateway(script), store))
    err = caught.value
    assert isinstance(err, UsageError)
    assert (err.run_id, err.step_id, err.tool) == ("r", "t0000.tool00", "pay")
    assert "'pay'" in str(err) and "'t0000.tool00'" in str(err)
    cp = store.checkpoint("r")
    assert cp.status == "failed" and cp.outcome["reason"] == "bug" and ran == [1]
    # The evidence is journaled whole (the error, the run's end), and nothing of the value.
    result = next(e for e in store.load("r") if e.step_id == "t0000.tool00" and e.phase == "result")
    assert result.payload["outcome"] == "error" and "value" not in result.payload
    assert result.payload["error"]["type"] == "ToolResultInvalid" and "'pay'" in result.payload["error"]["message"]
    with pytest.raises(RunClosed):
        await collect(agent, "t", Session("r", ScriptedGateway(script), store))
    assert ran == [1]


async def test_a_lookup_receipt_the_journal_cannot_hold_leaves_the_effect_uncertain(store: Any) -> None:
    """The effect happened (the lookup found it) but its receipt cannot be journaled: a person settles it.
    Before, the result's write failed with a UsageError naming neither the tool nor why."""
    looked: list[str] = []

    def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        looked.append(ctx.effect_key)
        return {"receipt": float("nan")}

    @tool(lookup=lookup)
    def pay(to: str) -> Any:
        """Pay."""
        raise ToolError("timed out after sending", error_class=ErrorClass.AMBIGUOUS, sent=True)

    agent = Agent(instructions="x", tools=[pay])
    script = [ScriptedGateway.call("pay", to="a"), ScriptedGateway.text("x")]
    with pytest.raises(UncertainEffect) as caught:
        await collect(agent, "t", Session("r", ScriptedGateway(script), store))
    evidence = caught.value.evidence
    assert evidence["reason"] == "lookup failed" and "ToolResultInvalid" in evidence["lookup_error"]
    assert "(nan)" in evidence["lookup_error"] and len(looked) == 1
    cp = store.checkpoint("r")
    assert cp.status == "needs_human" and "t0000.tool00" in cp.uncertain
    assert not any(e.phase == "result" for e in store.load("r") if e.step_id == "t0000.tool00")


async def test_compensation_arguments_the_journal_cannot_hold_do_not_lose_the_result(store: Any) -> None:
    """The tool ran; a compensation whose arguments hold a NaN is recorded as unusable, and the result
    is journaled. Before, the result's write failed (UsageError) after the effect happened."""
    @tool
    def undo(to: str) -> Any:
        """Undo."""
        return {"ok": True}

    @tool(compensation=Compensation("undo", lambda arguments, value: {"to": float("nan")}))
    def pay(to: str) -> Any:
        """Pay."""
        return {"receipt": "r-1"}

    agent = Agent(instructions="x", tools=[pay, undo])
    script = [ScriptedGateway.call("pay", to="a"), ScriptedGateway.text("x")]
    steps = await collect(agent, "t", Session("r", ScriptedGateway(script), store))
    assert isinstance(steps[-1], FinalStep)
    result = next(e for e in store.load("r") if e.step_id == "t0000.tool00" and e.phase == "result")
    assert result.payload["value"] == {"receipt": "r-1"}
    compensation = result.payload["compensation"]
    assert compensation["arguments"] is None and "(nan)" in compensation["error"]


def test_the_cli_never_changes_a_file_that_is_not_a_journal(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (x)")
    before = path.read_bytes()
    result = CliRunner().invoke(app, ["--db", str(path), "list"])
    assert result.exit_code == 4 and "not a cuaderno journal" in result.output
    assert path.read_bytes() == before and not Path(str(path) + "-wal").exists()


async def test_harness_input_is_checked_before_anything_is_written(store: Any) -> None:
    agent = Agent(instructions="x", tools=[transfer], policy=Policy({"transfer": "require_approval"}))
    gw = ScriptedGateway([ScriptedGateway.call("transfer", to="a", amount=1), ScriptedGateway.text("x")])
    await collect(agent, "t", Session("w", gw, store))
    epoch = store.checkpoint("w").epoch
    with pytest.raises(UsageError):
        cancel(store, "w", "r", by=object())  # type: ignore[arg-type]
    assert store.checkpoint("w").epoch == epoch and store.checkpoint("w").status == "suspended"
    with pytest.raises(UsageError):
        resolve(store, "w", "t0000.tool00", happened="no")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="happened=True"):  # a receipt says it happened: never "send it again"
        resolve(store, "w", "t0000.tool00", happened=False, result={"receipt": "r-1"})
    store._db.execute("UPDATE cuaderno_events SET payload=? WHERE run_id='w' AND seq=2", (b'{"x":1}',))
    rows = len(store._db.execute("SELECT * FROM cuaderno_events").fetchall())
    with pytest.raises(JournalCorrupt):  # a broken hash chain is left as it was found
        approve(store, "w", "t0000.tool00")
    assert len(store._db.execute("SELECT * FROM cuaderno_events").fetchall()) == rows


def test_construction_errors_are_usage_errors(tmp_path: Path) -> None:
    def plain(x: int) -> int:
        return x

    for make in (lambda: Agent(instructions="x", tools=[plain]),  # type: ignore[list-item]
                 lambda: Agent(instructions="x", tools=transfer),  # type: ignore[arg-type]
                 lambda: Agent(instructions="x", max_turns="3"),  # type: ignore[arg-type]
                 lambda: Agent(instructions="x", tools=[transfer], policy=Policy({"transfr": "require_approval"})),
                 lambda: Policy(["transfer"]),  # type: ignore[arg-type]
                 lambda: Policy(version=None),  # type: ignore[arg-type]
                 lambda: SqliteCheckpointer(None),  # type: ignore[arg-type]
                 lambda: SqliteCheckpointer(tmp_path / "x.db", busy_timeout_ms="x")):  # type: ignore[arg-type]
        with pytest.raises(UsageError):
            make()
    assert not Path("None").exists()
    with pytest.raises(UsageError):
        Session("r", ScriptedGateway([]), None)  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        approve("runs.db", "r", "t0000.tool00")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        Agent(instructions="x").run(b"task", session=Session("r", ScriptedGateway([]), SqliteCheckpointer(":memory:")))  # type: ignore[arg-type]


def test_journal_reads_with_odd_arguments(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = SqliteCheckpointer(path)
    store.append([StepEvent(run_id="susp", step_id="run", phase="start", kind="run", payload={})])
    assert [cp.run_id for cp in store.list_runs(limit=2**70)] == ["susp"]
    with pytest.raises(UsageError):
        store.list_runs(limit="5")  # type: ignore[arg-type]
    assert store.checkpoint(type("S", (str,), {})("susp")) is not None  # a str subclass names the same run
    store._db.execute("UPDATE cuaderno_meta SET value='two' WHERE key='schema_version'")
    store.close()
    with pytest.raises(UsageError):
        store.checkpoint("susp")  # closed: a usage error, not damage
    with pytest.raises(JournalCorrupt):
        SqliteCheckpointer(path)


async def test_reasonable_values_are_still_accepted(store: Any) -> None:
    deep: Any = "leaf"
    for _ in range(150):
        deep = [deep]

    @tool
    def nested(depth: int) -> Any:
        """A deeply nested but ordinary result."""
        return deep

    registry = {"nested": nested, "transfer": transfer}
    agent = Agent(instructions="x", tools=registry.values())  # any iterable of tools
    gw = ScriptedGateway([ScriptedGateway.call("nested", depth=150), ScriptedGateway.text("ok")])
    steps = await collect(agent, "t", Session("deep", gw, store))
    assert isinstance(steps[-1], FinalStep)
    assert parse_tool_call("c", "nested", '{"x": ' + "[" * 150 + "]" * 150 + "}").arguments_error is None


@tool
def lost(to: str) -> str:
    """A call whose reply never came back."""
    raise ToolError("reply lost", error_class=ErrorClass.AMBIGUOUS, sent=True)


async def needs_human(store: Any, run_id: str = "uh") -> int:
    """A run stopped on an uncertain effect at t0000.tool00; the number of its events."""
    gw = ScriptedGateway([ScriptedGateway.call("lost", to="x"), ScriptedGateway.text("ok")])
    with pytest.raises(UncertainEffect):
        await collect(Agent(instructions="x", tools=[lost]), "t", Session(run_id, gw, store))
    assert store.checkpoint(run_id).status == "needs_human"
    return len(store.load(run_id))


async def test_resolve_and_cancel_check_their_arguments_as_approve_does(store: Any) -> None:
    size = await needs_human(store)
    for bad, match in (
        (lambda: resolve(store, "uh", ["t0000.tool00"], happened=True), "step_id must be a string, got list"),  # type: ignore[arg-type]
        (lambda: resolve(store, "uh", None, happened=True), "step_id"),  # type: ignore[arg-type]
        (lambda: resolve(None, "uh", "t0000.tool00", happened=True), "store must be a Checkpointer"),  # type: ignore[arg-type]
        (lambda: resolve(store, "uh", "t0000.tool00", happened=True, by=5), "by must be a string, got int"),  # type: ignore[arg-type]
        (lambda: resolve(store, "uh", "t0000.tool00", happened=False, note=object()), "note must be a string"),  # type: ignore[arg-type]
        (lambda: cancel(None, "uh", "r"), "store must be a Checkpointer"),  # type: ignore[arg-type]
        (lambda: cancel(store, "uh", "r", by=3), "by must be a string, got int"),  # type: ignore[arg-type]
    ):
        with pytest.raises(UsageError, match=match):
            bad()
    assert len(store.load("uh")) == size and store.checkpoint("uh").status == "needs_human"


async def test_a_resolved_receipt_is_returned_exactly_as_journaled(store: Any) -> None:
    """It was returned with its integer keys and journaled with string keys: two receipts."""
    size = await needs_human(store)
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    for bad in (float("nan"), {"x": 10**5000}, object(), deep):
        with pytest.raises(UsageError, match="result is not plain JSON"):
            resolve(store, "uh", "t0000.tool00", happened=True, result=bad)
    assert len(store.load("uh")) == size
    event = resolve(store, "uh", "t0000.tool00", happened=True, result={1: "a", "lines": (1, 2)})
    journaled = store.load("uh")[-1]
    assert journaled.seq == event.seq and journaled.payload["value"] == {"1": "a", "lines": [1, 2]}
    assert event.payload == journaled.payload


async def test_a_run_waiting_for_a_person_is_not_said_to_have_ended(store: Any) -> None:
    await needs_human(store)
    with pytest.raises(RunClosed) as refused:
        approve(store, "uh", "t0000.tool00")
    assert "already ended" not in str(refused.value) and "has not ended" in str(refused.value)
    assert "cuaderno resolve" in str(refused.value)
    assert str(RunClosed("r", "completed")) == "run 'r' already ended (completed)"


def test_an_empty_fingerprint_through_the_api_is_called_empty(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "j.db")
    try:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", payload={})])
        store.append([StepEvent(run_id="r", step_id="t0000.tool00.approval", phase="request", kind="approval",
                                name="transfer", decision="require_approval", fingerprint="f" * 64,
                                payload={"tool_step": "t0000.tool00", "arguments": {}})])
        with pytest.raises(ApprovalMismatch, match="the fingerprint given is empty"):
            approve(store, "r", "t0000.tool00", fingerprint="")
        assert len(store.load("r")) == 2
    finally:
        store.close()
