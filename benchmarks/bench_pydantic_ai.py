"""CPU per step of a Pydantic AI agent: bare, wrapped by cuaderno's DurableAgent, and under the
peer (pydantic-ai's ``DBOSDurability`` in a DBOS workflow on SQLite), with a zero-latency model.

Usage: ``python benchmarks/bench_pydantic_ai.py [--runs 20] [--steps 10] [--repeats 3] [--no-dbos]``

Each run: ``steps`` model requests, each but the last calling one tool (``transfer``, returning a
small dict), then the structured output. The model is pydantic-ai's ``FunctionModel`` (in
process, no HTTP): what is measured is what each durability layer adds per step, not a network.
A "step" is one model request plus its tool call. CPU is this process's (``getrusage``, user +
system, all threads: DBOS's are counted); the journal / system database is a file in a temporary
directory (SQLite, ``synchronous=FULL`` for cuaderno, and ``NORMAL`` in the ``cuaderno-N`` cell to
show what the syncs cost; DBOS's default for the peer).

What the wrapper costs and why: per model step one intent and one result appended to the journal
(two SQLite transactions, each fsynced), the request's fingerprint (the conversation so far,
dumped as JSON and hashed: it grows with the conversation) and the response's dump; per tool call
an intent and a result (two transactions) and the arguments' fingerprint.

Measured 2026-12-07 (``--runs 10 --steps 10 --repeats 3``, shared 2-core machine, load average
7-12, run just before ``bench_openai_agents.py``): bare 3.06 ms, cuaderno 7.02 ms (x2.3),
cuaderno-N 4.75 ms (x1.6), dbos 8.01 ms (x2.6) CPU per step. Earlier (2026-12-06): 3.1, 8.1,
5.9 and 9.3 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from cuaderno import SqliteCheckpointer
from cuaderno.integrations.pydantic_ai import DurableAgent


class Paid(BaseModel):
    paid: int


def script(steps: int) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(1 for m in messages for p in getattr(m, "parts", ()) if isinstance(p, ToolReturnPart)
                   and p.tool_name == "transfer")
        if done < steps - 1:
            return ModelResponse(parts=[ToolCallPart("transfer", {"to": f"p{done}", "amount": done + 1},
                                                     tool_call_id=f"call_{done}")])
        out = info.output_tools[0].name if info.output_tools else None
        if out is None:
            return ModelResponse(parts=[TextPart(json.dumps({"paid": done}))])
        return ModelResponse(parts=[ToolCallPart(out, {"paid": done}, tool_call_id=f"call_out_{done}")])

    return FunctionModel(respond, model_name="zero-latency")


def build(steps: int, capabilities: list[Any] | None = None) -> Agent[None, Paid]:
    agent: Agent[None, Paid] = Agent(script(steps), name="bench", output_type=Paid, capabilities=capabilities or [])

    @agent.tool_plain
    async def transfer(to: str, amount: int) -> dict[str, Any]:
        """Transfer ``amount`` to ``to``."""
        return {"to": to, "amount": amount, "ok": True}

    return agent


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def bare(runs: int, steps: int, tmp: str) -> float:
    agent = build(steps)
    t = cpu()
    for _ in range(runs):
        await agent.run("pay")
    return cpu() - t


async def wrapped(runs: int, steps: int, tmp: str, synchronous: str = "FULL") -> float:
    store = SqliteCheckpointer(os.path.join(tmp, f"runs-{time.monotonic_ns()}.db"),
                               synchronous="NORMAL" if synchronous == "NORMAL" else "FULL")
    durable = DurableAgent(build(steps), journal=store, effects={"transfer": "idempotent"})
    t = cpu()
    for i in range(runs):
        result = await durable.run("pay", run_id=f"r{i}")
        assert result.status == "completed"
    spent = cpu() - t
    store.close()
    return spent


def dbos_cell(runs: int, steps: int, tmp: str) -> float:
    from dbos import DBOS, SetWorkflowID
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    agent = build(steps, [DBOSDurability()])

    @DBOS.workflow()
    async def workflow(prompt: str) -> int:
        return (await agent.run(prompt)).output.paid

    DBOS(config={"name": "bench-pyd", "system_database_url": f"sqlite:///{tmp}/dbos-{time.monotonic_ns()}.sqlite",
                 "run_admin_server": False})
    DBOS.launch()

    async def go() -> float:
        t = cpu()
        for i in range(runs):
            with SetWorkflowID(f"w{i}-{time.monotonic_ns()}"):
                await workflow("pay")
        return cpu() - t

    try:
        return asyncio.run(go())
    finally:
        DBOS.destroy(destroy_registry=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-dbos", action="store_true")
    args = ap.parse_args()
    cells: dict[str, list[float]] = {"bare": [], "cuaderno": [], "cuaderno-N": [], "dbos": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            cells["bare"].append(asyncio.run(bare(args.runs, args.steps, tmp)))
            cells["cuaderno"].append(asyncio.run(wrapped(args.runs, args.steps, tmp)))
            cells["cuaderno-N"].append(asyncio.run(wrapped(args.runs, args.steps, tmp, "NORMAL")))
            if not args.no_dbos:
                cells["dbos"].append(dbos_cell(args.runs, args.steps, tmp))
    steps = args.runs * args.steps
    base = statistics.median(cells["bare"]) / steps
    print(f"pydantic-ai {args.runs} runs x {args.steps} steps, {args.repeats} repeats (median), zero-latency model")
    for name, spent in cells.items():
        if not spent:
            continue
        per = statistics.median(spent) / steps
        print(f"  {name:9s} CPU/step {per * 1e3:7.3f} ms   (+{(per - base) * 1e3:6.3f} ms over bare, x{per / base:4.1f})")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
