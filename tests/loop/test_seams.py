"""The seams a durable-execution engine plugs into (issue 20, part 0): the runtime (clock,
random source, sleep, owner), ownership, the tool executor and the model caller. Each test
replaces one seam and shows the unchanged runner goes through it."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cuaderno import (
    Agent,
    ErrorClass,
    GatewayError,
    ModelRequest,
    ModelResponse,
    Policy,
    RunBusy,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolContext,
    ToolError,
    tool,
)
from cuaderno.cancellation import request_cancel, wait_for_holder
from cuaderno.loop.executor import ToolInfo
from cuaderno.loop.ownership import ProcessOwnership
from cuaderno.loop.runtime import Runtime
from cuaderno.testing.records import read_records


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteCheckpointer]:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


class Midpoint(random.Random):
    """A random source whose every uniform draw is the middle of its range."""

    def uniform(self, a: float, b: float) -> float:
        return (a + b) / 2


class FakeRuntime(Runtime):
    """A workflow's runtime in miniature: its own clock that only moves when it sleeps, its own
    random source, its own owner name; no thread, pid or wall clock."""

    def __init__(self) -> None:
        super().__init__()
        self.random = Midpoint()
        self.slept: list[float] = []
        self.clock = 1000.0

    def now(self) -> float:
        return self.clock

    def monotonic(self) -> float:
        return self.clock

    async def sleep(self, seconds: float) -> None:
        self.block(seconds)

    def block(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock += seconds

    def owner(self) -> str:
        return "workflow wf-1"

    def process(self) -> int:
        return 1

    def thread(self) -> int:
        return 1


class Refusing:
    """A provider that refuses the first two sends (429, nothing sent), then answers."""

    def __init__(self, script: list[ModelResponse]) -> None:
        self.inner = ScriptedGateway(script)
        self.refusals = 2

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        if self.refusals:
            self.refusals -= 1
            raise GatewayError("429", error_class=ErrorClass.TRANSIENT, sent=False)
        return await self.inner.complete(request, idempotency_key=idempotency_key)


async def test_the_runtime_decides_every_wait_and_names_the_owner(store: SqliteCheckpointer) -> None:
    """Backoff is drawn from the runtime's random source and waited on its sleep, so a run under
    a replayable runtime waits the same on every replay; the owner is the runtime's."""
    runtime = FakeRuntime()
    agent = Agent(instructions="i")
    session = Session("rt", Refusing([ScriptedGateway.text("done")]), store, runtime=runtime)
    steps = [step async for step in agent.run("t", session=session)]
    assert steps[-1].output == "done"  # type: ignore[union-attr]
    assert runtime.slept == [0.25, 0.5]  # RetryPolicy: uniform(0, 0.5), then uniform(0, 1.0)
    assert session.owner == "workflow wf-1"
    assert store.checkpoint("rt").count("retries") == 2  # type: ignore[union-attr]


class Recording(ProcessOwnership):
    """The process's ownership, noting what the loop asks of it."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self.calls: list[str] = []

    def start(self, where: Any, loop: Any, *, force: bool) -> None:
        self.calls.append("start")
        super().start(where, loop, force=force)

    def pause(self, where: Any, loop: Any) -> None:
        self.calls.append("pause")
        super().pause(where, loop)

    def resume(self, where: Any, loop: Any) -> bool:
        self.calls.append("resume")
        return super().resume(where, loop)

    def stop(self, where: Any, loop: Any) -> None:
        self.calls.append("stop")
        super().stop(where, loop)

    def release(self, store: Any, run_id: str, epoch: int) -> None:
        self.calls.append("release")
        super().release(store, run_id, epoch)


async def test_the_loop_holds_its_run_through_the_sessions_ownership(store: SqliteCheckpointer) -> None:
    own = Recording(FakeRuntime())
    agent = Agent(instructions="i")
    session = Session("own", ScriptedGateway([ScriptedGateway.text("done")]), store, ownership=own)
    [_ async for _ in agent.run("t", session=session)]
    # Two steps yielded (the model turn, the answer); the run released as the loop ended.
    assert own.calls == ["start", "pause", "resume", "pause", "resume", "release", "resume", "stop"]


class NeverLetsGo(ProcessOwnership):
    """A holder that never lets the run go."""

    def start(self, where: Any, loop: Any, *, force: bool) -> None:
        raise RunBusy(where[1], "held for ever")


async def test_waiting_for_the_holder_runs_on_the_runtimes_clock(store: SqliteCheckpointer) -> None:
    """wait_for_holder gives up on the runtime's clock (a workflow's timer would do), not the
    process's: here the fake clock runs past the deadline without any real wait."""
    @tool
    def transfer(to: str) -> str:
        """Move money."""
        return "moved"

    agent = Agent(instructions="i", tools=[transfer], policy=Policy({"transfer": "require_approval"}))
    session = Session("held", ScriptedGateway([ScriptedGateway.call("transfer", to="a")]), store)
    [_ async for _ in agent.run("t", session=session)]
    runtime = FakeRuntime()
    held = NeverLetsGo(runtime)
    asked = request_cancel(store, "held", "stop", by="ops", ownership=held)
    assert asked.status == "suspended" and asked.cancel_requested is not None  # held: only the request
    cp = wait_for_holder(store, "held", runtime=runtime, ownership=held)
    assert cp.status == "suspended" and sum(runtime.slept) > 2.0  # the deadline passed on the fake clock
    assert wait_for_holder(store, "held", runtime=runtime).status == "cancelled"  # let go: closed


class Remote:
    """A tool executor that is not the agent's functions: what a tool activity would be. It
    records what it was given, which must survive a JSON round trip unchanged."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any, dict[str, Any]]] = []

    def _saw(self, what: str, name: str, arguments: dict[str, Any], ctx: ToolContext) -> None:
        context = dataclasses.asdict(ctx)
        assert json.loads(json.dumps([arguments, context])) == [arguments, context]
        self.seen.append((what, name, arguments, context))

    def names(self) -> list[str]:
        return ["transfer"]

    def info(self, name: str) -> ToolInfo | None:
        return ToolInfo(name=name, effect_type=name, idempotent=False, has_lookup=True) if name == "transfer" else None

    def check(self, name: str, arguments: dict[str, Any]) -> None:
        if set(arguments) != {"to", "amount"}:
            raise ToolError("bad arguments", error_class=ErrorClass.INVALID_INPUT)

    def context_data(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"business_id": f"pay-{arguments['to']}"}

    def compensation(self, name: str, arguments: dict[str, Any], value: Any) -> dict[str, Any] | None:
        return None

    async def invoke(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        self._saw("invoke", name, arguments, ctx)
        raise ToolError("reply lost", error_class=ErrorClass.AMBIGUOUS, sent=True)

    async def lookup(self, name: str, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        self._saw("lookup", name, arguments, ctx)
        return {"receipt": ctx.effect_key}


async def test_a_tool_executor_runs_the_tools_by_name_on_plain_data(store: SqliteCheckpointer) -> None:
    """The loop runs a tool and reconciles it only through the session's executor: the agent's
    own function never runs, and the executor gets the name, the model's arguments and a context
    of plain fields; its receipt becomes the step's result."""
    ran: list[str] = []

    @tool
    def transfer(to: str, amount: int) -> str:
        """Move money."""
        ran.append(to)
        return "moved here"

    remote = Remote()
    agent = Agent(instructions="i", tools=[transfer])
    script = [ScriptedGateway.call("transfer", to="a", amount=3), ScriptedGateway.text("done")]
    session = Session("ex", ScriptedGateway(script), store, tools=remote)
    steps = [step async for step in agent.run("t", session=session)]
    assert ran == []
    assert [(what, name, arguments) for what, name, arguments, _ in remote.seen] == [
        ("invoke", "transfer", {"to": "a", "amount": 3}), ("lookup", "transfer", {"to": "a", "amount": 3})]
    invoked, looked_up = remote.seen[0][3], remote.seen[1][3]
    assert invoked["run_id"] == "ex" and invoked["step_id"] == "t0000.tool00" and invoked["attempt"] == 1
    assert invoked["data"] == {"business_id": "pay-a"} and looked_up["effect_key"] == invoked["effect_key"]
    result = next(s for s in steps if getattr(s, "tool", None) == "transfer")
    assert result.result == {"receipt": invoked["effect_key"]}  # type: ignore[union-attr]
    assert store.checkpoint("ex").count("reconciled") == 1  # type: ignore[union-attr]


# -- compensations run through the loop's tool-step machine ---------------------------------------

CHILD = textwrap.dedent('''
    import asyncio, json, sys
    from pathlib import Path
    from cuaderno import (Agent, Compensation, RunCancelled, ScriptedGateway, Session, SqliteCheckpointer,
                          ToolContext, cancel, compensate, tool)
    from cuaderno.testing.records import append_synced, read_records

    db, receipts, action = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    store = SqliteCheckpointer(db)

    @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"], "amount": args["amount"]}))
    def transfer(to: str, amount: int) -> str:
        """Move money."""
        return "moved"

    def find(ctx: ToolContext, arguments: dict) -> object:
        return next((r for r in read_records(receipts) if r["key"] == ctx.effect_key), None)

    @tool(lookup=find)
    def refund(to: str, amount: int, ctx: ToolContext) -> dict:
        """Give money back (not idempotent)."""
        append_synced(receipts, {"key": ctx.effect_key})
        return {"key": ctx.effect_key}

    agent = Agent(instructions="i", tools=[transfer, refund])

    async def main() -> object:
        if action == "run":
            gw = ScriptedGateway([ScriptedGateway.call("transfer", to="a", amount=3), ScriptedGateway.text("x")])
            try:
                async for step in agent.run("t", session=Session("run", gw, store)):
                    if getattr(step, "tool", None) == "transfer":
                        cancel(store, "run", "abort")
            except RunCancelled:
                return "cancelled"
        return await compensate(agent, store, "run")

    print(json.dumps(asyncio.run(main())))
''')


@pytest.mark.parametrize("point", ["tool.K1", "tool.K2", "tool.K6", "tool.K7"])
def test_a_compensation_killed_at_a_tool_steps_crash_point_refunds_once(tmp_path: Path, point: str) -> None:
    """A compensation passes the loop's crash points (it had none). SIGKILLed at each, in a real
    process, the next compensate settles it: one refund in the receiver's own record."""
    (tmp_path / "child.py").write_text(CHILD)
    receipts = tmp_path / "receipts.jsonl"

    def child(action: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
        if crash_at is not None:
            env["CUADERNO_CRASH_AT"] = crash_at
        return subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "runs.db"), str(receipts),
                               action], capture_output=True, text=True, timeout=120, check=False, env=env)

    assert json.loads(child("run").stdout) == "cancelled"
    killed = child("compensate", point)
    assert killed.returncode == -9, killed.stderr
    done = child("compensate")
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(done.stdout)
    assert result["outcome"] == "ok"
    keys = [r["key"] for r in read_records(receipts)]
    assert len(keys) == 1 and result["value"]["key"] == keys[0]  # sent once, or found by the lookup
