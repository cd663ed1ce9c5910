"""A schedule across a PostgreSQL restart (issue 36 part 4's must-show): three workers on a
private cluster, a schedule firing every second (soak: every 2 s for 2 minutes), workers
SIGKILLed at random and the server restarted once in the middle; every fire time from the first
to the last has exactly one run, and each run's work was done once (the ledger's receipts)."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest

from cuaderno import open_journal
from cuaderno.flow import add_schedule
from cuaderno.testing.ledger import LedgerProcess

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crash"))
from _flowq_world import FlowWorld
from _pgcluster import PrivateCluster, private_cluster  # noqa: F401 - the fixture

SOAK = os.environ.get("CUADERNO_SOAK") == "1"
pytestmark = pytest.mark.postgres


@pytest.mark.timeout(900 if SOAK else 300)  # a soak runs for minutes on a shared machine
def test_one_run_per_fire_time_across_kills_and_a_server_restart(
        private_cluster: PrivateCluster, tmp_path: Path) -> None:  # noqa: F811
    import flowq_agent

    every, length = (2, 120) if SOAK else (1, 20)
    rng = random.Random(36)
    ledger = LedgerProcess(tmp_path / "ledger.sqlite3", mode="nodedup").start()
    world = FlowWorld(journal=f"{private_cluster.url}?schema=sched", dir=tmp_path, ledger=ledger)
    try:
        store = open_journal(world.journal)
        try:
            add_schedule(store, "tick", f"* * * * * */{every}", flowq_agent.agent, "key=tick scheduled",
                         catch_up=1000)
        finally:
            store.close()
        env = {"FLOWQ_HOLD_S": "0.05"}
        procs = [world.worker("--concurrency", "4", **env) for _ in range(3)]
        kills, restarted = 0, False
        started = time.monotonic()
        while time.monotonic() - started < length:
            time.sleep(rng.uniform(0.5, 2.0))
            if not restarted and time.monotonic() - started > length / 2:
                private_cluster.restart()  # every connection ends, as a crash of the server ends them
                restarted = True
                continue
            victim = rng.randrange(len(procs))
            if procs[victim].poll() is None:
                os.kill(procs[victim].pid, signal.SIGKILL)
                procs[victim].wait()
                kills += 1
            procs[victim] = world.worker("--concurrency", "4", **env)
        created_at, removed_at, runs, stamps = world.end_schedule("tick", timeout=180)
        print(f"\n{len(runs)} fire times, {kills} SIGKILLs, 1 server restart, first {runs[0]}, last {runs[-1]}")
        assert restarted and kills >= 3
        assert created_at < stamps[0] <= created_at + every
        assert stamps == [stamps[0] + every * i for i in range(len(stamps))]  # none missing, one run each
        assert stamps[-1] > removed_at - 4 * every
        begun = sorted(r["business_id"] for r in world.receipts() if r["effect"] == "begin")
        assert begun == runs
    finally:
        world.reap()
        ledger.stop()
