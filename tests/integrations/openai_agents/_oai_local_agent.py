"""The OpenAI Agents SDK on the real local model (llama.cpp server, SmolLM2-135M), run durably.

``python _oai_local_agent.py JOURNAL BASE_URL MODEL LEDGER_URL RUN_ID`` runs (or resumes) one
run and prints one JSON line. The agent: one function tool, ``record``, that posts to the
receipts server with its effect key (declared with a lookup); the model is forced to call it
(``tool_choice`` names it: the server's grammar then always produces a call) and the run stops on
the tool's output (``tool_use_behavior="stop_on_first_tool"``): one model call, one effect.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from cuaderno import SqliteCheckpointer
from cuaderno.integrations.openai_agents import DurableRunner, EffectCall, effect_key, lookup
from cuaderno.testing.ledger import LedgerClient

JOURNAL, BASE_URL, MODEL, LEDGER, RUN = sys.argv[1:6]


@function_tool
async def record(note: str) -> str:
    """Record a note in the ledger."""
    receipt = await asyncio.to_thread(LedgerClient(LEDGER).post_effect, effect_key(), "note", {"note": note[:200]})
    return f"recorded #{receipt['receipt_id']}"


async def find(call: EffectCall) -> str | None:
    found = await asyncio.to_thread(LedgerClient(LEDGER).lookup, call.key)
    return f"recorded #{found[0]['receipt_id']}" if found else None


async def main() -> dict[str, Any]:
    set_tracing_disabled(True)
    agent = Agent(name="scribe", instructions="Record what the user says with the record tool.",
                  model=OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(base_url=BASE_URL,
                                                                                          api_key="local")),
                  model_settings=ModelSettings(tool_choice="record", max_tokens=48, temperature=0.0),
                  tools=[record], tool_use_behavior="stop_on_first_tool")
    store = SqliteCheckpointer(JOURNAL)
    try:
        result = await DurableRunner(store, effects={"record": lookup(find)}).run(agent, "Note: the invoice is paid.",
                                                                                 run_id=RUN)
    finally:
        store.close()
    return {"status": result.status, "final": result.final_output, "replayed": result.replayed}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())), flush=True)
