"""CPU per step of an OpenAI Agents SDK agent run by ``DurableRunner``, against the bare SDK
(``Runner.run``) and against ``dbos-openai-agents``' ``DBOSRunner`` on SQLite, in one process.

Usage: ``python benchmarks/bench_openai_agents.py [--runs 20] [--turns 10] [--repeats 3]``

The model is a zero-latency :class:`agents.Model` in this process (each turn one function call,
then a final answer), so what is measured is the runner's CPU, not a provider's: a step is one
model call or one tool call. Per runner: CPU seconds (``time.process_time``: user + system of
every thread) per step, the median of ``--repeats``. The durable cells write a SQLite journal in
a temporary directory (``synchronous=FULL``: one fsync-bound append per intent and per result).
Run it on a quiet machine: other processes slow the cells.

Measured 2026-12-07 (``--runs 10 --turns 10 --repeats 3``, shared 2-core machine, load average
7-12, run right after ``bench_pydantic_ai.py``): bare 0.670 ms, ``DurableRunner`` 2.376 ms
(3.55x), ``DBOSRunner`` 3.343 ms (4.99x) CPU per step. Earlier (2026-12-06): 0.95, 2.65 (2.8x)
and 3.54 ms (3.75x): the wrapper's time fell, its ratio rose because the bare cell was faster.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from agents import Agent, Model, ModelResponse, Runner, function_tool, set_tracing_disabled
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from cuaderno import SqliteCheckpointer
from cuaderno.integrations.openai_agents import DurableRunner


class ZeroLatency(Model):
    """``turns`` turns of one ``add`` call each, then the answer; decided by the conversation."""

    def __init__(self, turns: int) -> None:
        self.turns = turns

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
                           output_schema: Any, handoffs: Any, tracing: Any, **kw: Any) -> ModelResponse:
        done = sum(1 for item in input if isinstance(item, dict) and item.get("type") == "function_call_output") \
            if isinstance(input, list) else 0
        usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
        if done < self.turns:
            call = ResponseFunctionToolCall(type="function_call", call_id=f"c{done}", name="add",
                                            arguments=f'{{"a": {done}, "b": 1}}', id=f"fc{done}")
            return ModelResponse(output=[call], usage=usage, response_id=None)
        text = ResponseOutputText(type="output_text", text="done", annotations=[])
        msg = ResponseOutputMessage(type="message", id="m", role="assistant", status="completed", content=[text])
        return ModelResponse(output=[msg], usage=usage, response_id=None)

    def stream_response(self, *a: Any, **kw: Any) -> Any:
        raise NotImplementedError


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def agent(turns: int) -> Agent[Any]:
    return Agent(name="adder", instructions="add", tools=[add], model=ZeroLatency(turns))


async def bare(runs: int, turns: int, tmp: Path) -> None:
    for _ in range(runs):
        await Runner.run(agent(turns), "go", max_turns=turns + 5)


async def durable(runs: int, turns: int, tmp: Path) -> None:
    store = SqliteCheckpointer(tmp / f"j-{time.monotonic_ns()}.db")
    runner = DurableRunner(store, effects={"add": "effect_free"})
    for i in range(runs):
        await runner.run(agent(turns), "go", run_id=f"r{i}", max_turns=turns + 5)
    store.close()


def dbos_cell() -> Any:
    from dbos import DBOS
    from dbos_openai_agents import DBOSRunner

    @DBOS.workflow()
    async def one(turns: int) -> str:
        result = await DBOSRunner.run(agent(turns), "go", max_turns=turns + 5)
        return str(result.final_output)

    async def cell(runs: int, turns: int, tmp: Path) -> None:
        for _ in range(runs):
            await one(turns)

    return DBOS, cell


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-dbos", action="store_true")
    a = p.parse_args()
    set_tracing_disabled(True)
    steps = a.runs * (2 * a.turns + 1)  # each turn a model call and a tool call, then the final model call
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cells: dict[str, Any] = {"bare SDK (Runner.run)": bare, "cuaderno DurableRunner (SQLite)": durable}
        dbos = None
        if not a.no_dbos:
            dbos, cell = dbos_cell()
            dbos(config={"name": "bench-oai", "system_database_url": f"sqlite:///{tmp / 'dbos.sqlite'}",
                         "run_admin_server": False})
            dbos.launch()
            cells["dbos-openai-agents DBOSRunner (SQLite)"] = cell
        asyncio.run(bare(2, a.turns, tmp))  # warm imports and caches
        results: dict[str, list[float]] = {name: [] for name in cells}
        for _ in range(a.repeats):
            for name, fn in cells.items():
                t0 = time.process_time()
                asyncio.run(fn(a.runs, a.turns, tmp))
                results[name].append((time.process_time() - t0) / steps)
        if dbos is not None:
            dbos.destroy()
    base = statistics.median(results["bare SDK (Runner.run)"])
    print(f"{a.runs} runs x {a.turns} turns ({steps} steps per cell), median of {a.repeats}")
    print(f"{'runner':42} {'CPU ms/step':>12} {'vs bare':>10}")
    for name, values in results.items():
        m = statistics.median(values)
        print(f"{name:42} {m * 1000:12.3f} {m / base:9.2f}x")


if __name__ == "__main__":
    main()
