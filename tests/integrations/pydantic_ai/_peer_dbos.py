"""The peer: the same agent and tools made durable the way Pydantic AI 2.78's docs say for DBOS
(``DBOSDurability`` capability, ``agent.run`` inside a ``@DBOS.workflow``, the tool's I/O in a
``@DBOS.step``), on a SQLite system database. Killed and resumed like ``_program.py``, against the
same fake provider and payment service, so the same outside truth counts what it does.

Usage: ``python _peer_dbos.py JOURNAL PROVIDER_URL RECEIPTS_URL RUN_ID PROMPT [KIND]``. Calling it
again with the same run id resumes the workflow (DBOS recovers a pending workflow of this
executor at launch; the call with the same workflow id waits for it).

The payment request carries ``key`` = ``<run id>/<to>/<amount>``: DBOS gives a step no effect key
of its own, and the payment service must be able to tell a repeat of a transfer from another one
(here every transfer of a run is to another person).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import httpx
from dbos import DBOS, DBOSConfig, SetWorkflowID
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.durable_exec.dbos import DBOSDurability
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


class Paid(BaseModel):
    paid: list[str]
    total: int


_CONFIG: dict[str, str] = {}


@DBOS.step()
async def pay(to: str, amount: int) -> dict[str, Any]:
    """The transfer, as a DBOS step (the docs' advice for a tool's I/O)."""
    key = f"{DBOS.workflow_id}/{to}/{amount}"
    async with httpx.AsyncClient() as http:
        reply = await http.post(f"{_CONFIG['receipts']}/transfers", json={"key": key, "to": to, "amount": amount})
        reply.raise_for_status()
        return dict(reply.json())


def build_agent(provider_url: str) -> Agent[None, Paid]:
    client = AsyncOpenAI(base_url=provider_url, api_key="fake", max_retries=0)
    model = OpenAIChatModel("fake-model", provider=OpenAIProvider(openai_client=client))
    agent: Agent[None, Paid] = Agent(model, name="payer", output_type=Paid, capabilities=[DBOSDurability()],
                                     instructions="Pay each transfer the user lists, one at a time, then report "
                                                  "who was paid.")

    @agent.tool_plain
    async def transfer(to: str, amount: int) -> dict[str, Any]:
        """Transfer ``amount`` to ``to``."""
        return await pay(to, amount)

    return agent


_AGENT: Agent[None, Paid] | None = None


@DBOS.workflow()
async def pay_workflow(prompt: str) -> dict[str, Any]:
    assert _AGENT is not None
    result = await _AGENT.run(prompt)
    return result.output.model_dump()


async def main(journal: str, provider_url: str, receipts: str, run_id: str, prompt: str, kind: str = "") -> int:
    global _AGENT
    _CONFIG["receipts"] = receipts
    _AGENT = build_agent(provider_url)
    config: DBOSConfig = {"name": "pyd-peer", "system_database_url": f"sqlite:///{journal}",
                          "executor_id": "local", "run_admin_server": False}
    DBOS(config=config)
    DBOS.launch()
    try:
        with SetWorkflowID(run_id):
            output = await pay_workflow(prompt)
    finally:
        DBOS.destroy(destroy_registry=False)
    print(json.dumps({"status": "completed", "output": output, "replayed": False, "pending": []}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DBOS__VMID", "local")
    sys.exit(asyncio.run(main(*sys.argv[1:])))
