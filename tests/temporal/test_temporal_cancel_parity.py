"""The ``cancelled`` record of a run cancelled under Temporal is the local loop's record.

One agent, one script, the same run id, cancelled at the same point (while its second tool's body
runs) by the local loop's ``request_cancel`` and by the workflow's ``cancel`` signal: the records
(completed, uncertain, not started, compensations scheduled) are equal, and so is the one the
activities' journal holds.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from cuaderno import Agent, tool
from cuaderno.cancellation import request_cancel
from cuaderno.errors import RunCancelled
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.journal import open_journal
from cuaderno.loop.agent import Session
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker
from cuaderno.tools.definition import Compensation

SCRIPT = [ScriptedGateway.call("book", room="101"), ScriptedGateway.call("wait", name="a"),
          ScriptedGateway.text("never reached")]


def agent(started: asyncio.Event, release: asyncio.Event) -> Agent:
    @tool(idempotent=True, compensation=Compensation("unbook", lambda args, result: {"ref": result["ref"]}))
    def book(room: str) -> dict[str, Any]:
        """Book a room (undone by unbook if the run is cancelled)."""
        return {"ref": f"bk-{room}"}

    @tool(idempotent=True)
    def unbook(ref: str) -> dict[str, Any]:
        """Cancel a booking."""
        return {"cancelled": ref}

    @tool(idempotent=True)
    async def wait(name: str) -> dict[str, Any]:
        """Wait until the test lets it finish."""
        started.set()
        await release.wait()
        return {"name": name}

    return Agent(instructions="Book, then wait.", tools=[book, unbook, wait], name="booker")


async def test_a_cancelled_run_has_the_local_record(env: WorkflowEnvironment, tmp_path: Path) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"

    # Locally: the request is written while the tool runs; the loop closes the run after it.
    started, release = asyncio.Event(), asyncio.Event()
    store = open_journal(f"sqlite:///{tmp_path / 'local.db'}")

    async def run_locally() -> dict[str, Any]:
        try:
            async for _ in agent(started, release).run("book", session=Session(run_id, ScriptedGateway(SCRIPT),
                                                                               store)):
                pass
        except RunCancelled as exc:
            return exc.record
        raise AssertionError("the local run was not cancelled")

    task = asyncio.create_task(run_locally())
    await started.wait()
    request_cancel(store, run_id, "stop", by="ana")
    release.set()
    local = await task

    # Under Temporal: the cancel signal, at the same point.
    started, release = asyncio.Event(), asyncio.Event()
    journal, queue = f"sqlite:///{tmp_path / 'temporal.db'}", f"q-{uuid.uuid4().hex[:8]}"
    gateway = ScriptedGateway(SCRIPT)
    async with build_worker(env.client, agent(started, release), task_queue=queue, journal_url=journal,
                            gateway_factory=lambda: gateway):
        handle = await env.client.start_workflow(CuadernoWorkflow.run, RunInput(agent="booker", task="book"),
                                                 id=run_id, task_queue=queue)
        await started.wait()
        await handle.signal(CuadernoWorkflow.cancel, args=["stop", "ana"])
        release.set()
        result = await handle.result()

    assert local["completed"] and local["cleanup"]  # the scenario has something to compare
    assert result == {"status": "cancelled", "record": local}
    cp = open_journal(journal).checkpoint(run_id)
    assert cp is not None and cp.status == "cancelled" and cp.outcome == local
    assert gateway.billed == 2  # no model turn after the cancellation
