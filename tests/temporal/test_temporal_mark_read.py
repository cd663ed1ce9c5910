"""A continued run gets its earlier steps without reading the journal in workflow code: the
``journal_mark`` activity that ends the earlier run reads the rows (in the activity) and keeps
what the continued run needs on its worker. Only a continued run whose first workflow task lands
on a worker that did not keep them reads the journal from workflow code (the fallback, measured in
``read_to_mark``'s docstring)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from long_app import long_agent, script
from temporalio.testing import WorkflowEnvironment

import cuaderno.temporal._activities as activities
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.temporal import CuadernoWorkflow, RunInput, build_worker

TURNS = 6


async def continued_run(env: WorkflowEnvironment, tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], int]:
    """A run that continues as new (every 30 events); returns its result and how many times
    read_to_mark (workflow code) opened the journal."""
    opened: list[str] = []
    real = activities.open_journal

    def counting(url: str, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("readonly"):
            opened.append(url)
        return real(url, *args, **kwargs)

    monkeypatch.setattr(activities, "open_journal", counting)
    queue, run_id = f"q-{uuid.uuid4().hex[:8]}", f"run-{uuid.uuid4().hex[:8]}"
    agent = long_agent(TURNS)
    gateway = ScriptedGateway(script(TURNS))
    async with build_worker(env.client, agent, task_queue=queue, gateway_factory=lambda: gateway,
                            journal_url=f"sqlite:///{tmp_path / 'j.db'}"):
        handle = await env.client.start_workflow(
            CuadernoWorkflow.run, RunInput(agent=agent.name, task="read", max_history_events=30),
            id=run_id, task_queue=queue)
        result = await handle.result()
    assert gateway.billed == TURNS + 1  # nothing paid twice across the runs
    return result, len(opened)


async def test_a_continued_run_reads_no_journal_in_workflow_code(env: WorkflowEnvironment, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    marks: list[dict[str, Any]] = []
    real_keep = getattr(activities, "_keep", None)

    def keep(url: str, run_id: str, mark: dict[str, Any], value: dict[str, Any]) -> None:
        marks.append(mark)
        if real_keep is not None:
            real_keep(url, run_id, mark, value)

    monkeypatch.setattr(activities, "_keep", keep, raising=False)
    result, opened = await continued_run(env, tmp_path, monkeypatch)
    assert result == {"status": "completed", "output": f"read {TURNS} documents"}
    assert opened == 0  # every continued run took its earlier steps from its worker's memory
    assert len(marks) >= 2  # it continued as new, more than once


async def test_a_worker_that_did_not_keep_the_rows_reads_them_from_the_journal(
        env: WorkflowEnvironment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activities, "_kept", lambda url, run_id, mark: None)  # as on another worker
    result, opened = await continued_run(env, tmp_path, monkeypatch)
    assert result == {"status": "completed", "output": f"read {TURNS} documents"}
    assert opened >= 2  # once per continued run: the fallback, in workflow code
