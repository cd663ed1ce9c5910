"""R19 on PostgreSQL: the connection killed right after COMMIT, and the server restarted mid-run.

Both on a private cluster (``_pgcluster.py``): the machine's shared server is never reconfigured
or restarted.

**Lost acknowledgement.** To kill a connection exactly between the server's commit and the
client's reading of its reply, the server is made to wait, after it has committed locally, for a
synchronous standby that does not exist (``synchronous_standby_names``, set at the crash point
inside the transaction and reset at once); the victim's backend is then ``pg_terminate_backend``-ed
while it waits (``wait_event = 'SyncRep'``). The transaction is durable, the client gets a dead
connection. A client that took that for "nothing was committed" would stop the run with a false
statement (and a resume of a non-idempotent tool without a lookup would then ask a person about a
transfer that never ran); it must instead learn from the journal, on a new connection, that the
rows are there, and go on. The same kill before the COMMIT is sent (the rows did not land) must
write them again, once.

**Restart.** The server is restarted (``pg_ctl restart -m fast``: every connection ends) while
the run waits between two steps; the run goes on once it is back.

Truth: the tool's receipts file and the fake provider's billing log.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _pgcluster import PrivateCluster, private_cluster  # noqa: F401 - the fixture
from _report import record
from test_takeover import WORKLOAD

from cuaderno import FinalStep, RunBusy, ScriptedGateway, Session, open_journal
from cuaderno.testing import crash
from cuaderno.testing.records import read_records

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("crash")]

NO_LOOKUP = WORKLOAD.replace("@tool(lookup=lookup)", "@tool")
"""The transfer without a lookup: an intent without a result can then only be settled by a person."""


def _workload(tmp_path: Path, source: str) -> Any:
    (tmp_path / "lost_ack_workload.py").write_text(source)
    spec = importlib.util.spec_from_file_location(f"lost_ack_workload_{id(tmp_path)}",
                                                  tmp_path / "lost_ack_workload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(url: str, workload: Any, tmp_path: Path) -> list[Any]:
    store = open_journal(url)
    gw = ScriptedGateway(workload.script(), billing_log=tmp_path / "billing.jsonl")

    async def go() -> list[Any]:
        return [s async for s in workload.agent(str(tmp_path / "receipts.jsonl"), None).run(
            "pay bob", session=Session("run", gw, store))]
    try:
        return asyncio.run(go())
    finally:
        store.close()


class Killer:
    """At the armed point (inside the victim's transaction), arrange that its COMMIT lands and its
    connection dies before the reply is read (``after_commit``), or that it dies before COMMIT."""

    def __init__(self, cluster: PrivateCluster, *, after_commit: bool) -> None:
        self.cluster, self.after_commit = cluster, after_commit
        self.killed: list[int] = []
        self.failure: list[str] = []
        self.thread: threading.Thread | None = None

    def __call__(self) -> None:
        admin = psycopg.connect(self.cluster.url, autocommit=True)
        victim = admin.execute("SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction' "
                               "AND backend_xid IS NOT NULL").fetchall()
        if len(victim) != 1:
            self.failure.append(f"expected one writing transaction, found {victim}")
            admin.close()
            return
        pid = int(victim[0][0])
        if not self.after_commit:  # killed before its COMMIT: the transaction rolls back
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            self._wait_gone(admin, pid)
            self.killed.append(pid)
            admin.close()
            return
        admin.execute("ALTER SYSTEM SET synchronous_standby_names = 'cuaderno_nobody'")
        admin.execute("SELECT pg_reload_conf()")
        time.sleep(1.0)  # the checkpointer publishes the setting; a COMMIT that does not wait fails the test
        self.thread = threading.Thread(target=self._kill_while_it_waits, args=(admin, pid), daemon=True)
        self.thread.start()

    def _kill_while_it_waits(self, admin: psycopg.Connection[Any], pid: int) -> None:
        try:
            deadline = time.monotonic() + 20
            while True:
                row = admin.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
                if row is not None and row[0] == "SyncRep":
                    break  # committed locally, its reply held back
                if time.monotonic() > deadline:
                    self.failure.append(f"the victim never waited after its commit (wait_event {row})")
                    return
                time.sleep(0.01)
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            self._wait_gone(admin, pid)
            self.killed.append(pid)
        finally:
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
            admin.execute("SELECT pg_reload_conf()")
            admin.close()

    @staticmethod
    def _wait_gone(admin: psycopg.Connection[Any], pid: int) -> None:
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            time.sleep(0.01)


POINTS = [("tool.K1", True), ("tool.K6", True), ("tool.K1", False), ("tool.K6", False)]
"""Inside the transfer's intent transaction (before its body runs) and inside its result's."""


@pytest.mark.parametrize(("point", "after_commit"), POINTS)
def test_a_connection_killed_around_commit_neither_stops_nor_repeats_the_run(
        private_cluster: PrivateCluster, tmp_path: Path, point: str, after_commit: bool) -> None:  # noqa: F811
    url = f"{private_cluster.url}?schema=lost_ack"
    workload = _workload(tmp_path, NO_LOOKUP)
    killer = Killer(private_cluster, after_commit=after_commit)
    crash.on(point, killer)
    try:
        steps = _run(url, workload, tmp_path)
    finally:
        crash.on(point, None)
        if killer.thread is not None:
            killer.thread.join(30)
    assert not killer.failure, killer.failure
    assert len(killer.killed) == 1, "the connection was not killed"
    receipts, bills = read_records(tmp_path / "receipts.jsonl"), len(read_records(tmp_path / "billing.jsonl"))
    record({"test": f"R19 connection killed {'after' if after_commit else 'before'} COMMIT (PostgreSQL)",
            "kind": "tool_nodedup", "point": point, "status": "completed", "kills": 0, "not_reached": 0,
            "duplicated": max(len(receipts) - 1, 0), "rebilled_journaled": max(bills - 2, 0),
            "rebilled_in_flight": 0, "violations": int(not (steps and isinstance(steps[-1], FinalStep)))})
    assert isinstance(steps[-1], FinalStep) and steps[-1].output == "paid", steps
    assert len(receipts) == 1 and bills == 2, (receipts, bills)
    store = open_journal(url)
    try:
        events = store.load("run")
        keys = [(e.step_id, e.phase) for e in events]
        assert len(keys) == len(set(keys)) and ("t0000.tool00", "result") in keys
        cp = store.checkpoint("run")
        assert cp is not None and cp.status == "completed"
    finally:
        store.close()


RESTARTS = ["tool.K2", "tool.K1", "tool.K6"]
"""Between two steps (the transfer's intent committed, its body not run), and inside the intent's
and the result's transactions (the server's restart rolls them back: written again, once)."""


@pytest.mark.parametrize("point", RESTARTS)
def test_the_server_restarted_mid_run_the_run_goes_on(
        private_cluster: PrivateCluster, tmp_path: Path, point: str) -> None:  # noqa: F811
    url = f"{private_cluster.url}?schema=restart"
    workload = _workload(tmp_path, WORKLOAD)
    restarts: list[float] = []

    def restart() -> None:
        started = time.monotonic()
        private_cluster.restart()
        restarts.append(time.monotonic() - started)

    crash.on(point, restart)
    try:
        steps = _run(url, workload, tmp_path)
    finally:
        crash.on(point, None)
    receipts, bills = read_records(tmp_path / "receipts.jsonl"), len(read_records(tmp_path / "billing.jsonl"))
    record({"test": "R19 PostgreSQL restarted mid-run", "kind": "tool_lookup", "point": point,
            "status": "completed", "kills": 0, "not_reached": 0, "duplicated": max(len(receipts) - 1, 0),
            "rebilled_journaled": max(bills - 2, 0), "rebilled_in_flight": 0,
            "violations": int(not (steps and isinstance(steps[-1], FinalStep)))})
    assert len(restarts) == 1
    assert isinstance(steps[-1], FinalStep) and steps[-1].output == "paid", steps
    assert len(receipts) == 1 and bills == 2, (receipts, bills)


def test_a_holder_whose_lock_a_restart_ended_is_not_taken_over_while_it_runs(
        private_cluster: PrivateCluster, tmp_path: Path) -> None:  # noqa: F811
    """A restart ends every session, so every run's lock is free when the server is back, while
    the holders may be alive inside a step (here: a transfer's body). A takeover right then would
    run that step again; the holder gets a grace period to take its lock again (at its next write)."""
    from test_takeover import _reap, _resume_here, _start, _wait_for

    (tmp_path / "takeover_workload.py").write_text(WORKLOAD)
    world = {"dir": tmp_path, "db": f"{private_cluster.url}?schema=restart_held",
             "receipts": tmp_path / "receipts.jsonl", "billing": tmp_path / "billing.jsonl", "gate": tmp_path / "gate"}
    holder = _start(world, gate=True)
    try:
        _wait_for(Path(str(world["gate"]) + ".inflight"), holder)  # inside the transfer's body
        private_cluster.restart()
        with pytest.raises(RunBusy, match="restart"):
            _resume_here(world)
        world["gate"].touch()
        out, err = holder.communicate(timeout=60)
    finally:
        _reap(holder)
    receipts, bills = read_records(world["receipts"]), len(read_records(world["billing"]))
    record({"test": "R19 PostgreSQL restarted under a holder in a tool body", "kind": "tool_lookup",
            "point": "tool body", "status": "completed", "kills": 0, "not_reached": 0,
            "duplicated": max(len(receipts) - 1, 0), "rebilled_journaled": max(bills - 2, 0), "rebilled_in_flight": 0,
            "violations": int(out.split() != ["done", "FinalStep"])})
    assert out.split() == ["done", "FinalStep"], err[-2000:]
    assert [r["pid"] for r in receipts] == [holder.pid] and bills == 2, (receipts, bills)
