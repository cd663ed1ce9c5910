"""Group commit (``cuaderno.journal._group``): the appends of concurrent runs in one transaction.

What is checked, on SQLite and (marked ``postgres``) on the machine's PostgreSQL:

- appends that queue while a group commits are written together (fewer transactions than
  appends), by threads and by tasks of one event loop, and every one is durable and chained;
- each append keeps its own outcome: one refused in a group (a fenced epoch, a conflicting key)
  is refused alone, and the others of its group are written;
- agent runs through a ``GroupCommit`` journal exactly what they journal through the store alone;
- a store opened on a ``-wal`` left by a killed process takes concurrent first writes from
  several threads (it swapped its read-only connection for the writer under a plain lock, and
  the others wrote on the read-only or the closed connection).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture

from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, open_journal, tool
from cuaderno.errors import FencedOut, JournalConflict
from cuaderno.events import StepEvent
from cuaderno.journal._group import GroupBatch, GroupCommit, SupportsGroupAppend
from cuaderno.journal.base import Checkpointer


def _ev(run: str, step: str, phase: str = "intent", **payload: Any) -> StepEvent:
    return StepEvent(run_id=run, step_id=step, phase=phase, kind="tool", payload=payload)


def _start(run: str) -> StepEvent:
    return StepEvent(run_id=run, step_id="run", phase="start", kind="run", payload={"task": "t"})


class Held:
    """The store, with its first group held until ``n`` more appends are in it or wait in the
    queue, so that they make at most two groups whatever the machine's speed."""

    def __init__(self, store: Any, group: Callable[[], GroupCommit], n: int) -> None:
        self.store, self.group, self.n = store, group, n
        self.path = getattr(store, "path", None)
        self.sizes: list[int] = []
        self.armed = True

    def append_group(self, batches: Sequence[GroupBatch]) -> list[list[StepEvent] | Exception]:
        if not self.armed:
            return list(self.store.append_group(batches))
        if not self.sizes:
            while len(batches) + len(self.group()._queue) < self.n + 1:  # everyone has queued
                threading.Event().wait(0.001)
        self.sizes.append(len(batches))
        return list(self.store.append_group(batches))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _held(store: Any, n: int) -> tuple[GroupCommit, Held]:
    box: list[GroupCommit] = []
    held = Held(store, lambda: box[0], n)
    assert isinstance(held, Checkpointer) and isinstance(held, SupportsGroupAppend)
    box.append(GroupCommit(held))
    return box[0], held


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        s: Any = SqliteCheckpointer(tmp_path / "runs.db")
    else:
        names = request.getfixturevalue("pg_schemas")
        names.append(new_schema())
        s = open_journal(schema_url(names[-1]))
    try:
        yield s
    finally:
        s.close()


def test_threads_share_a_transaction(store: Any) -> None:
    runs = 12
    for r in range(runs):
        store.append([_start(f"r{r}")])
    group, held = _held(store, runs - 1)
    out: dict[int, list[StepEvent]] = {}

    def one(r: int) -> None:
        out[r] = group.append([_ev(f"r{r}", "s0", who=r), _ev(f"r{r}", "s0", "result", who=r)])

    threads = [threading.Thread(target=one, args=(r,)) for r in range(runs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The first alone (or with those that queued before its leader took the queue), the rest
    # queued behind it, together.
    assert len(held.sizes) <= 2 and sum(held.sizes) == runs
    assert group.appends == runs and group.groups <= 2
    for r in range(runs):
        assert [e.seq for e in out[r]] == [2, 3]
        assert [(e.step_id, e.phase) for e in store.load(f"r{r}")] == [("run", "start"), ("s0", "intent"),
                                                                        ("s0", "result")]


def test_tasks_of_one_loop_share_a_transaction(store: Any) -> None:
    runs = 10
    group, held = _held(store, runs - 1)
    held.armed = False

    async def one(r: int) -> list[StepEvent]:
        return await group.append_async([_start(f"r{r}")])

    async def main() -> list[list[StepEvent]]:
        # A run appending alone commits at once; once two runs have appended, an append waits for
        # the end of the loop's iteration, and the runs stepped in it share one transaction.
        await one(-1)
        await one(-2)
        held.armed = True
        return await asyncio.gather(*(one(r) for r in range(runs)))

    out = asyncio.run(main())
    assert len(held.sizes) <= 2 and sum(held.sizes) == runs
    assert [o[0].seq for o in out] == [1] * runs
    assert {cp.run_id for cp in store.list_runs()} == {f"r{r}" for r in range(-2, runs)}


def test_a_run_alone_commits_on_its_loop(store: Any) -> None:
    group = GroupCommit(store)
    loop_thread = threading.get_ident()
    seen: list[int] = []
    real = store.append_group

    def spy(batches: Sequence[GroupBatch]) -> list[list[StepEvent] | Exception]:
        seen.append(threading.get_ident())
        return list(real(batches))

    store.append_group = spy

    async def main() -> None:
        for i in range(5):
            await group.append_async([_ev("solo", f"s{i}")] if i else [_start("solo")])

    try:
        asyncio.run(main())
    finally:
        del store.append_group
    assert seen == [loop_thread] * 5
    assert len(store.load("solo")) == 5


def test_runs_stepped_in_one_loop_iteration_share_one_transaction_on_the_loop(store: Any) -> None:
    """No thread and no timer: the appends made while the loop steps its ready runs are written
    together at the end of that iteration, on the loop's own thread."""
    group = GroupCommit(store)
    loop_thread = threading.get_ident()
    calls: list[tuple[int, int]] = []
    real = store.append_group

    def spy(batches: Sequence[GroupBatch]) -> list[list[StepEvent] | Exception]:
        calls.append((threading.get_ident(), len(batches)))
        return list(real(batches))

    store.append_group = spy

    async def one(r: int) -> None:
        await group.append_async([_start(f"r{r}")])
        for i in range(3):
            await group.append_async([_ev(f"r{r}", f"s{i}")])

    async def main() -> None:
        await group.append_async([_start("warm-a")])
        await group.append_async([_start("warm-b")])  # two runs: no longer alone
        calls.clear()
        await asyncio.gather(*(one(r) for r in range(12)))

    try:
        asyncio.run(main())
    finally:
        del store.append_group
        group.close()
    assert calls == [(loop_thread, 12)] * 4, calls
    assert group._committer is None  # never needed


def test_a_caller_blocked_in_append_on_the_loop_is_not_left_behind_a_deferred_group(store: Any) -> None:
    """A loop's own synchronous append (a run's last commit) while other runs' appends wait for
    the end of the iteration: it leads, writes them with its own, and nothing waits forever."""
    group = GroupCommit(store, close_store=False)

    async def deferred(r: int) -> list[StepEvent]:
        return await group.append_async([_start(f"d{r}")])

    async def main() -> tuple[list[list[StepEvent]], list[StepEvent]]:
        await group.append_async([_start("warm-a")])
        await group.append_async([_start("warm-b")])
        tasks = [asyncio.ensure_future(deferred(r)) for r in range(3)]
        await asyncio.sleep(0)  # the three are queued, their flush scheduled
        mine = group.append([_start("sync")])
        return await asyncio.wait_for(asyncio.gather(*tasks), 10), mine

    try:
        waited, mine = asyncio.run(main())
    finally:
        group.close()
    assert [w[0].seq for w in waited] == [1, 1, 1] and mine[0].seq == 1
    assert {cp.run_id for cp in store.list_runs()} >= {"d0", "d1", "d2", "sync"}


def test_the_store_capabilities_are_the_groups_and_closing_can_leave_it_open(tmp_path: Path) -> None:
    from cuaderno.journal.base import SupportsClaims, SupportsRebuild, SupportsTail

    class Bare:
        """A Checkpointer with no optional capability."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def append(self, events: Any, *, epoch: Any = None, expect_seq: Any = None) -> Any:
            return self.inner.append(events, epoch=epoch, expect_seq=expect_seq)

        def load(self, run_id: str) -> Any:
            return self.inner.load(run_id)

        def checkpoint(self, run_id: str) -> Any:
            return self.inner.checkpoint(run_id)

        def list_runs(self, *, status: Any = None, limit: int = 100) -> Any:
            return self.inner.list_runs(status=status, limit=limit)

        def acquire(self, run_id: str, owner: str, *, force: bool = False, open_only: bool = False) -> int:
            return int(self.inner.acquire(run_id, owner, force=force, open_only=open_only))

        def release(self, run_id: str, epoch: int) -> None:
            self.inner.release(run_id, epoch)

        def close(self) -> None:
            self.inner.close()

    sqlite = SqliteCheckpointer(tmp_path / "runs.db")
    group = GroupCommit(sqlite, close_store=False)
    # Snapshots (tail reads), a worker's claims and summary rebuilds reach the store through the group.
    assert isinstance(group, SupportsTail) and isinstance(group, SupportsClaims) and isinstance(group, SupportsRebuild)
    group.append([_start("r1")])
    assert [cp.run_id for cp in group.open_runs()] == ["r1"]
    group.close()
    assert sqlite.checkpoint("r1") is not None  # still open
    sqlite.close()
    bare = Bare(SqliteCheckpointer(tmp_path / "bare.db"))
    assert isinstance(bare, Checkpointer)
    plain = GroupCommit(bare)
    assert not isinstance(plain, SupportsTail) and not isinstance(plain, SupportsClaims)
    plain.close()


def test_a_refused_append_is_refused_alone(store: Any) -> None:
    for r in ("a", "b", "c"):
        store.append([_start(r)])
    epoch = store.acquire("b", "me")
    store.append([_ev("c", "s0", x=1)])
    outcomes = store.append_group([
        GroupBatch([_ev("a", "s0")]),
        GroupBatch([_ev("b", "s0")], epoch=epoch - 1),  # a stale holder
        GroupBatch([_ev("c", "s0", x=2)]),  # another event under a stored key
        GroupBatch([_ev("b", "s1")], epoch=epoch),
    ])
    assert isinstance(outcomes[1], FencedOut) and isinstance(outcomes[2], JournalConflict)
    assert [e.step_id for e in outcomes[0]] == ["s0"] and [e.step_id for e in outcomes[3]] == ["s1"]  # type: ignore[union-attr]
    assert [e.step_id for e in store.load("a")] == ["run", "s0"]
    assert [e.step_id for e in store.load("b")] == ["run", "s1"]
    assert [e.payload for e in store.load("c")][1] == {"x": 1}


def test_group_errors_reach_their_own_callers(store: Any) -> None:
    store.append([_start("a")])
    group = GroupCommit(store)
    store.append([_ev("a", "s0", x=1)])
    with pytest.raises(JournalConflict):
        group.append([_ev("a", "s0", x=2)])
    assert group.append([_ev("a", "s1")])[0].seq == 3

    async def conflict() -> None:
        await group.append_async([_ev("a", "s0", x=3)])

    with pytest.raises(JournalConflict):
        asyncio.run(conflict())


@tool(idempotent=True)
def note(text: str) -> str:
    """Take a note."""
    return f"noted {text}"


async def _drive(store: Checkpointer, run: str, turns: int) -> int:
    gateway = ScriptedGateway([*(ScriptedGateway.call("note", text=f"n{i}") for i in range(turns)),
                               ScriptedGateway.text("done")])
    n = 0
    agent = Agent(instructions="group", tools=[note], max_turns=turns + 1)
    async for _ in agent.run("task", session=Session(run, gateway, store)):
        n += 1
    return n


def _shape(store: Checkpointer, run: str) -> list[tuple[str, str, str]]:
    return [(e.step_id, e.phase, e.kind) for e in store.load(run)]


@pytest.mark.parametrize("where", ["one loop", "threads"])
def test_agent_runs_journal_the_same_through_a_group(where: str, tmp_path: Path) -> None:
    alone = SqliteCheckpointer(tmp_path / "alone.db")
    asyncio.run(_drive(alone, "ref", 5))
    group = GroupCommit(SqliteCheckpointer(tmp_path / "group.db"))
    runs = [f"r{i}" for i in range(8)]
    if where == "one loop":
        async def main() -> list[int]:
            return await asyncio.gather(*(_drive(group, r, 5) for r in runs))
        asyncio.run(main())
    else:
        threads = [threading.Thread(target=lambda r=r: asyncio.run(_drive(group, r, 5))) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert group.groups < group.appends  # some commits were shared
    for r in runs:
        cp = group.checkpoint(r)
        assert cp is not None and cp.status == "completed"
        assert _shape(group, r) == _shape(alone, "ref")
    group.close()
    alone.close()


_KILLED_WRITER = """
import os, signal, sys
from cuaderno import SqliteCheckpointer, StepEvent
s = SqliteCheckpointer(sys.argv[1])
for r in range(4):
    s.append([StepEvent(run_id=f"r{r}", step_id="run", phase="start", kind="run", payload={})])
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_first_writes_from_threads_after_a_kill(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    for rep in range(3):
        db = tmp_path / f"j{rep}.db"
        done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(db)], env={**os.environ}, check=False)
        assert done.returncode == -signal.SIGKILL
        assert os.path.getsize(str(db) + "-wal") > 0  # what the killed process committed is in the -wal
        store = SqliteCheckpointer(db)
        barrier = threading.Barrier(8)

        def write(i: int, store: SqliteCheckpointer = store, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                for k in range(4):
                    store.append([_ev(f"r{i % 4}", f"s{i}.{k}")])
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(len(store.load(f"r{r}")) for r in range(4)) == 4 + 8 * 4
        store.close()
    assert errors == []


def test_runs_through_a_group_write_snapshots_as_alone(tmp_path: Path) -> None:
    """Snapshots need the store's tail reads (SupportsTail); a group that hid them made every run
    it carried resume by replaying its whole journal (a worker's runs, since workers group)."""
    turns = 140  # 2 rows a turn: past the 256 rows after which the loop writes a snapshot

    async def main(store: Checkpointer) -> None:
        await asyncio.gather(*(_drive(store, f"r{i}", turns) for i in range(2)))

    alone = SqliteCheckpointer(tmp_path / "alone.db")
    asyncio.run(main(alone))
    group = GroupCommit(SqliteCheckpointer(tmp_path / "group.db"))
    asyncio.run(main(group))
    try:
        for run in ("r0", "r1"):
            snaps = [e.phase for e in group.load(run) if e.kind == "snapshot"]
            assert snaps and snaps == [e.phase for e in alone.load(run) if e.kind == "snapshot"], snaps
    finally:
        group.close()
        alone.close()
