"""The task's text is in the history once: the start event of the first run. The first model
input names it (the activity reads it from the start event, then from the journal's run start
row) and a continue-as-new carries the journal mark, not the task (the continued run reads the
task with its earlier steps at the mark).

Before: an 800 KB task made 1.6 MB in the first run's history (start event and first model
input) and 800 KB more in every continued run's start event.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from long_app import long_agent, script
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from test_temporal_history import history_bytes

from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.journal import open_journal
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker

TASK_BYTES = 800_000
TURNS = 6


async def test_a_large_task_is_in_the_history_once_over_a_continued_run(env: WorkflowEnvironment,
                                                                          tmp_path: Path) -> None:
    task = "read every document " + "x" * (TASK_BYTES - 20)
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    agent = long_agent(TURNS)
    gateway = ScriptedGateway(script(TURNS))
    journal = f"sqlite:///{tmp_path / 'j.db'}"
    async with build_worker(env.client, agent, task_queue=queue, gateway_factory=lambda: gateway,
                            journal_url=journal):
        handle = await env.client.start_workflow(
            CuadernoWorkflow.run, RunInput(agent=agent.name, task=task, max_history_events=30),
            id=run_id, task_queue=queue)
        result = await handle.result()
        sizes, run = [], handle.first_execution_run_id
        while run is not None:
            history = await env.client.get_workflow_handle(run_id, run_id=run).fetch_history()
            sizes.append(history_bytes(history))
            last = history.events[-1]
            run = (last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
                   if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW else None)
    print(f"history bytes per run with an {TASK_BYTES} B task: {sizes}")
    assert result == {"status": "completed", "output": f"read {TURNS} documents"}
    assert len(sizes) >= 3, sizes  # it continued as new, more than once
    assert TASK_BYTES < sizes[0] < TASK_BYTES + 100_000  # once in the first run (its start event)
    assert all(size < 100_000 for size in sizes[1:]), sizes  # not at all in the continued runs
    assert gateway.billed == TURNS + 1
    # Every request the provider got held the whole task as its first message.
    assert all(r.messages[0] == {"role": "user", "content": task} for r in gateway.requests)
    store = open_journal(journal)
    try:
        assert [e.payload["task"] for e in store.load(run_id) if e.step_id == "run" and e.phase == "start"] == [task]
    finally:
        store.close()
