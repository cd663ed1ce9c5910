"""The worker in this process: what it claims, what it leaves alone, and what it refuses."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cuaderno import (
    Agent,
    Compensation,
    MemoryCheckpointer,
    Policy,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    UsageError,
    approve,
    cancel,
    deny,
    open_journal,
    tool,
)
from cuaderno.journal._claims import state_of, work_for
from cuaderno.journal.base import SupportsClaims
from cuaderno.worker import Worker

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def _agent(calls: list[str], *, approval: bool = True) -> Agent:
    @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"]}))
    def pay(to: str) -> str:
        """Pay someone."""
        calls.append(f"pay {to}")
        return f"paid {to}"

    @tool
    def refund(to: str) -> str:
        """Give it back."""
        calls.append(f"refund {to}")
        return f"refunded {to}"

    policy = Policy({"pay": "require_approval"}, version="p1") if approval else None
    return Agent(instructions="pay bob", tools=[pay, refund], policy=policy)


def _script() -> ScriptedGateway:
    return ScriptedGateway([ScriptedGateway.call("pay", to="bob"), ScriptedGateway.text("done")])


async def _start(agent: Agent, store: Any, run_id: str) -> str:
    result = await agent.run_to_end("pay bob", session=Session(run_id, _script(), store))
    return result.status


def _worker(store: Any, agent: Agent, **kw: Any) -> Worker:
    return Worker(store, agent, _script, poll_interval=0.01, log=None, **kw)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    schemas: list[str] = []
    if request.param == "postgres":
        from _pg import drop_schemas, new_schema, schema_url, server_or_skip

        server_or_skip()
        schemas.append(new_schema())
        s: Any = open_journal(schema_url(schemas[-1]))
    else:
        s = MemoryCheckpointer() if request.param == "memory" else SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()
    if schemas:
        drop_schemas(schemas)


def test_every_backend_declares_supports_claims(store: Any) -> None:
    assert isinstance(store, SupportsClaims)


def test_a_decided_approval_is_resumed_and_a_pending_one_left_alone(store: Any) -> None:
    calls: list[str] = []
    agent = _agent(calls)
    for run_id in ("approved", "denied", "pending"):
        assert asyncio.run(_start(agent, store, run_id)) == "suspended"
    approve(store, "approved", "t0000.tool00")
    deny(store, "denied", "t0000.tool00")
    # Only what a worker can move on: the run waiting for its approval is not even listed.
    assert {cp.run_id: work_for(cp) for cp in store.open_runs()} == {"approved": "resume", "denied": "resume"}
    stats = _worker(store, agent).run_sync(until_idle=True)
    assert calls == ["pay bob"] and stats.completed == 2 and stats.claimed == 2
    assert {r: store.checkpoint(r).status for r in ("approved", "denied", "pending")} == \
        {"approved": "completed", "denied": "completed", "pending": "suspended"}
    cp = store.checkpoint("pending")
    assert state_of(cp, None)["summary"] == "waits for approval of t0000.tool00.approval (pay)"


def test_a_cancelled_run_gets_its_compensations_run_once(store: Any) -> None:
    calls: list[str] = []
    agent = _agent(calls, approval=False)
    pay_first = ScriptedGateway([ScriptedGateway.call("pay", to="bob"), ScriptedGateway.call("pay", to="amy"),
                                 ScriptedGateway.text("done")])

    async def run_until_first_pay() -> None:
        async for step in agent.run("pay bob", session=Session("c1", pay_first, store)):
            if type(step).__name__ == "ToolStep":
                break

    asyncio.run(run_until_first_pay())
    cp = cancel(store, "c1", "changed my mind")
    assert cp.status in ("cancelled", "running")
    stats = _worker(store, agent).run_sync(until_idle=True)
    assert store.checkpoint("c1").status == "cancelled"
    # The loop closes the cancellation (if cancel could not), then the compensation runs, once.
    assert calls == ["pay bob", "refund bob"], calls
    assert stats.compensated == 1
    again = _worker(store, agent).run_sync(until_idle=True)
    assert calls == ["pay bob", "refund bob"] and again.claimed == 0


def test_a_journal_of_another_agent_definition_is_refused_and_nothing_written(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        assert asyncio.run(_start(_agent([]), store, "r1")) == "suspended"
        approve(store, "r1", "t0000.tool00")
        before = [e.row_hash for e in store.load("r1")]
        other = Agent(instructions="something else", tools=[])
        with pytest.raises(UsageError, match="another agent definition"):
            _worker(store, other).run_sync(until_idle=True)
        assert [e.row_hash for e in store.load("r1")] == before and store.checkpoint("r1").epoch == 1
    finally:
        store.close()


def test_a_run_never_held_is_claimed_only_when_seen_unchanged_twice(store: Any) -> None:
    """Its application may be between its first row and its takeover."""
    from cuaderno.events import StepEvent
    from cuaderno.fingerprint import fingerprint

    agent = _agent([], approval=False)
    store.append([StepEvent(run_id="fresh", step_id="run", phase="start", kind="run", name=agent.name,
                            fingerprint=fingerprint({"task": "pay bob"}),
                            payload={"task": "pay bob", "versions": agent.versions(), "tenant": "default"})])
    worker = _worker(store, agent)

    async def one_look() -> list[str]:
        return [cp.run_id for cp, _ in worker._claimable(store, set(), 4)]

    assert asyncio.run(one_look()) == []
    assert asyncio.run(one_look()) == ["fresh"]
    worker.run_sync(until_idle=True)
    assert store.checkpoint("fresh").status == "completed"


def test_bad_arguments_are_refused() -> None:
    store = MemoryCheckpointer()
    agent = _agent([])
    for kw, match in (({"concurrency": 0}, "concurrency"), ({"poll_interval": 0}, "poll_interval")):
        with pytest.raises(UsageError, match=match):
            Worker(store, agent, _script, **kw)
    with pytest.raises(UsageError, match="Agent"):
        Worker(store, "agent", _script)  # type: ignore[arg-type]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{SRC}:{HERE}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "cuaderno", *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(("args", "code", "says"), [
    (["--agent", "no_such_module:agent"], 2, "does not import"),
    (["--agent", "worker_agent:nothing"], 2, "has no attribute"),
    (["--agent", "worker_agent"], 2, "module:attr"),
    (["--agent", "worker_agent:TURNS"], 2, "not a cuaderno Agent"),
    (["--agent", "worker_agent:agent", "--journal", "nosuch://x"], 2, "nosuch"),
    (["--agent", "worker_agent:agent", "--journal", "missing.db"], 3, "does not exist"),
    (["--agent", "worker_agent:agent", "--journal", "."], 4, "is a directory"),
    (["--agent", "worker_agent:agent", "--journal", "empty.db"], 4, "is an empty file"),
])
def test_cli_bad_input_is_one_error_line(tmp_path: Path, args: list[str], code: int, says: str) -> None:
    SqliteCheckpointer(tmp_path / "runs.db").close()  # the default --db, an empty journal
    (tmp_path / "empty.db").touch()
    done = _cli(tmp_path, "worker", *args)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], done
    assert not re.search(r"\b_[A-Z]\w*", lines[0]), f"an internal class name in the message: {lines[0]}"
    assert not (tmp_path / "missing.db").exists()


def test_cli_refuses_a_journal_of_another_agent(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        asyncio.run(_start(_agent([]), store, "r1"))
        approve(store, "r1", "t0000.tool00")
        before = [e.row_hash for e in store.load("r1")]
    finally:
        store.close()
    done = _cli(tmp_path, "worker", "--journal", str(tmp_path / "runs.db"), "--agent", "worker_agent:agent",
                "--until-idle")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "another agent definition" in done.stderr
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        assert [e.row_hash for e in store.load("r1")] == before
    finally:
        store.close()


def test_a_drive_that_fails_is_counted_and_the_worker_goes_on(store: Any) -> None:
    """A gateway that cannot be built (a provider's key missing, say): the run waits, untouched,
    and an until-idle worker ends instead of retrying it forever."""
    agent = _agent([])
    assert asyncio.run(_start(agent, store, "r1")) == "suspended"
    approve(store, "r1", "t0000.tool00")
    before = store.checkpoint("r1")

    def broken() -> ScriptedGateway:
        raise RuntimeError("no API key")

    stats = Worker(store, agent, broken, poll_interval=0.01, log=None).run_sync(until_idle=True)
    assert (stats.errors, stats.claimed) == (1, 0)
    after = store.checkpoint("r1")
    assert after.status == "running" and after.last_seq == before.last_seq
    assert _worker(store, agent).run_sync(until_idle=True).completed == 1
