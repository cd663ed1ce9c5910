"""Child episodes under Temporal, one worker in this process: the same outcomes as locally.

A model that re-reads forever ends the episode on its turn limit; bad input (an unknown episode,
a decide that returns no Decision, an apply refused, an apply of unknown fate without a lookup)
gives a typed error or a counted end, with nothing applied twice; a parent started again under
the same id (after it completed, or terminated mid-episode) reads its passes and decisions back
from cuaderno's journal and re-attaches to its children there (0 model calls billed again,
nothing decided or applied twice).
"""

from __future__ import annotations

import asyncio
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from cuaderno import ErrorClass, ToolError
from cuaderno.journal import open_journal
from cuaderno.temporal import EpisodeInput, EpisodeWorkflow, build_episode_worker
from cuaderno.testing.records import read_records

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "episodes"
sys.path.insert(0, str(EXAMPLES))

import developer_agent as dev  # noqa: E402

POLICY = "[activities]\nheartbeat_s = 1\n"


@asynccontextmanager
async def worker(env: WorkflowEnvironment, tmp_path: Path, scenario: str = "fix", *,
                 decide: Callable[..., Any] | None = None, apply: Callable[..., Any] | None = None,
                 lookup: Callable[..., Any] | None | str = "default",
                 gateway: Callable[[], Any] | None = None) -> AsyncIterator[str]:
    repo, receipts = tmp_path / "repo", tmp_path / "receipts.jsonl"
    policy = tmp_path / "effects.toml"
    policy.write_text(POLICY)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    async with build_episode_worker(env.client, dev.episode(), task_queue=queue, snapshot=tmp_path / "snapshot",
                                    decide=decide or dev.decide_for(repo), apply=apply or dev.apply_for(repo, receipts),
                                    lookup=dev.lookup_for(repo, receipts) if lookup == "default" else lookup,
                                    journal_url=f"sqlite:///{tmp_path / 'j.db'}", effect_policy=policy,
                                    gateway_factory=gateway or (lambda: dev.scripted(
                                        scenario, tmp_path / "billing.jsonl", stripe=False))):
        yield queue


async def start(env: WorkflowEnvironment, queue: str, run_id: str, episode: str = "fix") -> Any:
    return await env.client.execute_workflow(EpisodeWorkflow.run, EpisodeInput(episode=episode, task=dev.TASK),
                                             id=run_id, task_queue=queue)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    dev.make_repo(tmp_path)
    return tmp_path


async def test_a_model_that_rereads_forever_ends_on_the_turn_limit(env: WorkflowEnvironment, workdir: Path) -> None:
    async with worker(env, workdir, "loop") as queue:
        result = await start(env, queue, "dev-loop")
    assert (result["status"], result["reason"], result["turns"], len(result["passes"])) == (
        "exhausted", "turns_per_pass", dev.BUDGETS.turns_per_pass, 1)
    assert len(read_records(workdir / "billing.jsonl")) == dev.BUDGETS.turns_per_pass
    assert read_records(workdir / "receipts.jsonl") == []
    cp = open_journal(f"sqlite:///{workdir / 'j.db'}").checkpoint("dev-loop")
    assert cp is not None and cp.status == "failed" and cp.outcome["budget"] == "turns_per_pass"  # type: ignore[index]


async def test_a_parent_started_again_after_it_ended_answers_from_the_journal(
        env: WorkflowEnvironment, workdir: Path) -> None:
    async with worker(env, workdir) as queue:
        first = await start(env, queue, "dev-again")
        billed = len(read_records(workdir / "billing.jsonl"))
        again = await start(env, queue, "dev-again")  # a new workflow run, the same run id
    assert first["status"] == again["status"] == "applied" and billed == 8
    assert len(read_records(workdir / "billing.jsonl")) == 8  # nothing ran again: the journal says it ended
    assert len(read_records(workdir / "receipts.jsonl")) == 1
    assert again["receipt"] == first["receipt"] and again["turns"] == first["turns"] == 8


async def test_an_unknown_episode_fails_the_workflow_with_a_usage_error(env: WorkflowEnvironment,
                                                                        workdir: Path) -> None:
    async with worker(env, workdir) as queue:
        with pytest.raises(WorkflowFailureError) as caught:
            await start(env, queue, "dev-unknown", episode="nope")
    assert isinstance(caught.value.cause, ApplicationError) and caught.value.cause.type == "UsageError"
    assert read_records(workdir / "billing.jsonl") == []


async def test_a_decide_that_returns_no_decision_fails_typed_and_applies_nothing(
        env: WorkflowEnvironment, workdir: Path) -> None:
    async with worker(env, workdir, decide=lambda patch: "apply it") as queue:
        with pytest.raises(WorkflowFailureError) as caught:
            await start(env, queue, "dev-badecide")
    assert isinstance(caught.value.cause, ApplicationError) and caught.value.cause.type == "UsageError"
    assert read_records(workdir / "receipts.jsonl") == []
    journal = open_journal(f"sqlite:///{workdir / 'j.db'}")
    assert journal.checkpoint("dev-badecide/fix.pass02") is not None  # pass 2 ran: its proposal was decided on
    assert journal.checkpoint("dev-badecide") is None or not any(
        e.phase == "decision" and e.step_id == "fix.pass02" for e in journal.load("dev-badecide"))


async def test_a_decide_that_raises_fails_the_workflow_and_applies_nothing(env: WorkflowEnvironment,
                                                                         workdir: Path) -> None:
    def broken(patch: Any) -> Any:
        raise KeyError("the check's configuration")

    async with worker(env, workdir, decide=broken) as queue:
        with pytest.raises(WorkflowFailureError) as caught:
            await start(env, queue, "dev-broken-decide")
    assert isinstance(caught.value.cause, ApplicationError) and caught.value.cause.type == "DecideFailed"
    assert read_records(workdir / "receipts.jsonl") == []


async def test_an_apply_refused_ends_the_episode_failed_with_nothing_applied(env: WorkflowEnvironment,
                                                                             workdir: Path) -> None:
    calls: list[str] = []

    def refuse(patch: Any, key: str) -> Any:
        calls.append(key)
        raise ToolError("calc.py changed since the snapshot", error_class=ErrorClass.CONFLICT)

    async with worker(env, workdir, apply=refuse) as queue:
        result = await start(env, queue, "dev-refused")
    assert (result["status"], result["reason"], len(calls)) == ("failed", "apply_failed", 1)
    cp = open_journal(f"sqlite:///{workdir / 'j.db'}").checkpoint("dev-refused")
    assert cp is not None and cp.status == "failed"


async def test_an_apply_of_unknown_fate_without_lookup_stops_needs_human(env: WorkflowEnvironment,
                                                                        workdir: Path) -> None:
    calls: list[str] = []

    def reset(patch: Any, key: str) -> Any:
        calls.append(key)
        raise OSError("connection reset while writing")  # nobody knows whether it happened

    async with worker(env, workdir, apply=reset, lookup=None) as queue:
        result = await start(env, queue, "dev-unknown-fate")
    # The retried activity finds the intent without a receipt and no lookup: it does not apply again.
    assert result["status"] == "needs_human" and result["step_id"] == "fix.pass03.apply" and len(calls) == 1
    cp = open_journal(f"sqlite:///{workdir / 'j.db'}").checkpoint("dev-unknown-fate")
    assert cp is not None and cp.status == "needs_human" and list(cp.uncertain) == ["fix.pass03.apply"]


async def test_a_parent_terminated_mid_episode_and_started_again_redoes_nothing(
        env: WorkflowEnvironment, workdir: Path) -> None:
    # The parent is terminated while it decides pass 3 (its child workflow completed). Started
    # again under the same id, it reads passes 1 and 2 and their decisions back from cuaderno's
    # journal (pass 2 is not decided again), pass 3's child workflow runs again under its id and
    # answers from the journal (0 generations billed), and the patch is applied once.
    reached, release = threading.Event(), threading.Event()
    decided: list[str] = []
    check = dev.decide_for(workdir / "repo")

    def decide(patch: Any) -> Any:
        decided.append(patch.new)
        if patch.new == "return a + b" and not release.is_set():
            reached.set()
            release.wait(60)
        return check(patch)

    async with worker(env, workdir, decide=decide) as queue:
        handle = await env.client.start_workflow(EpisodeWorkflow.run, EpisodeInput(episode="fix", task=dev.TASK),
                                                 id="dev-terminated", task_queue=queue)
        assert await asyncio.to_thread(reached.wait, 60)
        await handle.terminate("an operator stopped it")
        release.set()
        assert len(read_records(workdir / "billing.jsonl")) == 8
        result = await start(env, queue, "dev-terminated")
    assert result["status"] == "applied" and len(result["passes"]) == 3
    assert decided == ["return a * b", "return a + b", "return a + b"]  # pass 2 decided once
    assert len(read_records(workdir / "billing.jsonl")) == 8  # pass 3's child answered from the journal
    assert len(read_records(workdir / "receipts.jsonl")) == 1


async def test_a_parent_cancelled_while_it_decides_closes_cancelled_and_applies_nothing(
        env: WorkflowEnvironment, workdir: Path) -> None:
    reached, release = threading.Event(), threading.Event()
    check = dev.decide_for(workdir / "repo")

    def decide(patch: Any) -> Any:
        reached.set()
        release.wait(30)
        return check(patch)

    async with worker(env, workdir, decide=decide) as queue:
        handle = await env.client.start_workflow(EpisodeWorkflow.run, EpisodeInput(episode="fix", task=dev.TASK),
                                                 id="dev-cancelled", task_queue=queue)
        assert await asyncio.to_thread(reached.wait, 60)  # pass 2's proposal is being decided
        await handle.cancel()
        result = await handle.result()
        release.set()
    assert result["status"] == "cancelled"
    assert len(read_records(workdir / "billing.jsonl")) == 6 and read_records(workdir / "receipts.jsonl") == []
    journal = open_journal(f"sqlite:///{workdir / 'j.db'}")
    cp = journal.checkpoint("dev-cancelled")
    assert cp is not None and cp.status == "cancelled"
    assert journal.checkpoint("dev-cancelled/fix.pass03") is None  # no pass started after the cancellation


class Stalling:
    """The scripted provider, except that its ``stall_at``-th request waits (a slow generation)."""

    def __init__(self, inner: Any, stall_at: int) -> None:
        self.inner, self.stall_at, self.n = inner, stall_at, 0
        self.reached = threading.Event()

    async def complete(self, request: Any, *, idempotency_key: str) -> Any:
        self.n += 1
        if self.n == self.stall_at:
            self.reached.set()
            await asyncio.sleep(60)
        return await self.inner.complete(request, idempotency_key=idempotency_key)


async def test_a_parent_cancelled_while_its_child_calls_the_model_closes_both_cancelled(
        env: WorkflowEnvironment, workdir: Path) -> None:
    gateway = Stalling(dev.scripted("fix", workdir / "billing.jsonl", stripe=False), stall_at=5)
    async with worker(env, workdir, gateway=lambda: gateway) as queue:
        handle = await env.client.start_workflow(EpisodeWorkflow.run, EpisodeInput(episode="fix", task=dev.TASK),
                                                 id="dev-cancel-child", task_queue=queue)
        assert await asyncio.to_thread(gateway.reached.wait, 60)  # pass 2's second generation in flight
        await handle.cancel()
        result = await handle.result()
    assert result["status"] == "cancelled", result
    assert len(read_records(workdir / "billing.jsonl")) == 4 and read_records(workdir / "receipts.jsonl") == []
    journal = open_journal(f"sqlite:///{workdir / 'j.db'}")
    parent, child = journal.checkpoint("dev-cancel-child"), journal.checkpoint("dev-cancel-child/fix.pass02")
    assert parent is not None and parent.status == "cancelled"
    assert child is not None and child.status == "cancelled"  # the local record, in the child's run too
    assert journal.checkpoint("dev-cancel-child/fix.pass03") is None
