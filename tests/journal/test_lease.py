"""Liveness of a run's holder: only a provably gone process loses the run without ``force``.

The ``is_alive`` cases are the fallback where OS record locks are not available."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cuaderno import SqliteCheckpointer, StepEvent
from cuaderno.journal import _lease


def _holder(**process: object) -> _lease.Holder:
    held = _lease.parse(_lease.claim("me"))
    assert held is not None
    held["process"].update(process)
    return held


def test_this_process_holds_its_own_claim() -> None:
    held = _holder()
    assert held["held"] and _lease.is_mine(held) and _lease.is_alive(held)


def test_a_process_that_exited_is_gone() -> None:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    held = _holder(pid=int(child.stdout))
    assert not _lease.is_mine(held) and not _lease.is_alive(held)


def test_a_recycled_pid_is_not_the_holder() -> None:
    held = _holder(start=(_lease.this_process()["start"] or 0) + 1)  # this PID, another process's start
    assert not _lease.is_mine(held) and not _lease.is_alive(held)


def test_a_holder_elsewhere_counts_as_alive() -> None:
    # Another host or PID namespace cannot be asked: only force takes such a run over.
    assert _lease.is_alive(_holder(host="elsewhere", pid=1))
    assert _lease.is_alive(_holder(ns=-1, pid=999_999_999))


def test_liveness_says_what_is_proven_and_what_is_not() -> None:
    """Three answers, not two (R23): a PostgreSQL taker must tell a holder it *knows* is alive or
    gone from one it cannot know about, whose step in flight may still be running."""
    assert _lease.liveness(_holder()) == "alive"  # this process
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    assert _lease.liveness(_holder(pid=int(child.stdout))) == "gone"
    assert _lease.liveness(_holder(start=(_lease.this_process()["start"] or 0) + 1)) == "gone"  # a recycled PID
    assert _lease.liveness(_holder(boot="another-boot")) == "gone"  # recorded before this host's last boot
    assert _lease.liveness(_holder(host="elsewhere", pid=1)) == "unknown"
    assert _lease.liveness(_holder(ns=-1, pid=999_999_999)) == "unknown"
    assert _lease.liveness(_holder(pid=None)) == "unknown"


def test_released_and_unknown_forms() -> None:
    stored = _lease.claim("worker-1")
    assert json.loads(_lease.released(stored) or "")["held"] is False
    for old in (None, "", "host:123", "not json {", json.dumps({"owner": "x"}), "[1]"):
        assert _lease.parse(old) is None  # nobody to wait for (a journal from before holders were recorded)
    assert "worker-1" in _lease.describe(_lease.parse(stored) or {})


def test_a_holder_in_another_container_that_died_is_taken_over_at_once(tmp_path: Path) -> None:
    # The journal names a holder this process cannot ask about (another host name and PID
    # namespace: a container that was restarted). Nobody holds the run's lock: it is gone.
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", payload={})])
        gone = {"owner": "worker-1", "held": True, "process": {"host": "container-1", "ns": 1, "pid": 7, "start": 1}}
        store._db.execute("UPDATE cuaderno_runs SET owner=? WHERE run_id='r'", (json.dumps(gone),))
        assert store.acquire("r", "worker-2") == 1
    finally:
        store.close()


ACQUIRE = """
import sys
from cuaderno import SqliteCheckpointer
store = SqliteCheckpointer(sys.argv[1])
epoch = store.acquire("r", sys.argv[2], force=sys.argv[3] == "force")
store.release("r", epoch)
store.close()
print(epoch)
"""


def _started(tmp_path: Path) -> SqliteCheckpointer:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    store.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run", payload={})])
    return store


def test_a_holder_taken_over_by_force_gives_its_lock_back_when_it_lets_go(tmp_path: Path) -> None:
    store = _started(tmp_path)
    try:
        mine = store.acquire("r", "a")  # this process holds the run, and stays alive
        forced = subprocess.run([sys.executable, "-c", ACQUIRE, store.path, "b", "force"], capture_output=True,
                                text=True, check=True)
        assert int(forced.stdout) == mine + 1
        store.release("r", mine)  # out of date now: it must still give the OS lock back
        after = subprocess.run([sys.executable, "-c", ACQUIRE, store.path, "c", "no"], capture_output=True, text=True)
        assert after.returncode == 0, after.stderr[-500:]
    finally:
        store.close()


def test_lock_files_are_not_kept_open_once_their_runs_are_released(tmp_path: Path) -> None:
    fds = len(os.listdir("/proc/self/fd")) if Path("/proc/self/fd").exists() else None
    for i in range(40):
        (tmp_path / f"{i}").mkdir()
        store = _started(tmp_path / f"{i}")
        store.release("r", store.acquire("r", "job"))
        store.close()
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) <= fds + 1
