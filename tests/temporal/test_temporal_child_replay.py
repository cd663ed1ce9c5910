"""Recorded histories of a child episode (the parent workflow and its three child workflows) replay
on every run with temporalio's Replayer; a change to how a pass's child workflow id is derived
breaks replay.

``histories/episodes/`` was recorded from the developer agent's ``fix`` episode (regenerate with
``CUADERNO_RECORD_HISTORY=1``, only when a change is meant to break old histories — it never is:
workflow and activity names, inputs and child workflow ids are forever).
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from cuaderno.temporal import EpisodeInput, EpisodeWorkflow, build_episode_worker
from cuaderno.temporal._child import EpisodeChildWorkflow, register_episode

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "episodes"
sys.path.insert(0, str(EXAMPLES))

import developer_agent as dev  # noqa: E402

HISTORIES = Path(__file__).parent / "histories" / "episodes"
PARENT = "dev-recorded"
WORKFLOWS = [EpisodeWorkflow, EpisodeChildWorkflow]


def registered(tmp_path: Path) -> None:
    dev.make_repo(tmp_path)
    register_episode(dev.episode(), tmp_path / "snapshot")


def recorded(path: Path) -> WorkflowHistory:
    workflow_id = PARENT if path.stem == "parent" else f"{PARENT}/fix.{path.stem}"
    return WorkflowHistory.from_json(workflow_id, path.read_text())


def test_the_recorded_histories_are_there() -> None:
    assert sorted(p.name for p in HISTORIES.glob("*.json")) == ["parent.json", "pass01.json", "pass02.json",
                                                                 "pass03.json"]


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.name)
async def test_every_recorded_episode_history_replays(tmp_path: Path, path: Path) -> None:
    registered(tmp_path)
    result = await Replayer(workflows=WORKFLOWS).replay_workflow(recorded(path), raise_on_replay_failure=False)
    assert result.replay_failure is None


async def test_a_child_workflow_id_derived_otherwise_breaks_replay(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from cuaderno.episodes import _parent as module

    registered(tmp_path)
    monkeypatch.setattr(module._ParentRun, "_child_id", lambda self, n: f"{self.run_id}:pass{n}")
    with pytest.raises(NondeterminismError):
        await Replayer(workflows=WORKFLOWS).replay_workflow(recorded(HISTORIES / "parent.json"))


@pytest.mark.skipif(os.environ.get("CUADERNO_RECORD_HISTORY") != "1", reason="records the histories on demand")
async def test_record_episode_histories(env: WorkflowEnvironment, tmp_path: Path) -> None:
    dev.make_repo(tmp_path)
    repo, receipts = tmp_path / "repo", tmp_path / "receipts.jsonl"
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with build_episode_worker(env.client, dev.episode(), task_queue=queue, snapshot=tmp_path / "snapshot",
                                    decide=dev.decide_for(repo), apply=dev.apply_for(repo, receipts),
                                    lookup=dev.lookup_for(repo, receipts),
                                    journal_url=f"sqlite:///{tmp_path / 'j.db'}",
                                    gateway_factory=lambda: dev.scripted("fix", tmp_path / "billing.jsonl")):
        handle = await env.client.start_workflow(EpisodeWorkflow.run, EpisodeInput(episode="fix", task=dev.TASK),
                                                 id=PARENT, task_queue=queue)
        result = await handle.result()
        assert result["status"] == "applied"
        HISTORIES.mkdir(parents=True, exist_ok=True)
        (HISTORIES / "parent.json").write_text((await handle.fetch_history()).to_json())
        for n in (1, 2, 3):
            child = env.client.get_workflow_handle(f"{PARENT}/fix.pass{n:02d}")
            (HISTORIES / f"pass{n:02d}.json").write_text((await child.fetch_history()).to_json())
