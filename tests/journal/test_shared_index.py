"""One process, several connections to one journal file: a connection that keeps the -shm as it is
(``readonly_shm``) no longer makes every writer the process opens after it fail.

SQLite maps a file's -shm once per process and in the first connection's mode. A read-only store
on a -wal with commits in it (and a writable store before its first write) opens with
``readonly_shm``; a writer the same process opened while it was open got "attempt to write a
readonly database" at its first write. A fleet on one SQLite host met it in the shared rate
limiter: 2 of 4 workers failed at their limiter's first ``BEGIN IMMEDIATE`` in CI.

The -wal with commits in it is kept by a live process of its own (a writer that never
checkpoints), as a running worker keeps it.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cuaderno import open_journal
from cuaderno.errors import JournalLocked
from cuaderno.events import StepEvent
from cuaderno.flow.ratelimit import RateLimit, SharedLimits
from cuaderno.journal import SqliteCheckpointer
from cuaderno.journal import _shm as shm

_HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA wal_autocheckpoint=0")  # the commits stay in the -wal while it lives
db.execute("CREATE TABLE IF NOT EXISTS other_app (a)")
db.execute("INSERT INTO other_app VALUES (1)")
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def hot_journal(tmp_path: Path) -> Iterator[Path]:
    """A journal whose -wal holds commits and whose -shm a live process keeps."""
    path = tmp_path / "j.db"
    SqliteCheckpointer(path).close()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        assert (tmp_path / "j.db-wal").stat().st_size > 32 and (tmp_path / "j.db-shm").stat().st_size > 0
        yield path
    finally:
        holder.kill()
        holder.communicate()  # and closes its pipes


def _write(store: SqliteCheckpointer, run_id: str) -> None:
    store.append([StepEvent(run_id=run_id, step_id="run", phase="start", kind="run")])


def test_a_writer_opened_while_a_read_only_store_is_open_writes(hot_journal: Path) -> None:
    reader = SqliteCheckpointer(hot_journal, readonly=True)
    assert reader.list_runs() == []
    writer = SqliteCheckpointer(hot_journal)
    _write(writer, "r1")  # before: JournalError "... attempt to write a readonly database"
    assert [c.run_id for c in reader.list_runs()] == ["r1"]  # the reader stepped aside and still reads
    writer.close()
    assert [c.run_id for c in reader.list_runs()] == ["r1"]
    reader.close()


def test_the_rate_limiter_beside_a_store_that_has_not_written_yet(hot_journal: Path) -> None:
    """What the fleet met: the store opens read-only (a -wal with commits), the limiter's connection
    opens, then both write."""
    store = open_journal(f"sqlite:///{hot_journal}")
    limits = SharedLimits(store)
    turn = limits.reserve("b", RateLimit(requests_per_minute=600), 0)  # before: attempt to write a readonly database
    assert turn.wait >= 0
    _write(store, "r1")  # the store's own writer too
    limits.reserve("b", RateLimit(requests_per_minute=600), 0)
    limits.close()
    store.close()


def test_a_writer_waits_for_a_busy_reader_and_then_writes(hot_journal: Path) -> None:
    reader = SqliteCheckpointer(hot_journal, readonly=True)
    reader.list_runs()
    freed = threading.Event()
    started = threading.Event()

    def busy() -> None:
        with reader._lock:  # a read in progress: the reader cannot step aside meanwhile
            started.set()
            time.sleep(0.3)
        freed.set()

    t = threading.Thread(target=busy)
    t.start()
    started.wait()
    writer = SqliteCheckpointer(hot_journal)
    _write(writer, "r1")
    assert freed.is_set()  # it waited for the read to end, then wrote
    t.join()
    assert [c.run_id for c in reader.list_runs()] == ["r1"]
    writer.close()
    reader.close()


def test_a_connection_that_never_steps_aside_is_journal_locked_after_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    path.write_bytes(b"")
    keeper = shm.Keeper.register(str(path), lambda: False)
    assert keeper is not None
    with pytest.raises(JournalLocked, match="kept SQLite's index of the journal read-only"):
        shm.writer(str(path), 0.05)
    keeper.release()
    release = shm.writer(str(path), 0.05)
    assert shm.Keeper.register(str(path), lambda: True) is None  # none while the writer is open
    release()
    again = shm.Keeper.register(str(path), lambda: True)
    assert again is not None
    again.release()


def test_a_read_only_store_alone_still_leaves_the_shm_as_it_was(hot_journal: Path) -> None:
    """What readonly_shm is for is kept where no writer of the process needs the -shm."""
    shm_file = Path(f"{hot_journal}-shm")
    before = shm_file.read_bytes()
    with SqliteCheckpointer(hot_journal, readonly=True) as reader:
        assert reader._keeper is not None
        reader.list_runs()
    assert shm_file.read_bytes() == before
