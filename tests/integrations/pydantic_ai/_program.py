"""A real Pydantic AI agent run durably by cuaderno: the process the kill tests SIGKILL.

Usage: ``python _program.py JOURNAL PROVIDER_URL RECEIPTS_URL RUN_ID PROMPT [EFFECT]``. EFFECT
declares the transfer tools (``lookup``: asked by key after a crash, the default;
``non_idempotent``: undeclared, an unknown outcome stops the run ``needs_human``;
``broken_lookup``: declared with a lookup that always fails; ``budget:NAME=N``: declared with
lookups, run with ``RunBudget(NAME=N)`` (``budget:tool_calls_per_tool=TOOL/N``: that tool's bound), a run past it printing ``{"status": "failed", "budget": NAME}``; ``compensate``: runs the cancelled run's compensations, refunds,
printing ``{"status": "compensated", "outcomes": [...]}``; a cancelled run prints
``{"status": "cancelled", "cleanup": N}``; ``stream``: declared with lookups, run with an ``event_stream_handler`` (the model requests are
streamed), the output then saying how many events the handler saw: ``events``; ``run_stream``
and ``iter``: declared with lookups, run through ``DurableAgent.run_stream`` (reading the output
as it streams, ``caller.K1`` passed at each partial output) or ``DurableAgent.iter`` (``caller.K1``
passed at each node; an ended run, which ``iter`` refuses, answered by ``run``), the output saying how many partial outputs or nodes the caller saw: ``seen``;
``run_stream_peek`` and ``iter_peek`` leave after the first partial output or node; a run that
ends in approvals prints ``{"status": "deferred", "approvals": [TOOL...]}``).
``CUADERNO_CRASH_AT`` kills it at a named point: the protocol's own (``model.K2``, ``tool.K5``...),
the journal's (``append.W1:N``), and the ones marked here on the real request paths: ``model.K3``
(the OpenAI client hands the request to its transport), ``model.K4`` (the provider answered, the
body unread), ``tool.K3`` (in the tool, before it calls the payment service) and ``tool.K4`` (the
payment made, its reply unread).

Prints one JSON line: the run's status and output (or ``needs_human``, exit 3).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.profiles.openai import OpenAIModelProfile
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import DeferredToolRequests

from cuaderno import SqliteCheckpointer, faults
from cuaderno.errors import BudgetExceeded, RunCancelled, RunClosed, UncertainEffect
from cuaderno.integrations.pydantic_ai import (
    Compensation,
    DurableAgent,
    Lookup,
    RunBudget,
    ToolEffect,
    current_effect_key,
)
from cuaderno.journal import open_journal


@dataclass
class Deps:
    receipts: str
    http: httpx.AsyncClient


class Paid(BaseModel):
    paid: list[str]
    total: int


async def _model_sent(request: httpx2.Request) -> None:
    faults.point("model.K3")


async def _model_answered(response: httpx2.Response) -> None:
    faults.point("model.K4")


def build_agent(provider_url: str) -> Agent[Deps, Paid | DeferredToolRequests]:
    client = AsyncOpenAI(base_url=provider_url, api_key="fake", max_retries=0,
                         http_client=httpx2.AsyncClient(event_hooks={"request": [_model_sent],
                                                                     "response": [_model_answered]}))
    # The fake provider, as OpenAI's own API, ends every stream with a finish reason: one without is cut.
    model = OpenAIChatModel("fake-model", provider=OpenAIProvider(openai_client=client),
                            profile=OpenAIModelProfile(openai_chat_streaming_requires_finish_reason=True))
    agent: Agent[Deps, Paid | DeferredToolRequests] = Agent(
        model, name="payer", deps_type=Deps, output_type=[Paid, DeferredToolRequests],
        instructions="Pay each transfer the user lists, one at a time, then report who was paid.")

    async def pay(ctx: RunContext[Deps], to: str, amount: int) -> dict[str, Any]:
        key = current_effect_key()  # the payment service keeps it: a lookup after a crash asks by it
        faults.point("tool.K3")
        reply = await ctx.deps.http.post(f"{ctx.deps.receipts}/transfers", json={"key": key, "to": to, "amount": amount})
        faults.point("tool.K4")
        reply.raise_for_status()
        return dict(reply.json())

    @agent.tool
    async def transfer(ctx: RunContext[Deps], to: str, amount: int) -> dict[str, Any]:
        """Transfer ``amount`` to ``to``."""
        return await pay(ctx, to, amount)

    @agent.tool(requires_approval=True)
    async def big_transfer(ctx: RunContext[Deps], to: str, amount: int) -> dict[str, Any]:
        """Transfer a large ``amount`` to ``to`` (a person approves it first)."""
        return await pay(ctx, to, amount)

    return agent


def effects(kind: str, receipts: str, http: httpx.AsyncClient) -> dict[str, ToolEffect]:
    if kind == "non_idempotent":
        return {}

    async def find(key: str, arguments: dict[str, Any]) -> Any:
        if kind == "broken_lookup":  # the payment service cannot be asked: nothing is proven
            raise ConnectionError("the payment service's lookup is down")
        reply = await http.get(f"{receipts}/transfers/{key}")
        if reply.status_code == 404:
            return None  # the service proves it has no transfer with that key
        reply.raise_for_status()
        return reply.json()

    return {"transfer": Lookup(find), "big_transfer": Lookup(find)}


def compensations(receipts: str) -> dict[str, Compensation]:
    """Each transfer is undone by a refund, asked for by key after a crash (the refunds log is
    the truth that each is made once)."""

    async def refund(key: str, arguments: dict[str, Any], value: Any) -> Any:
        async with httpx.AsyncClient() as http:
            faults.point("tool.K3")
            reply = await http.post(f"{receipts}/refunds", json={"key": key, "to": arguments["to"],
                                                                  "amount": arguments["amount"]})
            faults.point("tool.K4")
        reply.raise_for_status()
        return reply.json()

    async def find_refund(key: str, arguments: dict[str, Any]) -> Any:
        async with httpx.AsyncClient() as http:
            reply = await http.get(f"{receipts}/refunds/{key}")
        if reply.status_code == 404:
            return None
        reply.raise_for_status()
        return reply.json()

    undo = Compensation(refund, lookup=find_refund)
    return {"transfer": undo, "big_transfer": undo}


def budget(kind: str) -> RunBudget | None:
    if not kind.startswith("budget:"):
        return None
    name, _, value = kind.removeprefix("budget:").partition("=")
    if name == "tool_calls_per_tool":  # budget:tool_calls_per_tool=transfer/1
        tool, _, count = value.partition("/")
        return RunBudget(tool_calls_per_tool={tool: int(count)})
    return RunBudget(**{name: float(value) if name == "cost_usd" else int(value)})


async def main(journal: str, provider_url: str, receipts: str, run_id: str, prompt: str, kind: str = "lookup") -> int:
    async with httpx.AsyncClient() as http:
        # A SQLite file, or a PostgreSQL URL (the worker tests run both).
        store = open_journal(journal) if "://" in journal else SqliteCheckpointer(journal)
        durable = DurableAgent(build_agent(provider_url), journal=store, effects=effects(kind, receipts, http),
                               budget=budget(kind), compensations=compensations(receipts))
        if kind == "compensate":  # run the cancelled run's compensations
            try:
                done = await durable.compensate(run_id)
            except UncertainEffect as exc:
                print(json.dumps({"status": "needs_human", "step": exc.step_id}))
                return 3
            finally:
                store.close()
            print(json.dumps({"status": "compensated", "outcomes": [d.get("outcome") for d in done]}))
            return 0
        seen: list[Any] = []

        async def handler(ctx: RunContext[Deps], events: AsyncIterable[Any]) -> None:
            async for event in events:
                seen.append(event)

        streaming = {"event_stream_handler": handler} if kind == "stream" else {}
        try:
            if kind.startswith(("run_stream", "iter")):
                return await _shaped(durable, kind, run_id, prompt, Deps(receipts, http))
            result = await durable.run(prompt, run_id=run_id, deps=Deps(receipts, http), **streaming)
        except UncertainEffect as exc:
            print(json.dumps({"status": "needs_human", "step": exc.step_id}))
            return 3
        except RunCancelled as exc:
            print(json.dumps({"status": "cancelled", "cleanup": len(exc.record.get("cleanup") or [])}))
            return 0
        except BudgetExceeded as exc:
            print(json.dumps({"status": "failed", "budget": exc.budget, "replayed": False}))
            return 0
        finally:
            store.close()
    output = result.output.model_dump() if isinstance(result.output, BaseModel) else result.output
    print(json.dumps({"status": result.status, "output": output, "replayed": result.replayed, "reason": result.reason,
                      **({"events": len(seen)} if streaming else {}),
                      "pending": [{"step": p.step_id, "fingerprint": p.fingerprint} for p in result.pending]}))
    return 0


async def _shaped(durable: DurableAgent[Paid | DeferredToolRequests], kind: str, run_id: str, prompt: str,
                  deps: Deps) -> int:
    """Run through ``run_stream`` or ``iter`` (module docstring); print what the caller got."""
    seen, output = 0, None
    peek = kind.endswith("_peek")
    if kind.startswith("run_stream"):
        async with durable.run_stream(prompt, run_id=run_id, deps=deps) as stream:
            async for _partial in stream.stream_output(debounce_by=None):
                seen += 1
                faults.point("caller.K1")
                if peek:
                    break
            if not peek:
                output = await stream.get_output()
    else:
        try:
            async with durable.iter(prompt, run_id=run_id, deps=deps) as agent_run:
                async for _node in agent_run:
                    seen += 1
                    faults.point("caller.K1")
                    if peek:
                        break
                if agent_run.result is not None:
                    output = agent_run.result.output
        except RunClosed:  # ended (a kill after its end was journaled): run answers it from the journal
            output = (await durable.run(prompt, run_id=run_id, deps=deps)).output
    if isinstance(output, DeferredToolRequests):  # ended in approvals: journaled, the run waits for them
        print(json.dumps({"status": "deferred", "approvals": [p.tool_name for p in output.approvals], "seen": seen}))
        return 0
    dumped = output.model_dump() if isinstance(output, BaseModel) else output
    print(json.dumps({"status": "completed" if output is not None else "left", "output": dumped, "seen": seen}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:])))
