"""Opening a run: a closed run follows the version rule, is never taken over, and a refusal writes
nothing (issue 19, items 1, 2 and the first half of 3).

"Nothing written" is proved on the database files themselves (every store closed, so SQLite has
folded its WAL), and "not new" from the fake provider's billing log and the tool's receipts,
both kept outside the journal.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from cuaderno import (
    Agent,
    DrainOnOldWorker,
    FinalStep,
    MemoryCheckpointer,
    Migration,
    Policy,
    ReplayDivergence,
    RunClosed,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    VersionMismatch,
    approve,
    cancel,
    tool,
)
from cuaderno.testing.records import append_synced, read_records

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "journal"))

from _files import journal_files


def agent(receipts: Path, *, instructions: str = "pay", extra: bool = False, currency: bool = False,
          approval: bool = False, max_turns: int = 32) -> Agent:
    """The agent a run starts under, or a changed one: other instructions, one more tool, or a
    changed tool schema (``transfer`` takes a currency)."""
    if currency:
        @tool
        def transfer(to: str, amount: int, currency: str = "EUR") -> dict[str, Any]:
            """Move money (the receipts file is the bank)."""
            append_synced(receipts, {"to": to, "amount": amount})
            return {"ok": True}
    else:
        @tool
        def transfer(to: str, amount: int) -> dict[str, Any]:  # type: ignore[misc]
            """Move money (the receipts file is the bank)."""
            append_synced(receipts, {"to": to, "amount": amount})
            return {"ok": True}

    @tool
    def balance() -> int:
        """Read the balance."""
        return 0

    tools = [transfer, balance] if extra else [transfer]
    return Agent(instructions=instructions, tools=tools, max_turns=max_turns,
                 policy=Policy({"transfer": "require_approval"}) if approval else None)


SCRIPT = [ScriptedGateway.call("transfer", to="bob", amount=5), ScriptedGateway.text("paid")]


async def collect(a: Agent, session: Session) -> list[Any]:
    return [step async for step in a.run("pay bob", session=session)]


async def _completed(db: Path, receipts: Path, billing: Path) -> None:
    with SqliteCheckpointer(db) as store:
        steps = await collect(agent(receipts), Session("r", ScriptedGateway(SCRIPT, billing_log=billing), store))
    assert isinstance(steps[-1], FinalStep) and not steps[-1].replayed


CHANGES = {
    "instructions": {"instructions": "pay, politely"},
    "an added tool": {"extra": True},
    "a changed tool schema": {"currency": True},
}


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_a_completed_run_under_changed_code_is_a_version_mismatch_and_nothing_is_written(
        tmp_path: Path, change: str) -> None:
    """It used to yield the recorded answer (``replayed=True``) as if nothing had changed, while
    the same change on an open run is refused."""
    db, receipts, billing = tmp_path / "runs.db", tmp_path / "receipts", tmp_path / "billing"
    await _completed(db, receipts, billing)
    before = journal_files(db)
    changed = agent(receipts, **CHANGES[change])
    for choice, error in (("refuse", VersionMismatch), ("drain", DrainOnOldWorker)):
        gw = ScriptedGateway(SCRIPT, billing_log=billing)
        with SqliteCheckpointer(db) as store, pytest.raises(error) as info:
            await collect(changed, Session("r", gw, store, on_version_mismatch=choice))  # type: ignore[arg-type]
        assert info.value.recorded != info.value.current and info.value.current == changed.versions()
        assert gw.calls == 0
    assert journal_files(db) == before
    assert len(read_records(billing)) == 2 and len(read_records(receipts)) == 1


@pytest.mark.parametrize("choice", ["resume", "cancel", "migrate"])
async def test_an_explicit_choice_returns_the_recorded_answer_and_says_the_versions_differ(
        tmp_path: Path, choice: str) -> None:
    db, receipts, billing = tmp_path / "runs.db", tmp_path / "receipts", tmp_path / "billing"
    await _completed(db, receipts, billing)
    with SqliteCheckpointer(db) as store:
        recorded = store.checkpoint("r").versions  # type: ignore[union-attr]
    before = journal_files(db)
    migrations: list[Any] = []
    on_mismatch: Any = choice if choice != "migrate" else Migration(
        name="m", migrate=lambda old, new, events: migrations.append(old) or {})
    changed = agent(receipts, instructions="pay, politely")
    gw = ScriptedGateway(SCRIPT, billing_log=billing)
    with SqliteCheckpointer(db) as store:
        steps = await collect(changed, Session("r", gw, store, on_version_mismatch=on_mismatch))
    assert len(steps) == 1 and isinstance(steps[0], FinalStep)
    final = steps[0]
    assert final.replayed and final.output == "paid" and final.data == {"output": "paid", "turn": 1}
    assert final.version_mismatch == {"recorded": recorded, "current": changed.versions()}
    # Nothing was written to the closed run: no migration record, no cancellation, no takeover.
    assert journal_files(db) == before and gw.calls == 0 and migrations == []
    assert len(read_records(billing)) == 2 and len(read_records(receipts)) == 1


async def test_a_completed_run_under_the_same_code_says_nothing_differs(tmp_path: Path) -> None:
    db, receipts, billing = tmp_path / "runs.db", tmp_path / "receipts", tmp_path / "billing"
    await _completed(db, receipts, billing)
    before = journal_files(db)
    with SqliteCheckpointer(db) as store:
        steps = await collect(agent(receipts), Session("r", ScriptedGateway([]), store))
    assert [(s.replayed, s.version_mismatch) for s in steps] == [(True, None)]
    assert journal_files(db) == before


# -- a late resumer ---------------------------------------------------------------------------------


class AfterFirstLoad:
    """The store as the late resumer sees it: another process completes the run right after this
    one's first load (the one its opening checks), before it takes the run over."""

    def __init__(self, store: Any, meanwhile: Any) -> None:
        self.store, self.meanwhile = store, meanwhile

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def load(self, run_id: str) -> Any:
        events = self.store.load(run_id)
        hook, self.meanwhile = self.meanwhile, None
        if hook is not None:
            hook()
        return events


async def _approved(store: Any, receipts: Path, billing: Path | None = None) -> None:
    """A run whose transfer a person approved: open, and anybody may resume it."""
    a = agent(receipts, approval=True)
    await collect(a, Session("r", ScriptedGateway(SCRIPT, billing_log=billing), store))
    approve(store, "r", "t0000.tool00")
    assert store.checkpoint("r").status == "running"


async def test_a_late_resumer_never_takes_over_a_run_completed_while_it_was_opening(tmp_path: Path) -> None:
    """Another loop (here on another thread) completes the run between this loop's checks and
    its takeover. This loop used to take the completed run over (its epoch bumped) and yield its
    answer as new (``replayed=False``)."""
    store, receipts = MemoryCheckpointer(), tmp_path / "receipts"
    await _approved(store, receipts)
    finals: list[Any] = []
    epochs: list[int] = []

    def another_loop_completes_the_run() -> None:
        def run() -> None:
            gw = ScriptedGateway(SCRIPT[1:])
            finals.extend(asyncio.run(collect(agent(receipts, approval=True), Session("r", gw, store))))

        other = threading.Thread(target=run)
        other.start()
        other.join()
        epochs.append(store.checkpoint("r").epoch)  # type: ignore[union-attr]

    gw = ScriptedGateway(SCRIPT[1:])
    late = AfterFirstLoad(store, another_loop_completes_the_run)
    steps = await collect(agent(receipts, approval=True), Session("r", gw, late))  # type: ignore[arg-type]
    assert isinstance(finals[-1], FinalStep) and not finals[-1].replayed  # the other loop's answer
    cp = store.checkpoint("r")
    assert cp is not None and cp.status == "completed" and cp.epoch == epochs[0]  # not taken over after it closed
    assert [(type(s).__name__, s.replayed) for s in steps] == [("FinalStep", True)]
    assert gw.calls == 0 and len(read_records(receipts)) == 1


async def test_a_late_resumer_never_takes_over_a_run_cancelled_while_it_was_opening(tmp_path: Path) -> None:
    """The same race with a cancellation that closes the run (it waits for a person and nobody
    held it): refused as the closed run it now is, its epoch and its cancellation record as the
    canceller left them. It used to be taken over and closed a second time by this loop."""
    store, receipts = MemoryCheckpointer(), tmp_path / "receipts"
    await collect(agent(receipts, approval=True), Session("r", ScriptedGateway(SCRIPT), store))
    assert store.checkpoint("r").status == "suspended"  # type: ignore[union-attr]
    closed: list[Any] = []
    late = AfterFirstLoad(store, lambda: closed.append(cancel(store, "r", "stop", by="ops")))
    gw = ScriptedGateway(SCRIPT[1:])
    with pytest.raises(RunClosed, match="cancelled"):
        await collect(agent(receipts, approval=True), Session("r", gw, late))  # type: ignore[arg-type]
    assert closed[0].status == "cancelled" and store.checkpoint("r") == closed[0]
    assert gw.calls == 0 and read_records(receipts) == []


OTHER_PROCESS = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, sys.argv[4])
    from test_closed_runs import SCRIPT, agent, collect
    from pathlib import Path
    from cuaderno import FinalStep, ScriptedGateway, Session, SqliteCheckpointer

    async def main() -> None:
        db, receipts, billing = sys.argv[1:4]
        with SqliteCheckpointer(db) as store:
            steps = await collect(agent(Path(receipts), approval=True),
                                  Session("r", ScriptedGateway(SCRIPT, billing_log=billing), store))
        print("done", type(steps[-1]).__name__, steps[-1].replayed)

    asyncio.run(main())
""")


async def test_a_run_completed_by_another_process_while_this_one_opened_it_is_answered_as_closed(
        tmp_path: Path) -> None:
    """Two processes, one journal file: the other one completes the run while this one sits
    between its checks and its takeover. Its epoch is not bumped and the journal files are the
    ones the other process left (this one wrote nothing); neither the provider nor the bank saw
    this process."""
    db, receipts, billing = tmp_path / "runs.db", tmp_path / "receipts", tmp_path / "billing"
    with SqliteCheckpointer(db) as store:
        await _approved(store, receipts, billing)
    billed = len(read_records(billing))
    left: dict[str, Any] = {}

    def another_process_completes_the_run() -> None:
        done = subprocess.run([sys.executable, "-c", OTHER_PROCESS, str(db), str(receipts), str(billing),
                               str(Path(__file__).parent)], capture_output=True, text=True, timeout=120)
        assert done.stdout.strip() == "done FinalStep False", done.stderr
        with SqliteCheckpointer(db) as other:
            left["epoch"] = other.checkpoint("r").epoch  # type: ignore[union-attr]
            left["events"] = other.load("r")

    gw = ScriptedGateway(SCRIPT, billing_log=billing)
    with SqliteCheckpointer(db) as store:
        late = AfterFirstLoad(store, another_process_completes_the_run)
        steps = await collect(agent(receipts, approval=True), Session("r", gw, late))  # type: ignore[arg-type]
        assert store.checkpoint("r").epoch == left["epoch"]  # type: ignore[union-attr]
        assert store.load("r") == left["events"]
    assert [(type(s).__name__, s.replayed) for s in steps] == [("FinalStep", True)]
    assert gw.calls == 0 and len(read_records(billing)) == billed + 1  # the other process's final turn
    assert len(read_records(receipts)) == 1


# -- a refused resume writes nothing -----------------------------------------------------------------


async def test_a_resume_refused_as_divergent_leaves_the_journal_byte_identical(tmp_path: Path) -> None:
    """Resumed under other instructions with ``on_version_mismatch="resume"``, the first request
    differs from the recorded one: a ReplayDivergence. It used to be found after the takeover,
    so the refused resume had already bumped the run's epoch (and rewritten its holder)."""
    db, receipts = tmp_path / "runs.db", tmp_path / "receipts"
    with SqliteCheckpointer(db) as store:
        await _approved(store, receipts)
    before = journal_files(db)
    gw = ScriptedGateway(SCRIPT[1:])
    changed = agent(receipts, instructions="pay, politely", approval=True)
    with SqliteCheckpointer(db) as store, pytest.raises(ReplayDivergence, match="model request"):
        await collect(changed, Session("r", gw, store, on_version_mismatch="resume"))
    assert journal_files(db) == before and gw.calls == 0 and read_records(receipts) == []
    # The same resume under the run's own agent goes on from there.
    with SqliteCheckpointer(db) as store:
        steps = await collect(agent(receipts, approval=True), Session("r", ScriptedGateway(SCRIPT[1:]), store))
        assert store.checkpoint("r").epoch == 2  # type: ignore[union-attr]  # the first run's, then this one's
    assert isinstance(steps[-1], FinalStep) and not steps[-1].replayed and len(read_records(receipts)) == 1


@pytest.mark.parametrize("migrated", [False, True])
async def test_a_resume_with_fewer_turns_than_recorded_leaves_the_journal_byte_identical(
        tmp_path: Path, migrated: bool) -> None:
    """Turn 0 read the balance, turn 1's transfer waits for a person; resumed with max_turns=1
    the loop would end without reaching turn 1: a ReplayDivergence, found before the takeover
    (it used to be found after replaying turn 0, with the run already taken over) and, when the
    resume migrates the run, before the migration is recorded."""
    db, receipts = tmp_path / "runs.db", tmp_path / "receipts"
    script = [ScriptedGateway.call("balance"), *SCRIPT]
    with SqliteCheckpointer(db) as store:
        await collect(agent(receipts, extra=True, approval=True), Session("r", ScriptedGateway(script), store))
        assert store.checkpoint("r").status == "suspended"  # type: ignore[union-attr]
    before = journal_files(db)
    gw = ScriptedGateway(script)
    calls: list[Any] = []
    choice: Any = Migration(name="m", migrate=lambda old, new, events: calls.append(old) or {}) if migrated \
        else "refuse"
    fewer = agent(receipts, extra=True, approval=True, max_turns=1, instructions="pay, v2" if migrated else "pay")
    with SqliteCheckpointer(db) as store, pytest.raises(ReplayDivergence, match="max_turns=1 without reaching"):
        await collect(fewer, Session("r", gw, store, on_version_mismatch=choice))
    assert journal_files(db) == before and gw.calls == 0 and calls == []


HOLDS = "import sys; from cuaderno.journal import _lease; print(_lease.lock(sys.argv[1], sys.argv[2]))"


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_the_loops_takeover_refuses_a_closed_run_in_its_own_transaction(tmp_path: Path, backend: str) -> None:
    """``acquire(open_only=True)``: what the loop relies on when a run closes between its checks
    and its takeover. Refused with RunClosed; the epoch, the summary and the run's lock are left
    as they were (a lock taken and never given back would keep the run from every other process)."""
    store: Any = MemoryCheckpointer() if backend == "memory" else SqliteCheckpointer(tmp_path / "runs.db")
    try:
        await collect(agent(tmp_path / "receipts"), Session("r", ScriptedGateway(SCRIPT), store))
        before = store.checkpoint("r")
        with pytest.raises(RunClosed, match="already ended"):
            store.acquire("r", "late", open_only=True)
        assert store.checkpoint("r") == before
        if backend == "sqlite":
            free = subprocess.run([sys.executable, "-c", HOLDS, store.path, "r"], capture_output=True, text=True)
            assert free.stdout.strip() == "True", free.stderr
        assert store.acquire("r", "compensate") == before.epoch + 1  # without it, as before (compensate)
    finally:
        store.close()
