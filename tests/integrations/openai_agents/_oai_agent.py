"""A real OpenAI Agents SDK agent run durably, as a process the kill tests SIGKILL.

``python _oai_agent.py JOURNAL PROVIDER_URL LEDGER_URL RUN_ID [--approval] [--text] [--budget=NAME=N]`` runs (or
resumes) the run and prints one JSON line: ``{"status": "completed", "final": ...}``,
``{"status": "suspended", "pending": [...]}``, ``{"status": "needs_human", "step": ...}``,
``{"status": "failed", "budget": ...}`` (past ``RunBudget(NAME=N)``; ``--budget=tool_calls_per_tool=TOOL/N``
bounds one tool), ``{"status": "cancelled",
"cleanup": N}`` (``--refunds``: transfers declared with a refund as compensation;
``--compensate``: run a cancelled run's refunds, ``{"status": "compensated", ...}``) or
``{"status": "error", ...}``. ``CUADERNO_CRASH_AT`` kills it at a named point. ``OAI_STREAM=1``
runs it through ``DurableRunner.run_streamed`` (a completed run then also says how many raw
response events it handed on: ``raw_events``).

The agent: three function tools taking the SDK's ``RunContextWrapper`` (the bank account and the
ledger's address come from the run context), a structured ``output_type``, and the SDK's own
``OpenAIChatCompletionsModel`` over an ``AsyncOpenAI`` client pointed at the fake provider.
``transfer`` posts to the receipts server (which never deduplicates) and is declared with a
lookup by effect key; ``balance`` only reads (effect-free); ``notify`` posts with no lookup
(non-idempotent: an unknown outcome is ``needs_human``); with ``--approval`` it needs approval
and is declared with a lookup.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, RunContextWrapper, function_tool, set_tracing_disabled
from openai import AsyncOpenAI
from pydantic import BaseModel

from cuaderno import SqliteCheckpointer
from cuaderno.errors import BudgetExceeded, ErrorClass, RunCancelled, ToolError, UncertainEffect
from cuaderno.integrations.openai_agents import (
    Compensation,
    DurableRunner,
    EffectCall,
    RunBudget,
    effect_key,
    lookup,
)
from cuaderno.journal import open_journal
from cuaderno.testing.ledger import LedgerClient, LedgerReplyLost, LedgerUnavailable


@dataclass
class Bank:
    account: str
    ledger_url: str


class Summary(BaseModel):
    transfers: int
    total: int


async def _post(ctx: RunContextWrapper[Bank], effect: str, args: dict[str, Any]) -> dict[str, Any]:
    client = LedgerClient(ctx.context.ledger_url)
    try:
        return await asyncio.to_thread(client.post_effect, effect_key(), effect, args, effect_key())
    except LedgerUnavailable as exc:
        raise ToolError(str(exc), error_class=ErrorClass.TRANSIENT, sent=False) from exc
    except LedgerReplyLost as exc:
        raise ToolError(str(exc), error_class=ErrorClass.AMBIGUOUS, sent=True) from exc


@function_tool
async def transfer(ctx: RunContextWrapper[Bank], to: str, amount: int) -> dict[str, Any]:
    """Send money from the bank's account."""
    receipt = await _post(ctx, "transfer", {"from": ctx.context.account, "to": to, "amount": amount})
    return {"receipt": receipt["receipt_id"], "to": to, "amount": amount}


@function_tool
async def balance(ctx: RunContextWrapper[Bank], account: str) -> int:
    """Read an account's balance."""
    return 1000


async def find_transfer(call: EffectCall) -> dict[str, Any] | None:
    found = await asyncio.to_thread(LedgerClient(LEDGER_URL).lookup, call.key)
    if not found:
        return None
    r = found[0]
    return {"receipt": r["receipt_id"], "to": call.arguments["to"],
            "amount": call.arguments["amount"]}


async def find_notification(call: EffectCall) -> str | None:
    found = await asyncio.to_thread(LedgerClient(LEDGER_URL).lookup, call.key)
    return "notified" if found else None


LEDGER_URL = ""


def kill_headers() -> dict[str, str]:
    """``OAI_KILL_AT_TURN=T``: ask the fake provider to kill this process in model turn T's flight."""
    turn = os.environ.get("OAI_KILL_AT_TURN")
    return {"X-Kill-At-Turn": turn, "X-Client-Pid": str(os.getpid())} if turn else {}


def build(provider_url: str, *, approval: bool, structured: bool) -> Agent[Bank]:
    @function_tool(needs_approval=approval)
    async def notify(ctx: RunContextWrapper[Bank], message: str) -> str:
        """Tell the operations channel."""
        await _post(ctx, "notify", {"message": message})
        return "notified"

    client = AsyncOpenAI(base_url=provider_url, api_key="fake-key", default_headers=kill_headers())
    return Agent(name="treasurer", instructions="Make the transfers you are asked for, then summarise.",
                 model=OpenAIChatCompletionsModel(model="fake-model", openai_client=client),
                 tools=[transfer, balance, notify], output_type=Summary if structured else str)


EFFECTS: dict[str, Any] = {"transfer": lookup(find_transfer), "balance": "effect_free"}


async def refund(key: str, arguments: dict[str, Any], value: Any) -> dict[str, Any]:
    """Undo a transfer: the ledger records a refund under the compensation's own key."""
    reply = await asyncio.to_thread(LedgerClient(LEDGER_URL).post_effect, key, "refund",
                                    {"to": arguments["to"], "amount": arguments["amount"]}, key)
    return {"refund": reply["receipt_id"]}


async def find_refund(key: str, arguments: dict[str, Any]) -> dict[str, Any] | None:
    found = await asyncio.to_thread(LedgerClient(LEDGER_URL).lookup, key)
    return {"refund": found[0]["receipt_id"]} if found else None


COMPENSATIONS = {"transfer": Compensation(refund, lookup=find_refund)}
"""With ``--refunds``: each transfer is undone by a refund if the run is cancelled."""


def _limit(name: str, value: str) -> Any:
    """A bound as ``--budget=`` gives it: a count, or ``TOOL/N`` for ``tool_calls_per_tool``."""
    if name == "tool_calls_per_tool":
        tool, _, count = value.partition("/")
        return {tool: int(count)}
    return int(value)


async def main(journal: str, provider_url: str, ledger_url: str, run_id: str, flags: list[str]) -> dict[str, Any]:
    global LEDGER_URL
    LEDGER_URL = ledger_url
    set_tracing_disabled(True)
    agent = build(provider_url, approval="--approval" in flags, structured="--text" not in flags)
    # A SQLite file, or a PostgreSQL URL (the worker tests run both).
    store = open_journal(journal) if "://" in journal else SqliteCheckpointer(journal)
    try:
        effects = {**EFFECTS, "notify": lookup(find_notification)} if "--approval" in flags else EFFECTS
        limits = [f.removeprefix("--budget=").partition("=") for f in flags if f.startswith("--budget=")]
        budget = RunBudget(**{k: _limit(k, v) for k, _, v in limits}) if limits else None
        runner = DurableRunner(store, effects=effects, budget=budget,
                               compensations=COMPENSATIONS if "--refunds" in flags else None)
        if "--compensate" in flags:  # run the cancelled run's compensations
            done = await runner.compensate(run_id)
            return {"status": "compensated", "outcomes": [d.get("outcome") for d in done]}
        task, bank = "Pay ana 10, bob 20, carol 30, dave 40 and erin 50.", Bank("treasury", ledger_url)
        streamed = None
        if os.environ.get("OAI_STREAM"):  # through Runner.run_streamed: count the events handed on
            stream = runner.run_streamed(agent, task, run_id=run_id, context=bank)
            streamed = 0
            async for event in stream.stream_events():
                streamed += event.type == "raw_response_event"
            assert stream.result is not None
            result = stream.result
        else:
            result = await runner.run(agent, task, run_id=run_id, context=bank)
    except UncertainEffect as exc:
        return {"status": "needs_human", "step": exc.step_id}
    except BudgetExceeded as exc:
        return {"status": "failed", "budget": exc.budget}
    except RunCancelled as exc:
        return {"status": "cancelled", "cleanup": len(exc.record.get("cleanup") or [])}
    except Exception as exc:  # report it: the test decides whether it is allowed
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, UncertainEffect):
            cause = cause.__cause__
        if isinstance(cause, UncertainEffect):
            return {"status": "needs_human", "step": cause.step_id}
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        store.close()
    if result.status == "suspended":
        return {"status": "suspended", "pending": sorted(result.pending)}
    final = result.final_output
    out = {"status": "completed", "final": final.model_dump() if isinstance(final, BaseModel) else final,
           "replayed": result.replayed}
    return out if streamed is None else {**out, "raw_events": streamed}


if __name__ == "__main__":
    out = asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]))
    print(json.dumps(out), flush=True)
