"""Attacks on a SQLite journal's hold, by real processes, counted from the bank's receipts (R22).

A run's holder keeps a record lock on one byte of ``<journal>-holds``; the kernel drops it when
the holder dies. Three ways around that lock were found, each letting a second process run a
live holder's step again (two receipts for one transfer):

(a) the hold file deleted while a run is held: a newcomer creates a new one and finds the run's
    byte free;
(b) a second name for the journal (a hard link): its hold file is another file;
(c) the journal replaced while held: a newcomer writes the run's first row into the new file
    before it holds the run, and a worker that later resumes what the journal holds runs it
    again.

The holder here waits inside the transfer's body (its intent committed) until the test opens a
gate; the tool's receipts file is the bank, the fake provider's billing log the bill.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _report import record
from test_takeover import WORKLOAD

from cuaderno.testing.records import read_records

pytestmark = pytest.mark.xdist_group("crash")

CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, sys.argv[6])
    from takeover_workload import agent, script
    from cuaderno import CuadernoError, ScriptedGateway, Session, SqliteCheckpointer
    from cuaderno.journal.base import CLOSED_STATUSES

    async def one(store, run, receipts, billing, gate):
        gw = ScriptedGateway(script(), billing_log=billing)
        steps = [s async for s in agent(receipts, gate).run("pay bob", session=Session(run, gw, store))]
        return type(steps[-1]).__name__ if steps else "-"

    async def main() -> None:
        db, receipts, billing, gate, mode = sys.argv[1:6]
        try:
            store = SqliteCheckpointer(db)
            try:
                if mode == "run":  # start or resume the run
                    print("done", await one(store, "run", receipts, billing, None if gate == "-" else gate))
                else:  # a worker: resume every open run the journal holds, start none
                    runs = [cp.run_id for cp in store.list_runs() if cp.status not in CLOSED_STATUSES]
                    for run in runs:
                        await one(store, run, receipts, billing, None)
                    print("resumed", len(runs))
            finally:
                store.close()
        except CuadernoError as exc:
            print(type(exc).__name__, str(exc)[:300].replace(chr(10), " "))

    asyncio.run(main())
""")


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "takeover_workload.py").write_text(WORKLOAD)
    return {"dir": tmp_path, "db": tmp_path / "runs.db", "receipts": tmp_path / "receipts.jsonl",
            "billing": tmp_path / "billing.jsonl", "gate": tmp_path / "gate"}


def _start(world: dict[str, Path], db: Path, *, gate: bool, mode: str = "run") -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    args = [str(db), str(world["receipts"]), str(world["billing"]), str(world["gate"]) if gate else "-", mode,
            str(world["dir"])]
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(child: subprocess.Popen[str]) -> str:
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and out.strip(), err[-2000:]
    return out.strip()


def _holder_in_the_tool_body(world: dict[str, Path]) -> subprocess.Popen[str]:
    """A holder that committed the transfer's intent and waits inside its body."""
    child = _start(world, world["db"], gate=True)
    inflight = Path(str(world["gate"]) + ".inflight")
    deadline = time.monotonic() + 60
    while not inflight.exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the holder never reached the tool body"
        time.sleep(0.01)
    return child


def _reap(*children: subprocess.Popen[str]) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()


def _rows_of(db: Path, run_id: str) -> int:
    """The journal rows of a run in the file at ``db`` (read as a plain SQLite file: a copy taken
    without its -wal may not even hold the tables)."""
    if not db.exists():
        return 0
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name='cuaderno_events'").fetchone() is None:
            return 0
        return int(conn.execute("SELECT count(*) FROM cuaderno_events WHERE run_id=?", (run_id,)).fetchone()[0])
    finally:
        conn.close()


def _report(attack: str, receipts: int) -> None:
    record({"test": f"R22 hold tampering: {attack}", "kind": "tool_lookup", "point": "tool body",
            "status": "completed", "kills": 0, "not_reached": 0, "duplicated": max(receipts - 1, 0),
            "rebilled_journaled": 0, "rebilled_in_flight": 0, "violations": int(receipts != 1)})


def test_a_deleted_hold_file_does_not_free_a_live_run(world: dict[str, Path]) -> None:
    holder = _holder_in_the_tool_body(world)
    newcomer = None
    try:
        os.remove(str(world["db"]) + "-holds")  # (a): the holder's lock is now on a file nobody finds
        newcomer = _start(world, world["db"], gate=False)
        verdict = _finish(newcomer)
        world["gate"].touch()
        held = _finish(holder)
    finally:
        _reap(holder, *([newcomer] if newcomer else []))
    receipts = read_records(world["receipts"])
    _report("hold file deleted", len(receipts))
    assert verdict.startswith("RunBusy") and str(holder.pid) in verdict, verdict
    assert held == "done FinalStep"
    assert [r["pid"] for r in receipts] == [holder.pid], "the live run was taken over: the transfer ran twice"


def test_a_second_name_for_the_journal_is_refused(world: dict[str, Path]) -> None:
    holder = _holder_in_the_tool_body(world)
    other = None
    try:
        link = world["dir"] / "same.db"
        os.link(world["db"], link)  # (b): one file, two names, two hold files
        other = _start(world, link, gate=False)
        verdict = _finish(other)
        os.remove(link)
        world["gate"].touch()
        held = _finish(holder)
    finally:
        _reap(holder, *([other] if other else []))
    receipts = read_records(world["receipts"])
    _report("journal hard-linked", len(receipts))
    assert verdict.startswith("JournalLinked"), verdict
    assert held == "done FinalStep"
    assert [r["pid"] for r in receipts] == [holder.pid], "the run ran through both names"


@pytest.mark.parametrize("how", ["moved away", "copy put back"])
def test_a_journal_replaced_while_held_gets_no_row(world: dict[str, Path], how: str) -> None:
    holder = _holder_in_the_tool_body(world)
    newcomer = None
    try:
        for suffix in ("", "-wal", "-shm"):  # (c): the journal moved aside, another file at its path
            if Path(f"{world['db']}{suffix}").exists():
                os.rename(f"{world['db']}{suffix}", f"{world['dir']}/moved.db{suffix}")
        if how == "copy put back":  # a copy of the file as it was on disk (its -wal left out)
            shutil.copyfile(world["dir"] / "moved.db", world["db"])
        newcomer = _start(world, world["db"], gate=False)
        verdict = _finish(newcomer)
        world["gate"].touch()
        held = _finish(holder)
    finally:
        _reap(holder, *([newcomer] if newcomer else []))
    # The holder's writes after the replacement are refused (they would land in a file nobody
    # opens any more); its transfer had been sent once.
    assert held.startswith("JournalReplaced"), held
    assert verdict.startswith("JournalReplaced"), verdict
    assert _rows_of(world["db"], "run") == 0, "a row was written by a process that did not hold the run"
    # Once the holder has exited, a worker resumes whatever the journal at this path holds: a run
    # started there by the refused newcomer would be run again from its first step.
    worker = _start(world, world["db"], gate=False, mode="worker")
    try:
        resumed = _finish(worker)
    finally:
        _reap(worker)
    receipts = read_records(world["receipts"])
    _report(f"journal replaced ({how})", len(receipts))
    # (A copy without the holder's -wal is older than what this machine saw at the path: the
    # anchor refuses it, R21.)
    assert resumed == "resumed 0" or resumed.startswith("JournalRolledBack"), resumed
    assert [r["pid"] for r in receipts] == [holder.pid], "the replaced journal's run ran again"
