"""Two processes and one run: a live holder is never taken over; a dead one is, at once.

Fencing refuses a superseded owner's next write, but its step in flight still completes: if a
second process could take a live run over, it would find that step's intent without a result
and run it again (RELIABILITY R4). Ground truth is the tool's own receipts file and the fake
provider's billing log, both written outside the journal.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from _report import record

from cuaderno import FinalStep, RunBusy, ScriptedGateway, Session, open_journal
from cuaderno.testing.records import read_records

pytestmark = pytest.mark.xdist_group("crash")

WORKLOAD = textwrap.dedent("""
    import json, os, time
    from pathlib import Path
    from cuaderno import Agent, ScriptedGateway, ToolContext, tool
    from cuaderno.testing.records import append_synced, read_records

    def agent(receipts: str, gate: str | None) -> Agent:
        def lookup(ctx: ToolContext, arguments: dict) -> object:
            return next((r for r in read_records(receipts) if r["key"] == ctx.effect_key), None)

        @tool(lookup=lookup)
        def transfer(to: str, amount: int, ctx: ToolContext) -> dict:
            '''Move money (not idempotent; the receipts file is the bank).'''
            if gate is not None:
                Path(gate + ".inflight").touch()
                deadline = time.monotonic() + 60
                while not Path(gate).exists() and time.monotonic() < deadline:
                    time.sleep(0.01)
            receipt = {"key": ctx.effect_key, "to": to, "amount": amount, "pid": os.getpid()}
            append_synced(receipts, receipt)
            return receipt

        return Agent(instructions="pay", tools=[transfer])

    def script() -> list:
        return [ScriptedGateway.call("transfer", to="bob", amount=5), ScriptedGateway.text("paid")]
""")

CHILD = textwrap.dedent("""
    import asyncio, sys
    sys.path.insert(0, sys.argv[5])
    from takeover_workload import agent, script
    from cuaderno import FencedOut, RunBusy, ScriptedGateway, Session, open_journal

    async def main() -> None:
        db, receipts, billing, gate = sys.argv[1:5]
        store = open_journal(db)  # a file, or a journal URL (test_takeover_postgres.py)
        gw = ScriptedGateway(script(), billing_log=billing)
        try:
            steps = [s async for s in agent(receipts, None if gate == "-" else gate).run(
                "pay bob", session=Session("run", gw, store))]
            print("done", type(steps[-1]).__name__ if steps else "-")
        except RunBusy:
            print("busy")
        except FencedOut:
            print("fenced")
        finally:
            store.close()

    asyncio.run(main())
""")


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "takeover_workload.py").write_text(WORKLOAD)
    return {"dir": tmp_path, "db": tmp_path / "runs.db", "receipts": tmp_path / "receipts.jsonl",
            "billing": tmp_path / "billing.jsonl", "gate": tmp_path / "gate"}


def _start(world: dict[str, Path], gate: bool) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    args = [str(world["db"]), str(world["receipts"]), str(world["billing"]), str(world["gate"]) if gate else "-",
            str(world["dir"])]
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, child: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def _killed_in_the_tool_body(world: dict[str, Path]) -> None:
    """A holder SIGKILLed while its tool body waits at the gate (its intent is committed)."""
    child = _start(world, gate=True)
    try:
        _wait_for(Path(str(world["gate"]) + ".inflight"), child)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL


def _reap(child: subprocess.Popen[str]) -> None:
    """End a child this test started, if a failed assertion left it running."""
    if child.poll() is None:
        child.kill()
        child.wait()


def _resume_here(world: dict[str, Path], **session: Any) -> list[Any]:
    spec = importlib.util.spec_from_file_location(f"takeover_workload_{id(world)}",
                                                  world["dir"] / "takeover_workload.py")
    assert spec is not None and spec.loader is not None
    workload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workload)
    agent, script = workload.agent, workload.script
    store = open_journal(world["db"])
    gw = ScriptedGateway(script(), billing_log=world["billing"])

    async def run() -> list[Any]:
        return [s async for s in agent(str(world["receipts"]), None).run("pay bob",
                                                                          session=Session("run", gw, store, **session))]
    try:
        return asyncio.run(run())
    finally:
        store.close()


def _epoch(world: dict[str, Path]) -> int:
    store = open_journal(world["db"])
    try:
        cp = store.checkpoint("run")
        assert cp is not None
        return cp.epoch
    finally:
        store.close()


def test_a_live_holder_is_not_taken_over(world: dict[str, Path]) -> None:
    child = _start(world, gate=True)
    try:
        _wait_for(Path(str(world["gate"]) + ".inflight"), child)  # the child is inside the tool body
        epoch, billed = _epoch(world), len(read_records(world["billing"]))
        with pytest.raises(RunBusy) as info:
            _resume_here(world)
        assert str(child.pid) in str(info.value)
        assert _epoch(world) == epoch, "a refused takeover must not bump the epoch"
        assert read_records(world["receipts"]) == [] and len(read_records(world["billing"])) == billed
        world["gate"].touch()
        out, err = child.communicate(timeout=60)
    finally:
        _reap(child)
    assert child.returncode == 0 and out.split() == ["done", "FinalStep"], err
    assert [r["pid"] for r in read_records(world["receipts"])] == [child.pid]
    steps = _resume_here(world)  # the holder released the run when it finished
    assert isinstance(steps[-1], FinalStep) and steps[-1].replayed
    assert len(read_records(world["receipts"])) == 1 and len(read_records(world["billing"])) == 2


def test_a_killed_holder_is_taken_over_at_once(world: dict[str, Path]) -> None:
    _killed_in_the_tool_body(world)
    started = time.monotonic()
    steps = _resume_here(world)  # no lease to wait out: the holder's process is gone
    assert time.monotonic() - started < 10
    assert isinstance(steps[-1], FinalStep) and steps[-1].output == "paid"
    assert [r["pid"] for r in read_records(world["receipts"])] == [os.getpid()]  # the lookup found none


def test_force_takes_a_live_run_over_and_fences_the_holder_out(world: dict[str, Path]) -> None:
    child = _start(world, gate=True)
    try:
        _wait_for(Path(str(world["gate"]) + ".inflight"), child)
        epoch = _epoch(world)
        steps = _resume_here(world, force_takeover=True)
        assert isinstance(steps[-1], FinalStep) and _epoch(world) == epoch + 1
        world["gate"].touch()
        out, err = child.communicate(timeout=60)
    finally:
        _reap(child)
    assert out.split() == ["fenced"], err  # its result write was refused: the run is not its any more
    # What force costs, and why it is not the default: the holder's body was in flight, so the
    # effect ran twice (the receiver's own deduplication by effect key is the only remedy).
    receipts = read_records(world["receipts"])
    assert [r["pid"] for r in receipts] == [os.getpid(), child.pid] and receipts[0]["key"] == receipts[1]["key"]


RACES = [(2, a) for a in range(20 if os.environ.get("CUADERNO_SOAK") else 4)] + \
    [(10, a) for a in range(20 if os.environ.get("CUADERNO_SOAK") else 1)]
"""``CUADERNO_SOAK=1`` runs 20 races of each size instead of 4 and 1."""


@pytest.mark.parametrize(("racers", "attempt"), RACES)
def test_resumers_started_together_run_the_effect_once(world: dict[str, Path], racers: int, attempt: int) -> None:
    race_resumers(world, racers, "SQLite")


def race_resumers(world: dict[str, Any], racers: int, backend: str) -> None:
    """R4 on any backend: the figures are reported under ``backend``'s name."""
    # A first process dies in the tool body; 2 or 10 resumers then start at the same moment (R4).
    _killed_in_the_tool_body(world)
    billed = len(read_records(world["billing"]))
    world["gate"].unlink(missing_ok=True)
    os.remove(str(world["gate"]) + ".inflight")
    started = [_start(world, gate=True) for _ in range(racers)]
    try:
        deadline = time.monotonic() + 60
        # Both are started; whichever holds the run waits in the tool body until the gate opens,
        # so the other one's takeover meets a live holder.
        while not Path(str(world["gate"]) + ".inflight").exists() and time.monotonic() < deadline:
            if all(r.poll() is not None for r in started):
                break
            time.sleep(0.01)
        # The others meet a live holder and give up (RunBusy): wait until all of them have, so
        # every takeover was tried while the holder was inside the tool, however slow the machine.
        while sum(r.poll() is not None for r in started) < racers - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        world["gate"].touch()
        outs = [r.communicate(timeout=60) for r in started]
    finally:
        for r in started:
            _reap(r)
    verdicts = [out.split()[0] if out.split() else f"crashed: {err[-300:]}" for out, err in outs]
    receipts, bills = len(read_records(world["receipts"])), len(read_records(world["billing"])) - billed
    record({"test": f"R4 {racers} resumers at once ({backend})", "kind": "tool_lookup", "point": "tool body",
            "status": "completed", "kills": 1, "not_reached": 0, "duplicated": max(receipts - 1, 0),
            "rebilled_journaled": max(bills - 1, 0), "rebilled_in_flight": 0,
            "violations": int(not set(verdicts) <= {"busy", "done"})})
    assert set(verdicts) <= {"busy", "done"} and "done" in verdicts, outs
    # Every other resumer met the live holder (none came late, after the run was done).
    assert sorted(verdicts) == ["busy"] * (racers - 1) + ["done"], outs
    assert receipts == 1, "the effect ran more than once"
    assert bills == 1, "the last model turn was billed twice"
