"""Cron schedules (issue 36 part 4): one run per fire time, whatever the number of workers and
their deaths; missed fire times follow ``catch_up``. Both backends.

The kill test runs three ``cuaderno worker`` processes on a schedule firing every second,
SIGKILLs them at random and starts new ones; the journal then holds exactly one run per fire
time from the schedule's first fire to its last before the schedule is removed: none missing,
none doubled. ``CUADERNO_SOAK=1``: every 2 s for 2 minutes.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Any

import pytest

from cuaderno import open_journal
from cuaderno.errors import UsageError
from cuaderno.flow import add_schedule, fire_due, list_schedules, remove_schedule, schedule_run_id
from cuaderno.journal import schedules_of

SOAK = os.environ.get("CUADERNO_SOAK") == "1"


def _agent() -> Any:
    import flowq_agent

    return flowq_agent.agent


def test_add_list_remove_and_refusals(store: Any) -> None:
    made = add_schedule(store, "nightly", "0 3 * * *", _agent(), "key=n nightly report", catch_up=2)
    assert (made.agent, made.catch_up, made.last_fire) == ("flowq", 2, made.created_at)
    assert [s.name for s in list_schedules(store)] == ["nightly"]
    for bad, match in [({"cron": "not cron"}, "is not a cron expression"), ({"name": "bad name"}, "schedule name"),
                       ({"catch_up": 0}, "catch_up must be"), ({"name": "nightly"}, "exists")]:
        kwargs: dict[str, Any] = {"name": "other", "cron": "* * * * *", **bad}
        with pytest.raises(UsageError, match=match):
            add_schedule(store, kwargs["name"], kwargs["cron"], _agent(), "t", catch_up=kwargs.get("catch_up", 1))
    assert [s.name for s in list_schedules(store)] == ["nightly"]
    remove_schedule(store, "nightly")
    assert list_schedules(store) == []
    with pytest.raises(UsageError, match="no schedule named"):
        remove_schedule(store, "nightly")


def test_two_workers_firing_at_once_make_one_run_per_fire_time(store: Any, fq_journal: str) -> None:
    add_schedule(store, "every-second", "* * * * * *", _agent(), "key=s tick")
    time.sleep(2.2)
    other = open_journal(fq_journal)
    results: list[Any] = []
    try:
        barrier = threading.Barrier(2)

        def fire(s: Any) -> None:
            barrier.wait()
            results.append(fire_due(s, _agent()))

        threads = [threading.Thread(target=fire, args=(s,)) for s in (store, other)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        other.close()
    handles = [h for found in results for h in found]
    created = [h.run_id for h in handles if h.created]
    assert created and len(created) == len(set(created))
    assert all(r.startswith("sched:every-second:") for r in created)
    runs = [cp.run_id for cp in store.list_runs(limit=100)]
    assert sorted(runs) == sorted(set(created))
    # Fired again at once: no fire time already fired comes again (last_fire moved to the latest
    # one). A second may have passed meanwhile on a loaded machine: its fire time is a new one.
    last = max(h.start_at for h in handles)
    again = fire_due(store, _agent())
    assert all(h.start_at > last and h.run_id not in created for h in again), (last, again)


@pytest.mark.parametrize(("catch_up", "started"), [(1, 1), (3, 3), (100, 10)])
def test_missed_fire_times_follow_catch_up(store: Any, catch_up: int, started: int) -> None:
    table = schedules_of(store)
    now = table.now()
    down_since = float(int(now)) - 10.5  # the schedule's workers were all down for ten fire times
    table.add(("outage", "* * * * * *", "flowq", "key=o tick", "default", 0, None, catch_up,
                        down_since, down_since))
    fired = fire_due(store, _agent())
    fire_times = [h.start_at for h in fired]
    # Ten fire times had come when the test read the clock (eleven if a second passed since).
    assert len(fired) in ((started,) if started < 10 else (10, 11)) and all(h.created for h in fired)
    assert fire_times == sorted(fire_times) and fire_times[-1] > now - 1.01  # the latest ones, oldest first
    assert [h.run_id for h in fired] == [schedule_run_id("outage", t) for t in fire_times]
    assert list_schedules(store)[0].last_fire == fire_times[-1]


@pytest.mark.timeout(900 if SOAK else 300)  # a soak runs for minutes on a shared machine
def test_one_run_per_fire_time_with_workers_killed_at_random(fq_world: Any) -> None:
    every, length = (2, 120) if SOAK else (1, 12)
    rng = random.Random(4)
    store = open_journal(fq_world.journal)
    try:
        add_schedule(store, "tick", f"* * * * * */{every}", _agent(), "key=tick scheduled", catch_up=1000)
    finally:
        store.close()
    env = {"FLOWQ_HOLD_S": "0.05"}
    procs = [fq_world.worker("--concurrency", "4", **env) for _ in range(3)]
    kills = 0
    started = time.monotonic()
    while time.monotonic() - started < length:
        time.sleep(rng.uniform(0.5, 2.0))
        victim = rng.randrange(len(procs))
        if procs[victim].poll() is None:
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait()
            kills += 1
        procs[victim] = fq_world.worker("--concurrency", "4", **env)
    # The workers started last live on: on a loaded machine each killed one may have died before it
    # fired anything, so the schedule stays until one of them has (catch-up then fires the rest).
    fq_world.wait_until(lambda: any(r.startswith("sched:tick:") for r in fq_world.statuses()), timeout=120,
                        what="a first fire")
    created_at, removed_at, runs, stamps = fq_world.end_schedule("tick", timeout=120)
    assert stamps, "no run was fired"
    print(f"\n{len(runs)} fire times, {kills} SIGKILLs, first {runs[0]}, last {runs[-1]}")
    # The first fire time after the schedule was added, then every one up to the last: none
    # missing, and one run each (a run id per fire time; its work done once, below).
    assert created_at < stamps[0] <= created_at + every
    assert stamps == [stamps[0] + every * i for i in range(len(stamps))]
    assert stamps[-1] > removed_at - 4 * every  # fired up to the end (a worker is up again within ~2 s)
    assert kills >= 3
    receipts = fq_world.receipts()
    begun = sorted(r["business_id"] for r in receipts if r["effect"] == "begin")
    assert begun == runs  # each fire time's run did its work once


def test_the_schedule_commands(fq_journal: str) -> None:
    import json
    import subprocess
    import sys

    open_journal(fq_journal).close()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cuaderno", "--db", fq_journal, "schedule", *args],
                              capture_output=True, text=True, timeout=60)

    added = cli("add", "nightly", "--cron", "0 3 * * *", "--agent", "flowq", "--task", "key=n report", "--catch-up", "2")
    assert added.returncode == 0, added.stderr
    listed = json.loads(cli("list", "--json").stdout)
    assert [(s["name"], s["cron"], s["agent"], s["catch_up"]) for s in listed] == [("nightly", "0 3 * * *", "flowq", 2)]
    refused = cli("add", "other", "--cron", "every day", "--agent", "flowq", "--task", "t")
    assert refused.returncode == 2 and refused.stderr.startswith("error: 'every day' is not a cron expression")
    assert "Traceback" not in refused.stderr
    assert [s["name"] for s in json.loads(cli("list", "--json").stdout)] == ["nightly"]
    assert cli("remove", "nightly").returncode == 0
    gone = cli("remove", "nightly")
    assert gone.returncode == 2 and "no schedule named 'nightly'" in gone.stderr
    assert json.loads(cli("list", "--json").stdout) == []
