"""Group commit by default: an application's runs on the store :func:`~cuaderno.open_journal`
returns share commits through the store's own group (:func:`cuaderno.journal.shared_group`).

- concurrent runs on one loop make fewer transactions than commits, and journal what they
  journal on the store with group commit off (the kill tests are ``test_group_commit_kill``'s
  ``default`` cases);
- a run alone commits every step at once through the store's own ``append``, as with group
  commit off (same call, same crash points, no group bookkeeping), never deferred;
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
        assert group is not None and group.appends + group.direct >= 8 * (2 * TURNS + 1)
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


def test_a_run_alone_commits_each_step_at_once_through_the_store_append(journal: str) -> None:
    store = open_journal(journal)
    grouped: list[int] = []
    direct: list[int] = []
    real_group, real_append = store.append_group, store.append  # type: ignore[attr-defined]
    steps: list[Any] = []

    def spy_group(batches: Sequence[GroupBatch]) -> list[list[StepEvent] | Exception]:
        grouped.append(len(batches))
        return list(real_group(batches))

    def spy_append(events: Sequence[StepEvent], **kwargs: Any) -> list[StepEvent]:
        direct.append(len(steps))
        return real_append(events, **kwargs)

    async def main() -> None:
        async for step in _agent().run("alone", session=Session("solo", _gateway(), store)):
            steps.append(step)

    try:
        store.append_group = spy_group  # type: ignore[attr-defined]
        store.append = spy_append  # type: ignore[method-assign]
        asyncio.run(main())
        group = shared_group(store)
        # Every commit of its steps went straight to the store (its first event the loop writes
        # to the store itself, as it always did).
        assert group is not None and len(direct) >= group.direct >= len(steps)
        assert grouped == [] and group.groups == group.appends == 0  # nothing waited for company
        assert direct == sorted(direct)  # each commit made in its step, none deferred past the next
        assert store.checkpoint("solo").status == "completed"  # type: ignore[union-attr]
    finally:
        del store.append_group  # type: ignore[attr-defined]
        del store.append
        store.close()
