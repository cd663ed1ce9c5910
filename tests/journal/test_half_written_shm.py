"""A journal whose ``-shm`` header a killed writer left half-written, while other processes still
have it open, opens and reads (CI, three workers sharing a journal, one of them SIGKILLed).

The ``-shm`` (SQLite's index of the ``-wal``) starts with two copies of one header, which a writer
updates one after the other under its write lock. A writer killed between the two leaves copies
that differ. Any connection that may write rebuilds the index from the ``-wal`` at its next read;
a read-only one cannot, and while another process keeps the ``-shm`` mapped SQLite refuses it
with ``SQLITE_READONLY_RECOVERY`` ("attempt to write a readonly database"). A store opened on a
``-wal`` with commits checks the file on a read-only connection first, so its open failed with
``JournalError: ... is read-only for this process`` in a folder it could write. Now a writable
store opens its writer (which rebuilds the index; the database file and the ``-wal`` are not
written), a read-only one waits its busy timeout for a live writer to rebuild it and is then
refused as :class:`~cuaderno.errors.JournalLocked`, and a read that meets it is never
:class:`~cuaderno.errors.JournalCorrupt`.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cuaderno.errors import JournalCorrupt, JournalLocked
from cuaderno.events import StepEvent
from cuaderno.journal import SqliteCheckpointer

_HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("SELECT count(*) FROM cuaderno_runs").fetchall()  # maps the -shm, as a live worker has it
print("open", flush=True)
sys.stdin.readline()
"""


def _journal(db: Path) -> None:
    """A journal with one run whose rows are in the -wal (a process killed before a checkpoint)."""
    code = (
        "import os, sys\n"
        "from cuaderno.events import StepEvent\n"
        "from cuaderno.journal import SqliteCheckpointer\n"
        "store = SqliteCheckpointer(sys.argv[1])\n"
        "store.append([StepEvent(run_id='r', step_id='run', phase='start', seq=1, kind='run', payload={}),\n"
        "              StepEvent(run_id='r', step_id='t0001.model', phase='result', seq=2, kind='model',\n"
        "                        payload={'response': {'text': 'hi'}})])\n"
        "os._exit(0)\n"  # no close: the rows stay in the -wal, the -shm stays
    )
    subprocess.run([sys.executable, "-c", code, str(db)], check=True)
    assert Path(f"{db}-wal").stat().st_size > 32


@contextmanager
def _held(db: Path) -> Iterator[None]:
    """Another live process has the journal open (its -shm mapped) for the block."""
    with subprocess.Popen([sys.executable, "-c", _HOLDER, str(db)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        try:
            yield
        finally:
            holder.communicate(timeout=30)  # closes its stdin: it exits


def _damage_header(db: Path) -> None:
    """The second copy of the -shm's header, as a writer killed between the two copies leaves it."""
    with open(f"{db}-shm", "r+b") as shm:
        shm.seek(48)
        shm.write(b"\x01" * 8)


@pytest.fixture
def live_holder(tmp_path: Path) -> Iterator[Path]:
    """A journal another live process has open, whose -shm header copies then differ."""
    db = tmp_path / "runs.db"
    _journal(db)
    with _held(db):
        _damage_header(db)
        yield db


def _hashes(db: Path) -> dict[str, str]:
    return {s: hashlib.sha256(Path(f"{db}{s}").read_bytes()).hexdigest() for s in ("", "-wal")}


def test_a_writable_store_opens_and_reads_and_writes(live_holder: Path) -> None:
    """Before: JournalError '... is read-only for this process' at open, in a writable folder."""
    before = _hashes(live_holder)
    with SqliteCheckpointer(live_holder) as store:
        assert [e.step_id for e in store.load("r")] == ["run", "t0001.model"]
        assert _hashes(live_holder) == before  # rebuilding the index wrote neither file
        store.append([StepEvent(run_id="r", step_id="t0002.model", phase="result", seq=3, kind="model",
                                payload={"response": {"text": "again"}})])
        assert len(store.load("r")) == 3


def test_a_read_only_store_is_refused_as_locked_after_its_busy_timeout(live_holder: Path) -> None:
    """Nobody writes: the index stays half-written, and a read-only open cannot rebuild it."""
    before = _hashes(live_holder)
    started = time.monotonic()
    with pytest.raises(JournalLocked, match="killed while it updated") as caught:
        SqliteCheckpointer(live_holder, readonly=True, busy_timeout_ms=300)
    assert time.monotonic() - started >= 0.3  # it waited for a writer first
    assert not isinstance(caught.value, JournalCorrupt)
    assert "read-only for this process" not in str(caught.value)
    assert _hashes(live_holder) == before


def test_a_read_only_store_opens_once_a_live_writer_rebuilds_the_index(live_holder: Path) -> None:
    """What a worker's next write does for the page's reader, which waits for it."""
    def write_soon() -> None:
        time.sleep(0.3)
        with SqliteCheckpointer(live_holder) as writer:
            writer.append([StepEvent(run_id="r", step_id="t0002.model", phase="result", seq=3, kind="model",
                                     payload={"response": {"text": "again"}})])

    writer = threading.Thread(target=write_soon)
    writer.start()
    try:
        with SqliteCheckpointer(live_holder, readonly=True, busy_timeout_ms=20_000) as reader:
            assert len(reader.load("r")) == 3
    finally:
        writer.join()


def test_a_read_that_meets_it_is_a_lock_error_and_a_writable_store_then_reads(tmp_path: Path) -> None:
    """A store that opened on its read-only connection, then met the damage at a read: JournalLocked
    (before: JournalCorrupt), and its next read opens its writer, which rebuilds the index."""
    db = tmp_path / "runs.db"
    _journal(db)
    with _held(db), SqliteCheckpointer(db) as store:  # the index is whole: it reads read-only
        assert store._writer is not None and len(store.load("r")) == 2
        _damage_header(db)
        with pytest.raises(JournalLocked) as caught:
            store.load("r")
        assert not isinstance(caught.value, JournalCorrupt)
        assert len(store.load("r")) == 2 and store._writer is None  # its writer rebuilt the index


def test_a_read_only_store_that_meets_it_is_refused_as_locked_then_reads_once_rebuilt(tmp_path: Path) -> None:
    """The page's long-lived reader: JournalLocked (before: JournalCorrupt), then, once a worker in
    another process has written, it reads again."""
    db = tmp_path / "runs.db"
    _journal(db)
    with _held(db), SqliteCheckpointer(db, readonly=True, busy_timeout_ms=200) as reader:
        assert len(reader.load("r")) == 2
        _damage_header(db)
        with pytest.raises(JournalLocked) as caught:
            reader.load("r")
        assert not isinstance(caught.value, JournalCorrupt)
        subprocess.run([sys.executable, "-c", "import sqlite3, sys\n"
                        "sqlite3.connect(sys.argv[1]).execute('SELECT count(*) FROM cuaderno_runs').fetchall()",
                        str(db)], check=True)  # any connection that may write rebuilds the index
        assert len(reader.load("r")) == 2
