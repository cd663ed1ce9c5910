"""The agent the worker tests start runs of and point ``cuaderno worker --agent`` at.

Configured from the environment so that every process (the one that starts a run, each worker)
builds the same definition: ``WORKER_LEDGER`` (the fake ledger's URL: its receipts are the ground
truth), ``WORKER_BILLING`` (the fake provider's billing log), ``WORKER_GATE`` (a file the
``reserve`` tool waits for, to hold a step in flight), ``WORKER_TURNS`` (transfers per run).

``agent`` moves money ``WORKER_TURNS`` times; ``approving_agent`` first asks a person to approve a
``reserve`` and then does the same transfers (the policy is its own definition: its runs are not
``agent``'s).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from cuaderno import Agent, ErrorClass, Policy, ScriptedGateway, ToolContext, ToolError, tool
from cuaderno.testing.ledger import LedgerClient, LedgerReplyLost, LedgerUnavailable

TURNS = int(os.environ.get("WORKER_TURNS", "3"))
_client = LedgerClient(os.environ.get("WORKER_LEDGER", "http://127.0.0.1:1"))


def _lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
    try:
        found = _client.lookup(key=ctx.effect_key)
    except (LedgerUnavailable, LedgerReplyLost) as exc:
        raise RuntimeError(f"ledger unreachable: {exc}") from exc
    return None if found is None else found[0]["response"]


def _post(ctx: ToolContext, effect: str, args: dict[str, Any]) -> dict[str, Any]:
    gate = os.environ.get("WORKER_GATE")
    if gate:
        Path(gate + ".inflight").touch()
        deadline = time.monotonic() + 60
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    try:
        return _client.post_effect(ctx.effect_key, effect, args, business_id=ctx.run_id)
    except LedgerUnavailable as exc:
        raise ToolError(str(exc), error_class=ErrorClass.TRANSIENT, sent=False) from exc
    except LedgerReplyLost as exc:
        raise ToolError(str(exc), error_class=ErrorClass.AMBIGUOUS, sent=True) from exc


@tool(lookup=_lookup)
def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
    """Move money through the ledger (not idempotent: the ledger applies every request)."""
    return _post(ctx, "transfer", {"to": to, "amount": amount})


@tool(lookup=_lookup)
def reserve(amount: int, ctx: ToolContext) -> dict[str, Any]:
    """Reserve funds (a person approves it first)."""
    return _post(ctx, "reserve", {"amount": amount})


agent = Agent(instructions="pay the accounts", tools=[transfer], name="payer")
approving_agent = Agent(instructions="reserve, then pay the accounts", tools=[reserve, transfer], name="payer",
                        policy=Policy({"reserve": "require_approval"}, version="w-1"))


def script(approving: bool = False) -> list[Any]:
    first = [ScriptedGateway.call("reserve", amount=100)] if approving else []
    return [*first, *(ScriptedGateway.call("transfer", to=f"acct{i}", amount=10 + i) for i in range(TURNS)),
            ScriptedGateway.text("paid")]


def gateway_factory() -> ScriptedGateway:
    return ScriptedGateway(script(), billing_log=os.environ.get("WORKER_BILLING"))


def approving_gateway() -> ScriptedGateway:
    return ScriptedGateway(script(True), billing_log=os.environ.get("WORKER_BILLING"))
