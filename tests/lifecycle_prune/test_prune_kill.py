"""R26, prune: SIGKILL inside ``cuaderno prune`` at named points while a worker process drives other
runs to the fake ledger; then a second prune and the worker finish. Proven from the ledger's receipts
(every open run's transfers applied exactly once) and from the journal's own counts (no run whose
rows and summary disagree). And two workers pruning on a schedule at once, on both backends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from prune_journals import DAY, age, closed_run, half_runs

from cuaderno import open_journal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "worker"))

from _world import World, world  # noqa: F401 - the fixture (a journal on either backend, the ledger)

TURNS = 3
OLD = 23
"""Old closed runs to prune: with ``--batch 5``, five transactions (the last one short)."""
OPEN = 4
"""Runs an application started and died in (killed after its first transfer was answered): a worker
must drive each to its end, with every transfer applied once."""


def _setup(w: World) -> list[str]:
    store = open_journal(w.journal)
    try:
        old = [closed_run(store, f"old-{i:02d}", "completed" if i % 3 else "failed") for i in range(OLD)]
    finally:
        store.close()
    age(w.journal, 3 * DAY, old)
    runs = [f"live-{i}" for i in range(OPEN)]
    for run_id in runs:  # each application process dies inside its run: the run is left running, unheld
        child = w.start_runs("agent", [run_id], CUADERNO_CRASH_AT="tool.K5:1", WORKER_TURNS=str(TURNS))
        child.wait(timeout=120)
        assert child.returncode == -signal.SIGKILL, child.communicate()
    return runs


def _prune(w: World, *, crash_at: str | None = None, batch: int = 5) -> subprocess.CompletedProcess[str]:
    extra = {"CUADERNO_CRASH_AT": crash_at} if crash_at else {}
    return subprocess.run([sys.executable, "-m", "cuaderno", "--db", w.journal, "prune", "--older-than", "1d",
                           "--batch", str(batch), "--json"], env=w.env(**extra), cwd=w.dir, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("point", ["prune.P1:1", "prune.P1:3", "prune.P0:2", "prune.P2:4"])
def test_a_prune_killed_at_a_named_point_harms_no_run(world: World, point: str) -> None:  # noqa: F811
    w = world
    runs = _setup(w)
    worker = w.worker("worker_agent:agent", WORKER_TURNS=str(TURNS))
    killed = _prune(w, crash_at=point)
    assert killed.returncode == -signal.SIGKILL, (killed.stdout, killed.stderr)
    assert half_runs(w.journal) == []  # the batch in flight is gone whole, or was committed whole
    done = _prune(w)  # the next prune finishes the job
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    w.wait_until(lambda: all(w.statuses().get(r) == "completed" for r in runs), what="the open runs to finish")
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    statuses = w.statuses()
    left_old = sorted(r for r in statuses if r.startswith("old-"))
    # SQLite keeps the run of the row its anchor names; with the worker writing, that row is long past.
    assert left_old == [], (left_old, report["kept"])
    assert all(statuses[r] == "completed" for r in runs)
    applied = w.applied_per_key()
    assert len(applied) == OPEN * TURNS and set(applied.values()) == {1}  # each transfer once, none lost
    assert half_runs(w.journal) == []
    store = open_journal(w.journal)  # no JournalRolledBack, every chain checks
    try:
        for run_id in runs:
            assert store.load(run_id)
    finally:
        store.close()


def test_two_workers_prune_on_a_schedule_without_conflict(world: World) -> None:  # noqa: F811
    w = world
    runs = _setup(w)
    workers = [w.worker("worker_agent:agent", "--prune-older-than", "1d", "--prune-every", "0.2",
                        WORKER_TURNS=str(TURNS)) for _ in range(2)]
    w.wait_until(lambda: all(w.statuses().get(r) == "completed" for r in runs)
                 and not any(r.startswith("old-") for r in w.statuses()), what="runs done and old runs pruned")
    # One worker may have done everything while the other was still starting (a slow import on a
    # busy machine): a SIGTERM before its handler is installed ends it by default (-15). Each is
    # signalled once it says it polls.
    started = [_polling_line(child) for child in workers]
    pruned = 0
    for child, first in zip(workers, started, strict=True):
        child.send_signal(signal.SIGTERM)
        _, rest = child.communicate(timeout=60)
        err = first + rest
        assert child.returncode == 0, err
        assert "prune failed" not in err, err
        pruned += json.loads(err.strip().splitlines()[-1])["pruned"]
    assert pruned == OLD  # each old run removed once, by one of the two
    applied = w.applied_per_key()
    assert len(applied) == OPEN * TURNS and set(applied.values()) == {1}
    assert half_runs(w.journal) == []


def _polling_line(child: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """What ``child`` (a ``cuaderno worker``) wrote to stderr up to its "polling" line (its signal
    handlers are installed by then)."""
    import selectors
    import time

    assert child.stderr is not None
    seen = ""
    with selectors.DefaultSelector() as sel:
        sel.register(child.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while ": polling " not in seen:
            assert time.monotonic() < deadline and child.poll() is None, f"the worker never polled: {seen}"
            if sel.select(timeout=0.5):
                seen += child.stderr.readline()
    return seen
