"""MCP tools through the official SDK, against a real MCP server process over stdio.

Ground truth is the server's receipts file (``mcp_receipts_server.py`` writes one line per tool
execution, fsynced before it replies), not cuaderno's journal.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from cuaderno import (
    Agent,
    ErrorClass,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolArgumentsInvalid,
    ToolContext,
    ToolError,
    UsageError,
)
from cuaderno.tools.mcp import META_EFFECT_KEY, Effect, McpServer

SERVER = str(Path(__file__).with_name("mcp_receipts_server.py"))


def receipts(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


def test_listed_tools_are_cuaderno_tools_non_idempotent_by_default(tmp_path: Path) -> None:
    async def main() -> None:
        async with McpServer(sys.executable, [SERVER, str(tmp_path / "r.jsonl")]) as server:
            tools = {t.name: t for t in await server.tools(effects={"note": True})}
            assert set(tools) == {"book", "note", "fail", "crash"}
            assert not tools["book"].idempotent and tools["note"].idempotent
            assert tools["book"].parameters["properties"]["room"]["type"] == "string"
            with pytest.raises(ToolArgumentsInvalid, match="room"):
                tools["book"].validate({"room": 5})
            with pytest.raises(UsageError, match="boook"):
                await server.tools(effects={"boook": True})

    asyncio.run(main())


def test_a_run_calls_the_server_once_with_the_effect_key_in_meta(tmp_path: Path, store: Any) -> None:
    path = tmp_path / "r.jsonl"

    async def main() -> Any:
        async with McpServer(sys.executable, [SERVER, str(path)]) as server:
            agent = Agent(instructions="i", tools=await server.tools())
            gw = ScriptedGateway([ScriptedGateway.call("book", room="A1"), ScriptedGateway.text("done")])
            return await agent.run_to_end("t", session=Session("r", gw, store))

    result = asyncio.run(main())
    assert result.status == "completed" and result.output == "done"
    [receipt] = receipts(path)
    intent = next(e for e in store.load("r") if e.kind == "tool" and e.phase == "intent")
    assert receipt == {"tool": "book", "room": "A1", "key": intent.payload["effect_key"]}
    assert META_EFFECT_KEY == "cuaderno/effect_key"
    tool_result = next(e for e in store.load("r") if e.kind == "tool" and e.phase == "result")
    assert tool_result.payload["outcome"] == "ok" and tool_result.payload["value"] == {"result": "booked A1"}


def test_an_error_the_server_reports_is_a_known_failure(tmp_path: Path, store: Any) -> None:
    async def main() -> Any:
        async with McpServer(sys.executable, [SERVER, str(tmp_path / "r.jsonl")]) as server:
            agent = Agent(instructions="i", tools=await server.tools())
            gw = ScriptedGateway([ScriptedGateway.call("fail", reason="x"), ScriptedGateway.text("done")])
            return await agent.run_to_end("t", session=Session("r", gw, store))

    assert asyncio.run(main()).status == "completed"
    res = next(e for e in store.load("r") if e.kind == "tool" and e.phase == "result")
    assert res.payload["outcome"] == "error" and res.payload["error"]["error_class"] == "permanent"
    assert "cannot: x" in res.payload["error"]["message"]


def test_a_server_that_dies_mid_call_is_an_ambiguous_tool_error_journaled(tmp_path: Path, store: Any) -> None:
    path = tmp_path / "r.jsonl"

    async def main() -> Any:
        async with McpServer(sys.executable, [SERVER, str(path)]) as server:
            tools = {t.name: t for t in await server.tools()}
            ctx = ToolContext(run_id="x", step_id="s", tool="crash", effect_key="k")
            agent = Agent(instructions="i", tools=list(tools.values()))
            gw = ScriptedGateway([ScriptedGateway.call("crash", room="B2"), ScriptedGateway.text("done")])
            result = await agent.run_to_end("t", session=Session("r", gw, store))
            with pytest.raises(ToolError) as refused:  # the connection is known dead: not sent
                await tools["book"].invoke({"room": "C3"}, ctx)
            assert refused.value.sent is False
            return result

    result = asyncio.run(main())
    assert result.status == "needs_human", "a call whose fate is unknown was taken as done or failed"
    [evidence] = result.uncertain.values()
    assert evidence["tool"] == "crash"
    last = evidence["last_error"]
    assert last["type"] == "ToolError" and last["error_class"] == ErrorClass.AMBIGUOUS and last["sent"] is True
    assert len(receipts(path)) == 1 and receipts(path)[0]["tool"] == "crash"


CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, UncertainEffect
    from cuaderno.tools.mcp import Effect, McpServer

    server_py, receipts, db, billing, mode = sys.argv[1:6]

    def find(ctx, arguments):
        # The server's receipts, by effect key: proves the booking present or absent.
        try:
            lines = open(receipts).read().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            if line.strip() and json.loads(line)["key"] == ctx.effect_key:
                return {"result": "booked " + arguments["room"]}
        return None

    async def main():
        effects = {"book": Effect(lookup=find)} if mode == "lookup" else {}
        async with McpServer(sys.executable, [server_py, receipts]) as server:
            agent = Agent(instructions="i", tools=await server.tools(effects=effects))
            gw = ScriptedGateway([ScriptedGateway.call("book", room="A1"), ScriptedGateway.text("done")],
                                 billing_log=billing)
            store = SqliteCheckpointer(db)
            try:
                result = await agent.run_to_end("t", session=Session("run", gw, store))
                print(result.status)
            finally:
                store.close()

    asyncio.run(main())
""")


def _child(tmp_path: Path, mode: str, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at is not None:
        env["CUADERNO_CRASH_AT"] = crash_at
    args = [SERVER, str(tmp_path / "receipts.jsonl"), str(tmp_path / "runs.db"), str(tmp_path / "billing.jsonl"), mode]
    return subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("crash_at", "mode", "status", "executions"), [
    ("tool.K3", "lookup", "completed", 1),   # killed before the request: the lookup proves it absent, sent once
    ("tool.K4", "lookup", "completed", 1),   # killed after the server booked: the lookup finds it, not sent again
    ("tool.K4", "plain", "needs_human", 1),  # no lookup, not idempotent: nobody knows, a person decides
])
def test_killed_during_an_mcp_call(tmp_path: Path, crash_at: str, mode: str, status: str, executions: int) -> None:
    killed = _child(tmp_path, mode, crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = receipts(tmp_path / "receipts.jsonl")
    assert len(before) == (0 if crash_at == "tool.K3" else 1)
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        events = store.load("run")
        assert any(e.kind == "tool" and e.phase == "intent" for e in events)
        assert not any(e.kind == "tool" and e.phase == "result" for e in events)
    finally:
        store.close()

    resumed = _child(tmp_path, mode, None)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == status
    after = receipts(tmp_path / "receipts.jsonl")
    assert len(after) == executions, f"the MCP tool ran {len(after)} times"
    assert len({r["key"] for r in after}) == len(after)
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        cp = store.checkpoint("run")
        assert cp is not None and cp.status == status
        intent = next(e for e in store.load("run") if e.kind == "tool" and e.phase == "intent")
        assert all(r["key"] == intent.payload["effect_key"] for r in after)
    finally:
        store.close()


def test_an_idempotent_tool_resent_after_a_kill_is_deduplicated_by_its_key(tmp_path: Path) -> None:
    child = CHILD.replace('"book"', '"note"').replace('room="A1"', 'text="A1"').replace(
        'effects = {"note": Effect(lookup=find)} if mode == "lookup" else {}', 'effects = {"note": True}')
    env = {**os.environ, "CUADERNO_CRASH_AT": "tool.K4"}
    args = [SERVER, str(tmp_path / "receipts.jsonl"), str(tmp_path / "runs.db"), str(tmp_path / "billing.jsonl"), "x"]
    killed = subprocess.run([sys.executable, "-c", child, *args], env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    env.pop("CUADERNO_CRASH_AT")
    resumed = subprocess.run([sys.executable, "-c", child, *args], env=env, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0 and resumed.stdout.strip() == "completed", resumed.stderr
    assert len(receipts(tmp_path / "receipts.jsonl")) == 1, "the re-send with the same key was applied twice"


def test_tools_before_connecting_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="async with"):
        asyncio.run(McpServer(sys.executable, [SERVER, "x"]).tools())
    assert Effect().idempotent is False
