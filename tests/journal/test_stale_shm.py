"""A journal a SIGKILL left with a ``-wal`` of its header alone and the dead process's ``-shm``
opens, read-only and read-write, in ``cuaderno show``, and its run resumes (issue 32, part 1).

SQLite writes a new ``-wal``'s 32-byte header, syncs it, then writes the first commit's frames: a
process killed between the two leaves a ``-wal`` with no frame. With no live connection, a
connection opened with ``readonly_shm`` (what a store uses on a ``-wal`` that is not empty, so that
a refused command leaves even the ``-shm`` as it was) builds a private index of that ``-wal``
without the header's salt, then finds it differs from the file's, every time: after about 10 s of
retries SQLite gives up with ``SQLITE_PROTOCOL``, which cuaderno reported as
``JournalCorrupt: ... not a readable cuaderno journal: locking protocol``, at every open. Such a
journal is now read by a read-only connection that lets SQLite rebuild the ``-shm`` (the database
file and the ``-wal`` are still never written), and a lock is never reported as damage.

``data/journal-after-sigkill-stale-shm`` holds the files of one such journal, left by random
SIGKILLs of a real run (run ``a9``), as they were found (``.bin`` only keeps them out of
``.gitignore``'s patterns). The kill loop that meets such journals at random is
``tests/crash/test_open_after_kill.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cuaderno import Agent, Policy, ScriptedGateway, Session, tool
from cuaderno.cli import app
from cuaderno.errors import JournalCorrupt, JournalError, JournalLocked
from cuaderno.events import StepEvent
from cuaderno.journal import SqliteCheckpointer
from cuaderno.journal import sqlite as sqlite_journal
from cuaderno.loop.versions import Migration
from cuaderno.testing.records import append_synced, read_records

FIXTURE = Path(__file__).resolve().parent / "data" / "journal-after-sigkill-stale-shm"
RUN = "a9"
SIDECARS = ("", "-wal", "-shm", "-anchor", "-holds")


def _copy_fixture(folder: Path) -> Path:
    """The fixture's files under their real names in ``folder``; the journal's path."""
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in SIDECARS:
        shutil.copyfile(FIXTURE / f"runs.db{suffix}.bin", folder / f"runs.db{suffix}")
    return folder / "runs.db"


def _sqlite_files(db: Path) -> dict[str, str]:
    """Hashes of the database file and its -wal (what a read never writes)."""
    return {s: hashlib.sha256(Path(f"{db}{s}").read_bytes()).hexdigest()
            for s in ("", "-wal") if Path(f"{db}{s}").exists()}


def test_the_fixture_is_a_header_only_wal_beside_a_dead_process_shm(tmp_path: Path) -> None:
    """What the fixture is (so the tests below test that shape): a -wal of 32 bytes, and a -shm
    that a connection with readonly_shm, as cuaderno opened it before, cannot get past."""
    db = _copy_fixture(tmp_path)
    assert Path(f"{db}-wal").stat().st_size == 32 and Path(f"{db}-shm").stat().st_size > 0
    assert Path(f"{db}-wal").read_bytes()[:4] == bytes.fromhex("377f0682")  # a WAL header


def test_the_fixture_opens_read_only_and_read_write_and_in_show(tmp_path: Path) -> None:
    """Before: every open raised JournalCorrupt ('locking protocol') after about 10 s."""
    db = _copy_fixture(tmp_path)
    before = _sqlite_files(db)
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.status == "running" and cp.last_seq == 32
        assert len(store.load(RUN)) == 32
    with SqliteCheckpointer(db) as store:  # read-write, writing nothing: the -wal is not folded in
        assert [c.run_id for c in store.list_runs()] == [RUN]
        assert len(store.load(RUN)) == 32
    shown = CliRunner().invoke(app, ["--db", str(db), "show", RUN, "--json"], prog_name="cuaderno")
    assert shown.exit_code == 0, shown.output
    assert '"status": "running"' in shown.output and '"next_step": "t0003.tool00.approval:decision"' in shown.output
    # The reads wrote neither the database file nor the -wal (only SQLite's -shm is rebuilt).
    assert _sqlite_files(db) == before


def _fixture_agent(receipts: Path) -> Agent:
    """An agent with the fixture run's tools: ``pay_n`` (not idempotent), ``pay_a`` (not
    idempotent, approved by a person under policy ``p1``), ``read_x`` (idempotent), each taking
    ``amount`` and ``ref``, as the journal records them. The program that made the fixture is not
    in this repository (its agent and capability versions name no agent here), so the run is
    resumed under a declared migration, the documented way to move a run to other code; the steps
    it recorded stand as they were decided. Each body writes a synced receipt (the world's record,
    not the journal's)."""

    def body(name: str, amount: int, ref: str) -> dict[str, Any]:
        append_synced(receipts, {"tool": name, "amount": amount, "ref": ref})
        return {"done": ref}

    @tool(idempotent=False)
    def pay_n(amount: int, ref: str) -> dict[str, Any]:
        """Pay without approval."""
        return body("pay_n", amount, ref)

    @tool(idempotent=False)
    def pay_a(amount: int, ref: str) -> dict[str, Any]:
        """Pay, once a person approved."""
        return body("pay_a", amount, ref)

    @tool(idempotent=True)
    def read_x(amount: int, ref: str) -> dict[str, Any]:
        """Read."""
        return body("read_x", amount, ref)

    return Agent(instructions="fixture a9", tools=[pay_n, pay_a, read_x],
                 policy=Policy({"pay_a": "require_approval"}, version="p1"))


def test_the_fixture_run_resumes_to_completion_running_only_what_had_not_run(tmp_path: Path) -> None:
    """The run a9 was killed right after its fourth approval was decided: the resume runs that
    approved payment and the next one, once each, asks the model once more, and completes."""
    db = _copy_fixture(tmp_path / "j")
    receipts, billing = tmp_path / "receipts.jsonl", tmp_path / "billing.jsonl"
    agent = _fixture_agent(receipts)
    gateway = ScriptedGateway([ScriptedGateway.text("done")], billing_log=billing)
    migration = Migration(name="fixture-a9", migrate=lambda old, new, events: {"tools": "same names and arguments"})

    async def resume() -> str:
        with SqliteCheckpointer(db) as store:
            result = await agent.run_to_end("do the work", session=Session(RUN, gateway, store,
                                                                          on_version_mismatch=migration))
            return result.status

    assert asyncio.run(resume()) == "completed"
    # The world's record: the two payments of turn 3 (the approved one, then pay_n), once each.
    assert [(r["tool"], r["ref"]) for r in read_records(receipts)] == [("pay_a", "9037-3-0"), ("pay_n", "9037-3-1")]
    assert len(read_records(billing)) == 1  # turn 4's answer; turns 0-3 were journaled
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.status == "completed"
        events = store.load(RUN)
    assert [e for e in events if e.seq <= 32][-1].step_id == "t0003.tool00.approval"
    shown = CliRunner().invoke(app, ["--db", str(db), "show", RUN], prog_name="cuaderno")
    assert shown.exit_code == 0 and "completed" in shown.output, shown.output


def _ev(run_id: str, step_id: str, seq: int) -> StepEvent:
    return StepEvent(run_id=run_id, step_id=step_id, phase="result", seq=seq, kind="tool", payload={"n": seq})


def _header_only_wal(db: Path) -> None:
    """A journal in the fixture's shape, made here: a process commits through the -wal, SQLite
    folds every frame into the file, the process is killed (its -shm stays), and the -wal is cut
    to its header (what a process killed between a new -wal's header and its first frame leaves;
    the frames cut were all in the file already, so no commit is lost)."""
    import multiprocessing
    import os
    import signal

    def child() -> None:
        store = SqliteCheckpointer(db)
        store.append([StepEvent(run_id="r", step_id="run", phase="start", seq=1, kind="run", payload={})])
        store.append([_ev("r", "s2", 2)])
        store._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()  # every frame into the file
        os.kill(os.getpid(), signal.SIGKILL)

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    with open(f"{db}-wal", "r+b") as f:
        f.truncate(32)
    assert Path(f"{db}-shm").stat().st_size > 0


def test_a_header_only_wal_made_here_opens_and_its_run_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    _header_only_wal(db)
    before = _sqlite_files(db)
    with SqliteCheckpointer(db, readonly=True) as store:
        assert [e.step_id for e in store.load("r")] == ["run", "s2"]
    assert _sqlite_files(db) == before
    with SqliteCheckpointer(db) as store:  # and it takes writes
        store.append([_ev("r", "s3", 3)])
        assert [e.step_id for e in store.load("r")] == ["run", "s2", "s3"]


def test_a_store_open_when_a_header_only_wal_appears_still_reads(tmp_path: Path) -> None:
    """A long-lived read-only store (the UI's, say) opened while no process had the journal: a
    process that then starts a new -wal and is killed before its first frame leaves SQLite unable
    to read through the store's connection (before: JournalCorrupt at every read). Before each
    read the store now sees that -wal and reopens its connection, which rebuilds the index."""
    db = tmp_path / "runs.db"
    _killed_with_frames(db)
    with SqliteCheckpointer(db, readonly=True) as reader:
        assert reader._keeper is not None  # readonly_shm: SQLite reads the -wal into a private index
        assert len(reader.load("r")) == 3
        # What a process that starts a new -wal and is killed before its first frame leaves: a
        # header with new salts (the fixture's, another process's), no frame (the frames cut
        # here were all folded into the file by the process killed above).
        Path(f"{db}-wal").write_bytes((FIXTURE / "runs.db-wal.bin").read_bytes())
        assert len(reader.load("r")) == 3
        assert reader.checkpoint("r") is not None


def _killed_with_frames(db: Path) -> None:
    """A journal whose last writer was killed after committing: a -wal with frames (all folded
    into the file too) and that process's -shm."""
    with SqliteCheckpointer(db) as store:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", seq=1, kind="run", payload={})])
        store.append([_ev("r", "s2", 2)])
    _kill_after_commit(db)


def _kill_after_commit(db: Path) -> None:
    import multiprocessing
    import os
    import signal

    def child() -> None:
        store = SqliteCheckpointer(db)
        store.append([_ev("r", "s3", 3)])
        store._db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        os.kill(os.getpid(), signal.SIGKILL)

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL


def test_an_open_kept_from_the_file_by_a_lock_is_a_lock_error(tmp_path: Path) -> None:
    """A connection that holds the journal in exclusive locking mode keeps every reader out
    (SQLITE_BUSY): the open says the journal is locked, not damaged."""
    db = tmp_path / "runs.db"
    with SqliteCheckpointer(db) as store:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", seq=1, kind="run", payload={})])
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("INSERT INTO cuaderno_meta (key, value) VALUES ('x', 'y')")
        holder.execute("COMMIT")  # exclusive locking mode: the lock is kept after the commit
        for readonly in (True, False):
            with pytest.raises(JournalLocked, match="locked by another process"):
                SqliteCheckpointer(db, readonly=readonly, busy_timeout_ms=50)
    finally:
        holder.close()


class _Locked:
    """A connection whose every statement fails as SQLite fails a read another connection's lock
    kept out (``SQLITE_BUSY`` after the busy timeout, ``SQLITE_PROTOCOL`` after SQLite's retries of
    the -wal's read locks, which take about 10 s to meet for real)."""

    def __init__(self, real: sqlite3.Connection, name: str) -> None:
        self.real, self.name = real, name

    def execute(self, *args: Any) -> Any:
        exc = sqlite3.OperationalError("database is locked" if "BUSY" in self.name else "locking protocol")
        exc.sqlite_errorname = self.name  # type: ignore[attr-defined]
        raise exc

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize("name", ["SQLITE_BUSY", "SQLITE_PROTOCOL"])
def test_a_read_kept_from_the_file_by_a_lock_is_a_lock_error_not_corruption(tmp_path: Path, name: str) -> None:
    """Before, every read SQLite refused was reported as a corrupt journal."""
    db = tmp_path / "runs.db"
    with SqliteCheckpointer(db) as store:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", seq=1, kind="run", payload={})])
    with SqliteCheckpointer(db, readonly=True) as reader:
        reader._db = _Locked(reader._db, name)  # type: ignore[assignment]
        for read in (lambda: reader.load("r"), lambda: reader.checkpoint("r"), lambda: reader.list_runs()):
            with pytest.raises(JournalLocked, match="try again") as caught:
                read()
            assert not isinstance(caught.value, JournalCorrupt)


@pytest.mark.parametrize("name", ["SQLITE_PROTOCOL", "SQLITE_BUSY", "SQLITE_BUSY_RECOVERY", "SQLITE_LOCKED"])
def test_an_open_refused_by_a_lock_is_a_lock_error(name: str) -> None:
    """What SQLite's lock errors at open are called (the shape of the fixture's error before)."""
    exc = sqlite3.OperationalError("locking protocol")
    exc.sqlite_errorname = name  # type: ignore[attr-defined]
    error = sqlite_journal._open_failure("/x/runs.db", exc, 1000)
    assert isinstance(error, JournalLocked) and isinstance(error, JournalError)
    assert not isinstance(error, JournalCorrupt)
    assert "nothing was changed" in str(error).lower()


def test_a_wal_with_frames_beside_a_stale_shm_is_read_and_the_shm_left_as_it_was(tmp_path: Path) -> None:
    """Not a change: a -wal with frames beside a dead process's -shm is still read without
    rebuilding the -shm (readonly_shm), which a read leaves byte-identical."""
    db = tmp_path / "runs.db"
    _killed_with_frames(db)
    before = {**_sqlite_files(db), "-shm": hashlib.sha256(Path(f"{db}-shm").read_bytes()).hexdigest()}
    with closing(SqliteCheckpointer(db, readonly=True)) as store:
        assert store._keeper is not None and len(store.load("r")) == 3
    assert {**_sqlite_files(db), "-shm": hashlib.sha256(Path(f"{db}-shm").read_bytes()).hexdigest()} == before


def test_after_a_protocol_error_the_next_read_reopens_and_reads(tmp_path: Path) -> None:
    """A read through readonly_shm that met SQLITE_PROTOCOL (for whatever reason) is refused as
    JournalLocked, and the next read is made on a connection that lets SQLite rebuild its index."""
    db = tmp_path / "runs.db"
    _killed_with_frames(db)
    with SqliteCheckpointer(db, readonly=True) as reader:
        assert reader._keeper is not None
        reader._db = _Locked(reader._db, "SQLITE_PROTOCOL")  # type: ignore[assignment]
        with pytest.raises(JournalLocked, match="try again"):
            reader.load("r")
        assert len(reader.load("r")) == 3  # a new connection (readonly_shm first, as at open)
        assert isinstance(reader._db, sqlite3.Connection)


def test_a_write_kept_out_by_another_connection_s_lock_is_a_lock_error(tmp_path: Path) -> None:
    """A write that waited its busy timeout for another connection's write lock: JournalLocked
    (before: a plain JournalError), nothing committed."""
    db = tmp_path / "runs.db"
    with SqliteCheckpointer(db) as store:
        store.append([StepEvent(run_id="r", step_id="run", phase="start", seq=1, kind="run", payload={})])
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        with SqliteCheckpointer(db, busy_timeout_ms=50) as store:
            holder.execute("BEGIN IMMEDIATE")  # the write lock, held
            with pytest.raises(JournalLocked, match="nothing was committed"):
                store.append([_ev("r", "s2", 2)])
            holder.execute("ROLLBACK")
            assert [e.step_id for e in store.load("r")] == ["run"]
    finally:
        holder.close()
