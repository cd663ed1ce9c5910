"""Concurrency limits per key (issue 36 part 1), proved from outside: worker processes are
SIGKILLed at random while they drive runs of two limited keys; the fake ledger's receipts (each
run applies ``begin`` when it starts its work and ``finish`` when it ends it, exactly once) are
the independent record of what was in progress, and never show more than K runs of a key
between their ``begin`` and their ``finish``. Every run finishes.

Why the record may be read this way: a run whose worker died after its ``begin`` is still in
progress for the ledger, and nobody holds it. It is older than every run of its key not yet
begun (the queue claims oldest first within a priority), so the next claim of that key takes it
before any new one: the record's count and the holds' count agree.

``CUADERNO_SOAK=1``: more runs, more workers, more kills (run once to report its figures).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from typing import Any

import pytest

from cuaderno import open_journal
from cuaderno.flow import set_limit, submit

SOAK = os.environ.get("CUADERNO_SOAK") == "1"
LIMITS = {"tenant-a": 2, "tenant-b": 1}


def _max_in_progress(receipts: list[dict[str, Any]]) -> dict[str, int]:
    """The most runs of each key between their begin and their finish, in the ledger's order."""
    now: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    for r in sorted(receipts, key=lambda r: r["receipt_id"]):  # the order the ledger applied them in
        key = str(r["request"]["args"]["key"])
        if r["effect"] == "begin":
            now[key] += 1
            peak[key] = max(peak[key], now[key])
        elif r["effect"] == "finish":
            now[key] -= 1
    return dict(peak)


@pytest.mark.timeout(900 if SOAK else 300)  # a soak runs for minutes on a shared machine
def test_never_more_than_k_of_a_key_with_workers_killed_at_random(fq_world: Any) -> None:
    runs_per_key = 30 if SOAK else 8
    workers = 4 if SOAK else 3
    rng = random.Random(36)
    store = open_journal(fq_world.journal)
    try:
        for key, k in LIMITS.items():
            set_limit(store, key, k)
        handles = [submit(store, _agent(), f"key={key} run {i}", concurrency_key=key)
                   for i in range(runs_per_key) for key in LIMITS]
    finally:
        store.close()
    run_ids = {h.run_id for h in handles}
    procs = [fq_world.worker("--concurrency", "4") for _ in range(workers)]
    kills = 0
    deadline = time.monotonic() + (600 if SOAK else 150)
    while True:
        statuses = fq_world.statuses()
        if all(statuses.get(r) == "completed" for r in run_ids):
            break
        assert not any(statuses.get(r) in ("failed", "needs_human", "cancelled") for r in run_ids), statuses
        assert time.monotonic() < deadline, f"not all runs finished: {Counter(statuses.values())}"
        time.sleep(rng.uniform(0.6, 1.5))
        victim = rng.randrange(len(procs))
        if procs[victim].poll() is None:
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait()
            kills += 1
        procs[victim] = fq_world.worker("--concurrency", "4")
    receipts = fq_world.receipts()
    per_run = Counter((r["business_id"], r["effect"]) for r in receipts)
    assert {run for run, _ in per_run} == run_ids
    assert set(per_run.values()) == {1}, [k for k, n in per_run.items() if n != 1]  # each begin, each finish once
    peaks = _max_in_progress(receipts)
    print(f"\n{len(run_ids)} runs, {kills} SIGKILLs, peaks in progress {peaks}, limits {LIMITS}")
    assert kills >= (10 if SOAK else 2)
    for key, k in LIMITS.items():
        assert 1 <= peaks[key] <= k, (key, peaks)
    # The limit was reached (the test would pass vacuously with one run at a time).
    assert peaks["tenant-a"] == 2


def _agent() -> Any:
    import flowq_agent

    return flowq_agent.agent


@pytest.fixture(autouse=True)
def _hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWQ_HOLD_S", "0.3")

