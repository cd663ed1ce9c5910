"""Workers in their own processes, on SQLite and PostgreSQL, proved from the fake ledger's receipts.

- a run whose process was SIGKILLed at a crash point is finished by ``cuaderno worker``: each
  effect applied exactly once, each model turn billed once;
- after ``cuaderno approve`` the run is ``waiting for a worker`` (never ``running``), and a worker
  resumes it;
- 3 worker processes share 20 runs (one of them SIGKILLed halfway in every other repetition):
  0 double executions by receipts;
- SIGTERM: the step in flight finishes and commits, the run is released, the worker exits 0;
- ``CUADERNO_SOAK=1``: 10 workers over 100 runs.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from _world import World

from cuaderno import open_journal
from cuaderno.journal.base import SupportsClaims

pytestmark = pytest.mark.xdist_group("crash")

TURNS = 3
SOAK = bool(os.environ.get("CUADERNO_SOAK"))


def _exactly_once(world: World, runs: int, per_run: int) -> None:
    applied = world.applied_per_key()
    doubled = {k: n for k, n in applied.items() if n > 1}
    assert not doubled, f"effects applied more than once: {doubled}"
    assert len(applied) == runs * per_run, f"{len(applied)} effects applied, expected {runs * per_run}"


@pytest.mark.parametrize("point", ["tool.K2:2", "tool.K4:2", "model.K5:3"])
def test_a_run_killed_at_a_crash_point_is_finished_by_a_worker(world: World, point: str) -> None:
    started = world.start_runs("agent", ["r1"], CUADERNO_CRASH_AT=point)
    started.communicate(timeout=120)
    assert started.returncode == -signal.SIGKILL, "the crash point was not reached"
    assert world.statuses() == {"r1": "running"}
    worker = world.worker("worker_agent:agent", "--until-idle")
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert world.statuses() == {"r1": "completed"}, err
    _exactly_once(world, 1, TURNS)
    # Killed after the provider billed a turn and before its response was journaled (model.K5),
    # the turn is sent again with the same key: billed twice, and counted as possibly so.
    resent = 1 if point.startswith("model.K5") else 0
    assert world.billed() == TURNS + 1 + resent, "a journaled model turn was billed again"
    store = open_journal(world.journal)
    try:
        cp = store.checkpoint("r1")
        assert cp is not None and cp.count("possibly_billed_twice") == resent
    finally:
        store.close()


@pytest.mark.parametrize(("concurrency", "point"), [
    *(("1", p) for p in ("tool.K2:2", "tool.K4:2", "tool.K6:2", "model.K5:3")),
    # Three runs at once share their commits (group commit): killed inside a group's transaction
    # (G1: nothing of it durable), after its commit before anyone acted on it (G2), and at the
    # loop's own points while its steps ride in groups.
    *(("3", p) for p in ("group.G1:3", "group.G2:3", "tool.K4:2", "tool.K6:2", "model.K5:3")),
])
def test_a_worker_killed_at_a_crash_point_is_finished_by_another(world: World, concurrency: str, point: str) -> None:
    ids = ["a", "b", "c"]
    starter = world.start_runs("approving", ids)
    starter.communicate(timeout=120)
    world.approve_all(ids)
    first = world.worker("worker_agent:approving_agent", "--concurrency", concurrency, CUADERNO_CRASH_AT=point)
    first.communicate(timeout=120)
    assert first.returncode == -signal.SIGKILL, "the crash point was not reached"
    second = world.worker("worker_agent:approving_agent", "--until-idle")
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert world.statuses() == dict.fromkeys(ids, "completed"), err
    _exactly_once(world, len(ids), TURNS + 1)


def test_after_approve_the_run_waits_for_a_worker_and_a_worker_resumes_it(world: World) -> None:
    started = world.start_runs("approving", ["r1"])
    out, err = started.communicate(timeout=120)
    assert out.split() == ["r1", "suspended"], err
    status = world.cli("status", "r1")
    assert status.stdout.strip() == "run r1: waits for approval of t0000.tool00.approval (reserve)", status
    decided = world.cli("approve", "r1", "t0000.tool00")
    assert decided.returncode == 0, decided.stderr
    # Nothing runs it now: it is waiting for a worker, never shown as running.
    status = world.cli("status", "r1", "--json")
    state = json.loads(status.stdout)
    assert (state["status"], state["state"], state["waiting_for"], state["held_by"]) == \
        ("running", "waiting", "a worker", None), state
    shown = world.cli("show", "r1", "--no-timeline")
    assert "waiting for a worker" in shown.stdout and "status      running" not in shown.stdout, shown.stdout
    listed = json.loads(world.cli("list", "--json").stdout)
    assert listed[0]["state"] == "waiting" and listed[0]["waiting_for"] == "a worker"
    assert world.receipts() == []
    worker = world.worker("worker_agent:approving_agent", "--until-idle")
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert world.statuses() == {"r1": "completed"}, err
    _exactly_once(world, 1, TURNS + 1)
    assert json.loads(world.cli("status", "r1", "--json").stdout)["state"] == "completed"


def _share(world: World, workers: int, runs: int, rep: int, *, kill_one: bool) -> dict[str, int]:
    ids = [f"rep{rep}-run{i:03d}" for i in range(runs)]
    starter = world.start_runs("approving", ids)
    out, err = starter.communicate(timeout=600)
    assert starter.returncode == 0 and out.split()[1::2] == ["suspended"] * runs, err
    world.approve_all(ids)
    procs = [world.worker("worker_agent:approving_agent", "--concurrency", "2") for _ in range(workers)]
    killed = 0
    if kill_one:
        # SIGKILL one worker once some effects are in: its runs' holds die with it, and the others
        # take them over (the effect in flight is reconciled through the ledger's lookup).
        world.wait_until(lambda: len(world.receipts()) >= runs, what="some receipts")
        procs[0].send_signal(signal.SIGKILL)
        killed = 1
    world.wait_until(lambda: all(world.statuses().get(r) == "completed" for r in ids), timeout=900,
                     what="every run completed")
    for p in procs[killed:]:
        p.send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=120) for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [-signal.SIGKILL] * killed + [0] * (workers - killed), outs
    claims = [json.loads(err.strip().splitlines()[-1])["claimed"] for _, err in outs[killed:]]
    mine = [r for r in world.receipts() if r["business_id"] in ids]
    per_key: dict[str, int] = {}
    for r in mine:
        per_key[r["key"]] = per_key.get(r["key"], 0) + 1
    return {"effects": len(per_key), "doubled": sum(n - 1 for n in per_key.values()), "killed": killed,
            "claims": claims}


@pytest.mark.parametrize("rep", range(6 if SOAK else 2))
def test_three_workers_share_twenty_runs(world: World, rep: int) -> None:
    figures = _share(world, 3, 20, rep, kill_one=rep % 2 == 1)
    print(f"\n[worker figures] {world.backend}: 3 processes x 20 runs, rep {rep}, killed {figures['killed']}: "
          f"{figures['effects']} effects, {figures['doubled']} double executions, claims per surviving worker "
          f"{figures['claims']}")
    assert (figures["effects"], figures["doubled"]) == (20 * (TURNS + 1), 0)


@pytest.mark.skipif(not SOAK, reason="CUADERNO_SOAK=1 runs the 10-worker soak")
def test_soak_ten_workers(world: World) -> None:
    figures = _share(world, 10, 100, 0, kill_one=True)
    print(f"\n[worker figures] {world.backend}: 10 processes x 100 runs, 1 killed: "
          f"{figures['effects']} effects, {figures['doubled']} double executions, claims {figures['claims']}")
    assert figures["effects"] == 100 * (TURNS + 1) and figures["doubled"] == 0


def test_sigterm_finishes_the_step_in_flight_releases_the_run_and_exits_0(world: World) -> None:
    started = world.start_runs("approving", ["r1"])
    started.communicate(timeout=120)
    world.approve_all(["r1"])
    # The worker's tools wait at the gate: SIGTERM arrives while the reserve is in flight.
    worker = world.worker("worker_agent:approving_agent", WORKER_GATE=str(world.gate))
    world.wait_until(lambda: (world.dir / "gate.inflight").exists(), what="the tool in flight")
    state = json.loads(world.cli("status", "r1", "--json").stdout)
    assert (state["state"], state["waiting_for"]) == ("running", None), state
    assert state["held_by"].startswith("worker@") and f"process {worker.pid}" in state["held_by"], state
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert worker.poll() is None, "the worker must finish its step in flight first"
    world.gate.touch()
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    assert "released run 'r1'" in err or "released run r1" in err, err
    assert len(world.receipts()) == 1, "the step in flight completed once"
    store = open_journal(world.journal)
    try:
        cp = store.checkpoint("r1")
        assert cp is not None and cp.status == "running"
        events = store.load("r1")
        assert any(e.step_id == "t0000.tool00" and e.phase == "result" for e in events), "its result was committed"
        assert isinstance(store, SupportsClaims) and store.holders(["r1"]) == {}, "the run was released"
    finally:
        store.close()
    assert json.loads(world.cli("status", "r1", "--json").stdout)["waiting_for"] == "a worker"
    again = world.worker("worker_agent:approving_agent", "--until-idle")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert world.statuses() == {"r1": "completed"}
    _exactly_once(world, 1, TURNS + 1)
