"""A holder SIGSTOPped, taken over while it sleeps, then woken: its next write is FencedOut (R4 zombie).

Neither backend has a lease that runs out by the clock: a live holder keeps its run. What lets
another worker take over a stopped one:

- PostgreSQL: the server drops the holder's lock connection, as it does when a frozen VM (whose
  kernel no longer answers keepalives) misses them for ``dead_peer_after_s``; simulated here with
  ``pg_terminate_backend`` on that connection while the process is stopped;
- SQLite: the kernel keeps a stopped process's record lock, so only ``force`` takes it over
  (checked first: without force it is ``RunBusy``).

The holder stops at a point where the next thing it does is a journal write (before an intent's
transaction), so on waking that write is refused and nothing it was about to start runs:
at most one receipt. (A holder stopped *after* its intent committed would still complete the
body it then sends: that is why neither backend takes a live holder over by itself.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from _pg import PG_URL, new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from _report import record
from test_takeover import WORKLOAD, _resume_here

from cuaderno import FinalStep, RunBusy
from cuaderno.testing.records import read_records

pytestmark = pytest.mark.xdist_group("crash")

CHILD = textwrap.dedent("""
    import asyncio, json, os, signal, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[4])
    from takeover_workload import agent, script
    from cuaderno import FencedOut, RunBusy, ScriptedGateway, Session, open_journal
    from cuaderno.testing import crash

    db, receipts, billing, work, point, hit = sys.argv[1:7]
    store = open_journal(db)
    passed = [0]

    def stop() -> None:
        passed[0] += 1
        if passed[0] < int(hit):
            crash.on(point, stop)
            return
        holder = getattr(store, "holder_pid", lambda: None)()
        Path(work, "stopped.tmp").write_text(json.dumps({"pid": os.getpid(), "backend": holder}))
        os.replace(Path(work, "stopped.tmp"), Path(work, "stopped"))
        os.kill(os.getpid(), signal.SIGSTOP)

    crash.on(point, stop)

    async def main() -> None:
        gw = ScriptedGateway(script(), billing_log=billing)
        try:
            steps = [s async for s in agent(receipts, None).run("pay bob", session=Session("run", gw, store))]
            print("done", type(steps[-1]).__name__ if steps else "-")
        except RunBusy:
            print("busy")
        except FencedOut:
            print("fenced")
        finally:
            store.close()

    asyncio.run(main())
""")

POINTS = [("tool.K0", 1), ("model.K0", 2)]
"""Before the transfer's intent (turn 0's response is billed, not journaled: the taker bills it
again, the known in-flight cost), and before the second model call's intent (the transfer's result
is not journaled: the taker finds its receipt through the tool's lookup)."""


def _stopped_holder(world: dict[str, Any], point: str, hit: int) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(world["db"]), str(world["receipts"]),
                              str(world["billing"]), str(world["dir"]), point, str(hit)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = world["dir"] / "stopped"
    deadline = time.monotonic() + 60
    while not stopped.exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the holder never reached its stop"
        time.sleep(0.01)
    return child, json.loads(stopped.read_text())


def _wake(child: subprocess.Popen[str]) -> str:
    child.send_signal(signal.SIGCONT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err[-2000:]
    return out.strip()


def _check(world: dict[str, Any], point: str, woke: str, steps: list[Any], backend: str) -> None:
    receipts = read_records(world["receipts"])
    bills = len(read_records(world["billing"]))
    in_flight = 1 if point == "tool.K0" else 0  # turn 0's response, billed by the holder, never journaled
    record({"test": f"R4 SIGSTOPped holder woken after a takeover ({backend})", "kind": "tool_lookup",
            "point": point, "status": "completed", "kills": 0, "not_reached": 0,
            "duplicated": max(len(receipts) - 1, 0), "rebilled_journaled": max(bills - 2 - in_flight, 0),
            "rebilled_in_flight": in_flight, "violations": int(woke != "fenced")})
    assert isinstance(steps[-1], FinalStep) and steps[-1].output == "paid"
    assert woke == "fenced", woke  # its next write was refused
    assert len(receipts) == 1, f"the transfer ran {len(receipts)} times"
    assert bills == 2 + in_flight, bills


def _world(tmp_path: Path, db: str) -> dict[str, Any]:
    (tmp_path / "takeover_workload.py").write_text(WORKLOAD)
    return {"dir": tmp_path, "db": db, "receipts": tmp_path / "receipts.jsonl", "billing": tmp_path / "billing.jsonl",
            "gate": tmp_path / "gate"}


@pytest.mark.parametrize(("point", "hit"), POINTS)
def test_a_stopped_holder_forced_out_is_fenced_when_it_wakes_sqlite(tmp_path: Path, point: str, hit: int) -> None:
    world = _world(tmp_path, str(tmp_path / "runs.db"))
    child, _ = _stopped_holder(world, point, hit)
    try:
        with pytest.raises(RunBusy):  # stopped is alive: the kernel keeps its lock
            _resume_here(world)
        steps = _resume_here(world, force_takeover=True)
        woke = _wake(child)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()
    _check(world, point, woke, steps, "SQLite")


@pytest.mark.postgres
@pytest.mark.parametrize(("point", "hit"), POINTS)
def test_a_stopped_holder_whose_connection_was_dropped_is_fenced_when_it_wakes_postgres(
        tmp_path: Path, point: str, hit: int, pg_schemas: list[str]) -> None:  # noqa: F811
    import psycopg

    pg_schemas.append(new_schema())
    world = _world(tmp_path, schema_url(pg_schemas[-1]))
    child, stopped = _stopped_holder(world, point, hit)
    try:
        with pytest.raises(RunBusy):  # stopped, its connection open: it keeps the run
            _resume_here(world)
        with psycopg.connect(PG_URL, autocommit=True) as admin:  # what the server does to a frozen peer
            assert admin.execute("SELECT pg_terminate_backend(%s)", (stopped["backend"],)).fetchone() == (True,)
        deadline = time.monotonic() + 30
        while True:  # the lock goes once the backend has exited
            try:
                steps = _resume_here(world)
                break
            except RunBusy:
                assert time.monotonic() < deadline, "the dropped connection's lock never went"
                time.sleep(0.05)
        woke = _wake(child)
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()
    _check(world, point, woke, steps, "PostgreSQL")
