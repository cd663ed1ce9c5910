"""A SQLite run's hold is tied to file identities and to its holder's liveness (R22), in one process.

The attacks by real processes, counted from receipts, are in ``tests/crash/test_hold_file.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuaderno import JournalLinked, JournalReplaced, RunBusy, SqliteCheckpointer, StepEvent
from cuaderno.journal import _lease


def _start(store: SqliteCheckpointer, run: str = "r") -> None:
    store.append([StepEvent(run_id=run, step_id="run", phase="start", kind="run", payload={})])


def _holder(**process: object) -> _lease.Holder:
    held = _lease.parse(_lease.claim("me"))
    assert held is not None
    held["process"].update(process)
    return held


def test_a_claim_records_the_boot_and_the_hold_file() -> None:
    stored = json.loads(_lease.claim("me", (1, 2)))
    assert stored["holds"] == [1, 2] and stored["process"]["boot"] == _lease.this_process()["boot"]
    assert "holds" not in json.loads(_lease.claim("me"))


def test_a_holder_recorded_before_the_last_boot_is_gone() -> None:
    if _lease.this_process()["boot"] is None:
        pytest.skip("no boot id here")
    assert _lease.is_alive(_holder())
    assert not _lease.is_alive(_holder(boot="another-boot"))


def test_a_second_name_is_refused_at_open_and_at_a_takeover(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        _start(store)
        os.link(tmp_path / "runs.db", tmp_path / "other.db")
        for path in ("runs.db", "other.db"):
            for readonly in (False, True):
                with pytest.raises(JournalLinked, match="hard links"):
                    SqliteCheckpointer(tmp_path / path, readonly=readonly)
        with pytest.raises(JournalLinked):
            store.acquire("r", "w")
        os.remove(tmp_path / "other.db")
        assert store.acquire("r", "w") == 1
    finally:
        store.close()


def test_a_store_whose_file_was_replaced_writes_nothing_more(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        _start(store)
        os.rename(tmp_path / "runs.db", tmp_path / "moved.db")
        with pytest.raises(JournalReplaced, match="deleted"):
            _start(store, "r2")
        SqliteCheckpointer(tmp_path / "runs.db").close()  # nobody holds a run: a new journal there is fine
        with pytest.raises(JournalReplaced, match="replaced"):
            store.acquire("r", "w")
    finally:
        store.close()


def test_a_file_that_replaced_a_held_one_is_refused_until_its_holder_lets_go(tmp_path: Path) -> None:
    first = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        _start(first)
        epoch = first.acquire("r", "holder")  # this process holds a run of the first file
        os.rename(tmp_path / "runs.db", tmp_path / "moved.db")
        with pytest.raises(JournalReplaced):
            SqliteCheckpointer(tmp_path / "runs.db")
        assert not (tmp_path / "runs.db").exists(), "the refused open created the file"
        first.release("r", epoch)
        second = SqliteCheckpointer(tmp_path / "runs.db")  # nobody holds runs of the old file now
        try:
            _start(second)
            second.release("r", second.acquire("r", "w"))
        finally:
            second.close()
    finally:
        first.close()


HOLD = """
import sys, time
from cuaderno import SqliteCheckpointer
store = SqliteCheckpointer(sys.argv[1])
store.acquire("r", "holder")
print("held", flush=True)
sys.stdin.read()
"""


def test_a_free_lock_in_a_new_hold_file_does_not_free_a_live_holder(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    _start(store)
    with subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "runs.db")], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            os.remove(str(tmp_path / "runs.db") + "-holds")
            with pytest.raises(RunBusy, match=str(holder.pid)):
                store.acquire("r", "taker")
            assert store.checkpoint("r").epoch == 1  # type: ignore[union-attr]
            holder.kill()
            holder.wait()
            assert store.acquire("r", "taker") == 2  # gone: the run is taken over at once
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            store.close()
