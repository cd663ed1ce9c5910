"""Group commit by default: an application's runs on the store :func:`~cuaderno.open_journal`
returns share commits through the store's own group (:func:`cuaderno.journal.shared_group`).

- concurrent runs on one loop make fewer transactions than commits, and journal what they
  journal on the store with group commit off (the kill tests are ``test_group_commit_kill``'s
  ``default`` cases);
- a run alone commits every step at once, in a transaction of its own: the store's
  ``append_group`` is called once per commit, from inside the step (never deferred);
- ``store.group_commit = False`` turns it off: the loop appends to the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cuaderno import Agent, ScriptedGateway, Session, open_journal, tool
from cuaderno.events import StepEvent
from cuaderno.journal import shared_group
from cuaderno.journal._group import GroupBatch

TURNS = 3


@tool(effect_free=True)
def look(n: int) -> str:
    """Look something up."""
    return f"found {n}"


def _agent() -> Agent:
    return Agent(instructions="look things up", tools=[look], max_turns=TURNS + 1)


def _gateway() -> ScriptedGateway:
    return ScriptedGateway([*(ScriptedGateway.call("look", n=i) for i in range(TURNS)), ScriptedGateway.text("done")])


async def _drive(store: Any, run_ids: Sequence[str]) -> None:
    agent = _agent()

    async def one(run_id: str) -> None:
        async for _ in agent.run(f"task {run_id}", session=Session(run_id, _gateway(), store)):
            pass

    await asyncio.gather(*(one(r) for r in run_ids))


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[str]:
    yield str(tmp_path / "runs.db")


def _shape(store: Any, run_id: str) -> list[tuple[str, str, str, int]]:
    return [(ev.step_id, ev.phase, ev.kind, ev.seq) for ev in store.load(run_id)]


def test_concurrent_runs_share_commits_and_journal_as_without(journal: str, tmp_path: Path) -> None:
    runs = [f"r{i}" for i in range(8)]
    store = open_journal(journal)
    try:
        asyncio.run(_drive(store, runs))
        group = shared_group(store)
        assert group is not None and group.appends >= 8 * (2 * TURNS + 1)
        assert group.groups < group.appends / 2  # the runs' commits shared transactions
        grouped = {r: _shape(store, r) for r in runs}
        assert {cp.status for cp in store.list_runs()} == {"completed"}
    finally:
        store.close()
    off = open_journal(str(tmp_path / "off.db"))
    try:
        off.group_commit = False  # type: ignore[attr-defined]
        asyncio.run(_drive(off, runs))
        assert shared_group(off) is None
        assert {r: _shape(off, r) for r in runs} == grouped
    finally:
        off.close()


def test_a_run_alone_commits_each_step_at_once_in_its_own_transaction(journal: str) -> None:
    store = open_journal(journal)
    sizes: list[int] = []
    real = store.append_group  # type: ignore[attr-defined]
    steps_seen: list[int] = []

    def spy(batches: Sequence[GroupBatch]) -> list[list[StepEvent] | Exception]:
        sizes.append(len(batches))
        steps_seen.append(len(steps))
        return list(real(batches))

    steps: list[Any] = []

    async def main() -> None:
        async for step in _agent().run("alone", session=Session("solo", _gateway(), store)):
            steps.append(step)

    try:
        store.append_group = spy  # type: ignore[attr-defined]
        asyncio.run(main())
        group = shared_group(store)
        assert group is not None and group.groups == group.appends == len(sizes)
        assert sizes and set(sizes) == {1}  # one commit, one transaction: nothing waited for company
        # Each commit was written before the step that needed it was yielded (none deferred past it).
        assert steps_seen == sorted(steps_seen) and len(sizes) >= len(steps)
    finally:
        del store.append_group  # type: ignore[attr-defined]
        store.close()
