"""A claim on PostgreSQL hands the worker each run's summary as its takeover read it (with the
run's row locked), at the epoch it was taken at, so the worker does not read it again (one round
trip per run taken); SQLite's claim reads none, and the worker reads each run's as before."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from cuaderno import Agent, ScriptedGateway
from cuaderno.flow import submit
from cuaderno.journal import canonical_versions, queue_of
from cuaderno.worker import Worker

agent = Agent(instructions="claim me", tools=[], name="pgq-claim-summaries")


def test_a_claim_carries_each_taken_runs_summary_at_its_new_epoch(store: Any) -> None:
    runs = [submit(store, agent, f"task {i}").run_id for i in range(3)]
    claim = queue_of(store).claim(versions=canonical_versions(agent.versions()), owner="w", free=3, skip=set())
    assert sorted(r for r, _ in claim.taken) == sorted(runs)
    if type(store).__name__ != "PostgresCheckpointer":
        assert claim.summaries == {}
    else:
        assert set(claim.summaries) == set(runs)
        for run_id, epoch in claim.taken:
            stored = store.checkpoint(run_id)
            assert claim.summaries[run_id] == stored and claim.summaries[run_id].epoch == epoch == stored.epoch
    for run_id, epoch in claim.taken:
        store.release(run_id, epoch)


def test_a_worker_drives_claimed_runs_without_reading_their_summaries_again(store: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [submit(store, agent, f"task {i}").run_id for i in range(4)]
    after_claim: list[str] = []  # the summaries the worker read right after its claim
    checkpoint = type(store).checkpoint

    def counted(self: Any, run_id: str) -> Any:
        if sys._getframe(1).f_code.co_name == "_claim_queued":
            after_claim.append(run_id)
        return checkpoint(self, run_id)

    monkeypatch.setattr(type(store), "checkpoint", counted)
    worker = Worker(store, agent, lambda: ScriptedGateway(lambda request: ScriptedGateway.text("done"), cost=None),
                    concurrency=4, log=None)
    stats = worker.run_sync(until_idle=True)
    assert stats.completed == 4
    assert all(store.checkpoint(r).status == "completed" for r in runs)
    pg = type(store).__name__ == "PostgresCheckpointer"
    assert sorted(after_claim) == ([] if pg else sorted(runs))
