"""The peer: the same agent, tools and fake provider, run by ``dbos-openai-agents``' ``DBOSRunner``
on a DBOS SQLite system database, as its docs say: the run is a ``@DBOS.workflow()`` whose id is
the run id, and the side-effecting tools do their work in a ``@DBOS.step()``.

``python _dbos_agent.py DBOS_DB PROVIDER_URL LEDGER_URL RUN_ID [--no-step]`` starts or resumes
the workflow (calling it again with the same id is how DBOS resumes it in a new process) and
prints one JSON line. ``--no-step``: the tools are not declared steps (the other row of the
issue's table). The receipts carry the business id ``RUN:effect:to:amount``; a transfer's
duplicates are counted on it (DBOS gives the tool no key that survives a crash).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, RunContextWrapper, function_tool, set_tracing_disabled
from dbos import DBOS, SetWorkflowID
from dbos_openai_agents import DBOSRunner
from openai import AsyncOpenAI
from pydantic import BaseModel

from cuaderno.testing.ledger import LedgerClient


def kill_headers() -> dict[str, str]:
    """``OAI_KILL_AT_TURN=T``: ask the fake provider to kill this process in model turn T's flight."""
    turn = os.environ.get("OAI_KILL_AT_TURN")
    return {"X-Kill-At-Turn": turn, "X-Client-Pid": str(os.getpid())} if turn else {}

DB, PROVIDER, LEDGER, RUN = sys.argv[1:5]
AS_STEP = "--no-step" not in sys.argv


class Summary(BaseModel):
    transfers: int
    total: int


@dataclass
class Bank:
    account: str


def _post(effect: str, args: dict[str, Any]) -> dict[str, Any]:
    business = f"{RUN}:{effect}:{args.get('to', '')}:{args.get('amount', '')}"
    return LedgerClient(LEDGER).post_effect(str(uuid.uuid4()), effect, args, business)


@DBOS.step()
async def post_step(effect: str, args: dict[str, Any]) -> dict[str, Any]:
    return await asyncio.to_thread(_post, effect, args)


async def post(effect: str, args: dict[str, Any]) -> dict[str, Any]:
    if AS_STEP:
        result: dict[str, Any] = await post_step(effect, args)
        return result
    return await asyncio.to_thread(_post, effect, args)


@function_tool
async def transfer(ctx: RunContextWrapper[Bank], to: str, amount: int) -> dict[str, Any]:
    """Send money from the bank's account."""
    receipt = await post("transfer", {"from": ctx.context.account, "to": to, "amount": amount})
    return {"receipt": receipt["receipt_id"], "to": to, "amount": amount}


@function_tool
async def balance(ctx: RunContextWrapper[Bank], account: str) -> int:
    """Read an account's balance."""
    return 1000


@function_tool
async def notify(ctx: RunContextWrapper[Bank], message: str) -> str:
    """Tell the operations channel."""
    await post("notify", {"message": message})
    return "notified"


AGENT = Agent(name="treasurer", instructions="Make the transfers you are asked for, then summarise.",
              model=OpenAIChatCompletionsModel(model="fake-model",
                                               openai_client=AsyncOpenAI(base_url=PROVIDER, api_key="fake-key",
                                                                           default_headers=kill_headers())),
              tools=[transfer, balance, notify], output_type=Summary)


@DBOS.workflow()
async def run_agent(task: str) -> dict[str, Any]:
    result = await DBOSRunner.run(AGENT, task, context=Bank("treasury"))
    out: dict[str, Any] = result.final_output.model_dump()
    return out


async def main() -> dict[str, Any]:
    set_tracing_disabled(True)
    DBOS(config={"name": "oai-peer", "system_database_url": f"sqlite:///{DB}", "run_admin_server": False})
    DBOS.launch()
    try:
        with SetWorkflowID(RUN):
            final = await run_agent(f"Pay ana 10, bob 20, carol 30, dave 40 and erin 50. [run={RUN}]")
        return {"status": "completed", "final": final}
    except Exception as exc:
        return {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())), flush=True)
