"""The agent the queue tests submit runs of and point ``cuaderno worker --agent`` at.

Each run reports to the fake ledger (its receipts are the independent record) when it begins
and when it finishes, with its concurrency key, and holds its slot for ``FLOWQ_HOLD_S`` seconds
in between (an awaited sleep: the worker's other runs go on meanwhile). ``FLOWQ_LEDGER`` is the
ledger's URL.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from cuaderno import Agent, ErrorClass, ModelRequest, ModelResponse, ScriptedGateway, ToolContext, ToolError, tool
from cuaderno.testing.ledger import LedgerClient, LedgerReplyLost, LedgerUnavailable

HOLD_S = float(os.environ.get("FLOWQ_HOLD_S", "0.2"))
_client = LedgerClient(os.environ.get("FLOWQ_LEDGER", "http://127.0.0.1:1"))


def _lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
    try:
        found = _client.lookup(key=ctx.effect_key)
    except (LedgerUnavailable, LedgerReplyLost) as exc:
        raise RuntimeError(f"ledger unreachable: {exc}") from exc
    return None if found is None else found[0]["response"]


def _post(ctx: ToolContext, effect: str, key: str) -> dict[str, Any]:
    try:
        return _client.post_effect(ctx.effect_key, effect, {"key": key}, business_id=ctx.run_id)
    except LedgerUnavailable as exc:
        raise ToolError(str(exc), error_class=ErrorClass.TRANSIENT, sent=False) from exc
    except LedgerReplyLost as exc:
        raise ToolError(str(exc), error_class=ErrorClass.AMBIGUOUS, sent=True) from exc


@tool(lookup=_lookup)
def begin(key: str, ctx: ToolContext) -> dict[str, Any]:
    """Record in the ledger that this run of ``key`` is in progress."""
    return _post(ctx, "begin", key)


@tool(effect_free=True)
async def work(seconds: float) -> str:
    """Hold the slot a while (no effect)."""
    await asyncio.sleep(seconds)
    return "worked"


@tool(lookup=_lookup)
def finish(key: str, ctx: ToolContext) -> dict[str, Any]:
    """Record in the ledger that this run of ``key`` is no longer in progress."""
    return _post(ctx, "finish", key)


agent = Agent(instructions="begin, work, finish", tools=[begin, work, finish], name="flowq")


def _script(request: ModelRequest) -> ModelResponse:
    """The script of a run of key ``K`` (its task is ``"key=K ..."``), picked by turn."""
    task = next(str(m["content"]) for m in request.messages if m.get("role") == "user")
    key = task.split()[0].removeprefix("key=")
    turn = sum(1 for m in request.messages if m.get("role") == "assistant")
    script = [ScriptedGateway.call("begin", key=key), ScriptedGateway.call("work", seconds=HOLD_S),
              ScriptedGateway.call("finish", key=key), ScriptedGateway.text("done")]
    return script[min(turn, len(script) - 1)]


def gateway_factory() -> ScriptedGateway:
    return ScriptedGateway(_script)
