"""Runs for the web page's tests: real agent runs (ScriptedGateway) and hand-built hostile ones."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from cuaderno import Agent, Policy, ScriptedGateway, Session, SqliteCheckpointer, StepEvent, ToolContext, tool

HOSTILE_TOOL = "<script>window.__pwned=1</script>\u202egnp.exe\u200f<img src=x onerror=window.__pwned=2>"
HOSTILE_RUN = "r-<b>bold</b>\u202eevil&amp;\"'"
HOSTILE_ARGS = {"to": "</pre><script>window.__pwned=3</script>", "note": "\u202eabc\u2066", "amount": 1}


@tool(idempotent=True)
def read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


@tool
def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
    """Move money."""
    return {"paid": amount, "to": to, "key": ctx.effect_key}


AGENT = Agent(instructions="Pay what is asked.", tools=[read_file, transfer],
              policy=Policy({"transfer": "require_approval"}, version="2026-12"))


def gateway(amount: int = 100) -> ScriptedGateway:
    return ScriptedGateway([ScriptedGateway.call("read_file", path="invoice.txt", cost=0.0021),
                            ScriptedGateway.call("transfer", to="ana", amount=amount, cost=0.0034),
                            ScriptedGateway.text("Paid.", cost=0.0012)])


def run_agent(db: Path, run_id: str, amount: int = 100) -> str:
    """Run (or resume) the paying agent until it stops; its status after."""
    async def go() -> None:
        store = SqliteCheckpointer(db)
        try:
            async for _ in AGENT.run(f"pay ana {amount}", session=Session(run_id, gateway(amount), store)):
                pass
        finally:
            store.close()

    # In a thread of its own: the browser tests' Playwright keeps an event loop in this one.
    failed: list[BaseException] = []
    worker = threading.Thread(target=lambda: _catching(failed, lambda: asyncio.run(go())))
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    with SqliteCheckpointer(db) as store:
        cp = store.checkpoint(run_id)
    assert cp is not None
    return cp.status


def _catching(failed: list[BaseException], fn: Any) -> None:
    try:
        fn()
    except BaseException as exc:
        failed.append(exc)


def hostile_run(store: SqliteCheckpointer, run_id: str = "r-hostile") -> None:
    """A run whose tool name, arguments and task are hostile text, waiting for an approval."""
    store.append([StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", fingerprint="f",
                            payload={"task": "<script>window.__pwned=4</script> pay \u202eevil",
                                     "versions": {"schema": 1, "loop": "1"}})])
    store.append([StepEvent(run_id=run_id, step_id="t0000.tool00.approval", phase="request", kind="approval",
                            name=HOSTILE_TOOL, decision="require_approval", fingerprint="fp-hostile",
                            payload={"tool_step": "t0000.tool00", "arguments": HOSTILE_ARGS})])


def uncertain_run(store: SqliteCheckpointer, run_id: str = "r-uncertain") -> None:
    """A run stopped on an effect nobody can know happened."""
    store.append([StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", fingerprint="f",
                            payload={"task": "send it", "versions": {"schema": 1, "loop": "1"}})])
    store.append([StepEvent(run_id=run_id, step_id="t0000.tool00", phase="intent", kind="tool", name="send",
                            decision="allow", fingerprint="fp-send",
                            payload={"effect_key": "eff-123", "idempotent": False})])
    store.append([StepEvent(run_id=run_id, step_id="t0000.tool00", phase="uncertain", kind="tool", name="send",
                            decision="allow", fingerprint="fp-send",
                            payload={"effect_key": "eff-123", "reason": "timeout after sending", "tool": "send"})])


def unpriced_run(store: SqliteCheckpointer, run_id: str = "r-unpriced") -> None:
    """A completed run whose only model call carried no price."""
    store.append([StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", fingerprint="f",
                            payload={"task": "free?", "versions": {}})])
    store.append([StepEvent(run_id=run_id, step_id="t0000.model", phase="result", kind="model", fingerprint="m0",
                            payload={"response": {"usage": {"input_tokens": 3}, "cost": None}})])
    store.append([StepEvent(run_id=run_id, step_id="final", phase="result", kind="final",
                            payload={"output": "x" * 9000})])
