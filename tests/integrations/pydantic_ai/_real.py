"""A Pydantic AI agent on a real model (the llama.cpp server on loopback), run durably by cuaderno.

Usage: ``python _real.py JOURNAL BASE_URL MODEL RUN_ID``; ``CUADERNO_CRASH_AT=model.K4`` kills it
once the server has answered, before the answer is read (the marks are the OpenAI client's own
HTTP hooks, as in ``_program.py``). Prints the run's status and output as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx2
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from cuaderno import SqliteCheckpointer, faults
from cuaderno.integrations.pydantic_ai import DurableAgent


async def _answered(response: httpx2.Response) -> None:
    faults.point("model.K4")


async def main(journal: str, base_url: str, model: str, run_id: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=600,
                         http_client=httpx2.AsyncClient(event_hooks={"response": [_answered]}, timeout=600))
    agent = Agent(OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client)), name="greeter",
                  instructions="Answer in one short sentence.")
    with SqliteCheckpointer(journal) as store:
        result = await DurableAgent(agent, journal=store).run(
            "Say hello to Ana.", run_id=run_id, model_settings={"max_tokens": 16, "temperature": 0.0, "seed": 1})
    print(json.dumps({"status": result.status, "output": result.output, "replayed": result.replayed}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
