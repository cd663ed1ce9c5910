"""SQLite-specific journal tests: pragmas, several connections and processes, schema guard, R7, R12.

Everything backend-neutral is in the conformance suite (``test_conformance.py``); these tests
look at the file itself, with raw ``sqlite3`` connections where needed. Every raw connection is
closed (``filterwarnings=error`` turns a leaked one into a failure).
"""

from __future__ import annotations

import ast
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from _files import journal_files, load_refused

import cuaderno
from cuaderno.checkpoint import rebuild
from cuaderno.errors import (
    FencedOut,
    JournalConflict,
    JournalCorrupt,
    JournalError,
    RunNotFound,
    SchemaTooNew,
    UsageError,
)
from cuaderno.events import StepEvent, model_step_id
from cuaderno.journal import SqliteCheckpointer
from cuaderno.journal.base import SCHEMA_VERSION
from cuaderno.testing.conformance import HOSTILE_IDS, INVALID_IDS

SRC = Path(__file__).resolve().parents[2] / "src" / "cuaderno"


# -- helpers ---------------------------------------------------------------------------------------------


def _ev(run: str, step: str, phase: str = "intent", kind: str = "tool", **fields: Any) -> StepEvent:
    return StepEvent(run_id=run, step_id=step, phase=phase, kind=kind, **fields)


@contextmanager
def _raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection in autocommit mode, closed on exit."""
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        yield db


def _build(path: Path, runs: int = 12, steps: int = 25) -> dict[str, list[tuple[Any, ...]]]:
    """A closed journal with several runs spread over many pages; returns each run's rows."""
    with SqliteCheckpointer(path) as store:
        for r in range(runs):
            run = f"run{r}"
            store.append([_ev(run, "run", "start", "run")] +
                         [_ev(run, model_step_id(i), "result", "model",
                              payload={"response": {"text": f"{run} step {i} " + "x" * 150, "cost": 0.001}})
                          for i in range(steps)])
        return {f"run{r}": [_rows_of(e) for e in store.load(f"run{r}")] for r in range(runs)}


def _rows_of(e: StepEvent) -> tuple[Any, ...]:
    return (e.run_id, e.step_id, e.phase, e.seq, e.kind, e.name, e.decision, e.fingerprint, e.codec,
            e.encoded_payload(), e.created_at, e.row_hash)


def _never_silent(path: Path, original: dict[str, list[tuple[Any, ...]]]) -> int:
    """Open and load every run: each either raises JournalCorrupt or returns exactly the original rows.

    Returns how many runs were refused (the open itself refusing counts as all of them).
    """
    try:
        store = SqliteCheckpointer(path)
    except JournalCorrupt:
        return len(original)
    refused = 0
    try:
        for run, rows in original.items():
            try:
                loaded = [_rows_of(e) for e in store.load(run)]
            except JournalCorrupt:
                refused += 1
                continue
            assert loaded == rows, f"run {run}: load() returned changed rows without an error"
    finally:
        store.close()
    return refused


# -- pragmas and paths -------------------------------------------------------------------------------------


def test_default_pragmas_wal_and_full(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        db = store._db
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
    with _raw(path) as db:  # WAL is a property of the file, seen by every later connection
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_normal_only_when_asked(tmp_path: Path) -> None:
    with SqliteCheckpointer(tmp_path / "j.db", synchronous="NORMAL", busy_timeout_ms=1234) as store:
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert store._db.execute("PRAGMA busy_timeout").fetchone()[0] == 1234
    with SqliteCheckpointer(tmp_path / "j.db", synchronous="FULL") as store:
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2


@pytest.mark.parametrize("value", ["OFF", "EXTRA", "full", "normal", "", "FULL; DROP TABLE cuaderno_events", 2, None])
def test_invalid_synchronous_is_usage_error(tmp_path: Path, value: Any) -> None:
    path = tmp_path / "j.db"
    with pytest.raises(UsageError, match="synchronous"):
        SqliteCheckpointer(path, synchronous=value)
    assert not path.exists(), "an invalid setting must be refused before the file is created"


def test_directory_path_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="directory"):
        SqliteCheckpointer(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_zero_byte_file_is_a_new_journal(tmp_path: Path) -> None:
    """Documented limit of R7: SQLite treats an empty file as a new database, so truncation to 0 bytes
    (like deleting the file) cannot be told apart from a fresh journal; its runs are simply unknown."""
    path = tmp_path / "j.db"
    path.touch()
    with SqliteCheckpointer(path) as store:
        with pytest.raises(RunNotFound):
            store.load("run0")
        store.append([_ev("r", "run", "start", "run")])
    assert path.stat().st_size > 0


def test_readonly_reads_and_refuses_every_write(tmp_path: Path) -> None:
    """A read-only store sees what a writer commits, refuses writes with a UsageError, and the
    file is byte-identical afterwards, even in rollback (DELETE) mode."""
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as writer:
        writer.append([_ev("r", "run", "start", "run")])
        with SqliteCheckpointer(path, readonly=True) as reader:
            assert [e.seq for e in reader.load("r")] == [1]
            writer.append([_ev("r", "s1")])
            assert [e.seq for e in reader.load("r")] == [1, 2]
            assert [cp.run_id for cp in reader.list_runs()] == ["r"]
    with _raw(path) as db:
        assert db.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    before = journal_files(path)
    with SqliteCheckpointer(path, readonly=True) as reader:
        for write in (lambda: reader.append([_ev("r", "s2")]), lambda: reader.acquire("r", "me"),
                      lambda: reader.release("r", 1)):
            with pytest.raises(UsageError, match="read-only"):
                write()
        cp = reader.checkpoint("r")
        assert cp is not None and cp.last_seq == 2
    assert journal_files(path) == before


def test_readonly_refuses_files_that_are_not_journals(tmp_path: Path) -> None:
    other = tmp_path / "app.db"
    with _raw(other) as db:
        db.execute("CREATE TABLE t (x)")
    before = journal_files(other)
    with pytest.raises(JournalError, match="not a cuaderno journal"):
        SqliteCheckpointer(other, readonly=True)
    with pytest.raises(JournalError, match="does not exist: there is no journal there") as info:
        SqliteCheckpointer(tmp_path / "missing.db", readonly=True)
    assert not isinstance(info.value, JournalCorrupt)  # nothing is damaged: there is no file
    assert journal_files(other) == before
    assert not (tmp_path / "missing.db").exists()


# -- several connections, several processes -----------------------------------------------------------------


def test_two_stores_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as a, SqliteCheckpointer(path) as b:
        a.append([_ev("r", "run", "start", "run"), _ev("r", "s1")])
        assert [e.step_id for e in b.load("r")] == ["run", "s1"]
        b.append([_ev("r", "s2")])
        assert [e.step_id for e in a.load("r")] == ["run", "s1", "s2"]
        assert a.checkpoint("r") == b.checkpoint("r")
        assert [c.run_id for c in a.list_runs()] == ["r"]


CHILD = textwrap.dedent("""
    import sys
    from cuaderno.events import StepEvent
    from cuaderno.journal import SqliteCheckpointer

    path, run, prefix, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = SqliteCheckpointer(path)
    try:
        for i in range(n):
            store.append([StepEvent(run_id=run, step_id=f"{prefix}.{i}", phase="intent", kind="tool",
                                    payload={"i": i, "by": prefix})])
            # the same event from every process: it must land once
            store.append([StepEvent(run_id=run, step_id=f"shared.{i}", phase="intent", kind="tool",
                                    payload={"i": i})])
    finally:
        store.close()
    print("ok")
""")


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC.parent), env.get("PYTHONPATH", "")])
    return env


def test_second_process_appends_to_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        store.append([_ev("r", "run", "start", "run"), _ev("r", "mine.0")])  # this object now caches seq 2
        done = subprocess.run([sys.executable, "-c", CHILD, str(path), "r", "child", "3"], env=_child_env(),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "ok"
        loaded = store.load("r")
        assert [e.step_id for e in loaded] == ["run", "mine.0", "child.0", "shared.0", "child.1", "shared.1",
                                               "child.2", "shared.2"]
        out = store.append([_ev("r", "mine.1")])  # through the stale cache
        assert out[0].seq == 9
        assert store.append([_ev("r", "shared.1", payload={"i": 1})])[0].seq == 6  # the child's row, deduplicated
        loaded = store.load("r")
        cp = store.checkpoint("r")
        assert cp is not None
        assert cp.to_json() == rebuild("r", loaded, epoch=cp.epoch).to_json()


def test_concurrent_processes_append_to_one_run(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        store.append([_ev("r", "run", "start", "run")])
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(path), "r", f"p{i}", "10"], env=_child_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    with SqliteCheckpointer(path) as store:
        loaded = store.load("r")
        assert len(loaded) == 1 + 3 * 10 + 10
        assert [e.seq for e in loaded] == list(range(1, len(loaded) + 1))
        cp = store.checkpoint("r")
        assert cp is not None and cp.to_json() == rebuild("r", loaded).to_json()
    with _raw(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- cache safety ---------------------------------------------------------------------------------------------


def test_cached_checkpoint_is_revalidated_after_another_connection_appends(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as a, SqliteCheckpointer(path) as b:
        a.append([_ev("r", "run", "start", "run"), _ev("r", "a1")])  # a caches last_seq 2
        b.append([_ev("r", "b1", payload={"from": "b"})])
        out = a.append([_ev("r", "a2")])
        assert out[0].seq == 4, "a stale cache would reuse seq 3"
        assert a.append([_ev("r", "b1", payload={"from": "b"})])[0].seq == 3  # b's row: a no-op, no conflict
        with pytest.raises(JournalConflict):
            a.append([_ev("r", "b1", payload={"from": "a"})])
        for store in (a, b):
            loaded = store.load("r")
            assert [(e.step_id, e.seq) for e in loaded] == [("run", 1), ("a1", 2), ("b1", 3), ("a2", 4)]
            cp = store.checkpoint("r")
            assert cp is not None and cp.to_json() == rebuild("r", loaded, epoch=cp.epoch).to_json()
        # A takeover through b must fence a, whose cache still says epoch 0.
        epoch = b.acquire("r", "b")
        with pytest.raises(FencedOut):
            a.append([_ev("r", "a3")], epoch=0)
        assert a.append([_ev("r", "a3")], epoch=epoch)[0].seq == 5
        assert b.append([_ev("r", "b2")])[0].seq == 6
        assert a.append([_ev("r", "a4")])[0].seq == 7
        cp = a.checkpoint("r")
        assert cp is not None and cp.epoch == epoch and cp.last_hash == b.load("r")[-1].row_hash


def test_a_commit_by_another_connection_invalidates_every_cached_run(tmp_path: Path) -> None:
    """The cache is trusted only while no other connection has committed (SQLite's data_version).
    Noticing another writer while appending to one run must not leave another run's entry trusted."""
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as a, SqliteCheckpointer(path) as b:
        a.append([_ev("x", "run", "start", "run")])
        a.append([_ev("y", "run", "start", "run")])  # a caches x and y at seq 1
        b.append([_ev("y", "b1")])  # y's seq 2, written by b
        assert a.append([_ev("x", "a1")])[0].seq == 2  # a notices another writer here
        assert a.append([_ev("y", "a2")])[0].seq == 3, "a stale cache of y would reuse seq 2"
        assert [(e.step_id, e.seq) for e in a.load("y")] == [("run", 1), ("b1", 2), ("a2", 3)]


def test_a_summary_another_connection_left_as_it_was_is_not_parsed_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """After another connection's commit, a run whose stored summary is still the text this
    connection wrote is used as it was kept (four workers on one file would otherwise parse every
    run's summary at nearly every append); one whose text changed is read and parsed again."""
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as a, SqliteCheckpointer(path) as b:
        a.append([_ev("x", "run", "start", "run")])
        a.append([_ev("y", "run", "start", "run")])
        parsed: list[str] = []
        original = SqliteCheckpointer._summary_of

        def counted(self: SqliteCheckpointer, db: Any, run_id: str, text: Any) -> Any:
            if self is a:
                parsed.append(run_id)
            return original(self, db, run_id, text)

        monkeypatch.setattr(SqliteCheckpointer, "_summary_of", counted)
        b.append([_ev("y", "b1")])  # another connection commits, to y only
        assert a.append([_ev("x", "a1")])[0].seq == 2
        assert a.append([_ev("y", "a2")])[0].seq == 3, "y's summary as a kept it would reuse seq 2"
        b.append([_ev("z", "run", "start", "run")])  # and again, to another run
        assert a.append([_ev("x", "a3")])[0].seq == 3
        assert parsed == ["y"]
        monkeypatch.undo()
        epoch = b.acquire("x", "b")  # a takeover changes the epoch column only: a is fenced all the same
        with pytest.raises(FencedOut):
            a.append([_ev("x", "a4")], epoch=0)
        for run_id in ("x", "y"):
            loaded = b.load(run_id)
            cp = a.checkpoint(run_id)
            assert cp is not None and cp.to_json() == rebuild(run_id, loaded, epoch=cp.epoch).to_json()
        cp = a.checkpoint("x")
        assert cp is not None and cp.epoch == epoch


class _AppendBeforeEventsRead:
    """Stands in for a store's connection: just before the events are read, another store commits."""

    def __init__(self, db: sqlite3.Connection, commit: Any) -> None:
        self._db, self._commit, self.fired = db, commit, False

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        if not self.fired and sql.startswith("SELECT run_id"):
            self.fired = True
            self._commit()
        return self._db.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


def test_load_reads_checkpoint_and_rows_from_one_snapshot(tmp_path: Path) -> None:
    """A writer committing between load()'s two reads must not look like a damaged journal.

    Read apart, the rows would run past the head the checkpoint named and load() would call the
    journal corrupt; read in one transaction, it returns the run as it was when the read began."""
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as reader, SqliteCheckpointer(path) as writer:
        writer.append([_ev("r", "run", "start", "run"), _ev("r", "s1")])
        real = reader._db
        proxy = _AppendBeforeEventsRead(real, lambda: writer.append([_ev("r", "s2"), _ev("r", "s3")]))
        reader._db = proxy  # type: ignore[assignment]
        try:
            loaded = reader.load("r")
        finally:
            reader._db = real
        assert proxy.fired, "the events query was not intercepted: the test no longer tests anything"
        assert [(e.step_id, e.seq) for e in loaded] == [("run", 1), ("s1", 2)]
        assert [e.step_id for e in reader.load("r")] == ["run", "s1", "s2", "s3"]
        assert real.in_transaction is False, "load() left its read transaction open"


def test_reopen_continues_the_chain(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        first = store.append([_ev("r", "run", "start", "run"), _ev("r", "s1")])
    with SqliteCheckpointer(path) as store:
        assert [e == f for e, f in zip(store.load("r"), first, strict=True)] == [True, True]
        assert store.append([_ev("r", "s2")])[0].seq == 3
        assert len(store.load("r")) == 3


def test_append_only_prefix_and_integrity(tmp_path: Path) -> None:
    """I5/I7: refused and duplicate appends never rewrite a stored row; integrity_check stays ok."""
    path = tmp_path / "j.db"
    query = "SELECT * FROM cuaderno_events ORDER BY run_id, seq"
    with SqliteCheckpointer(path) as store:
        store.append([_ev("r", "run", "start", "run"), _ev("r", "s1", payload={"a": 1})])
        with _raw(path) as db:
            before = db.execute(query).fetchall()
        store.append([_ev("r", "s1", payload={"a": 1})])
        for bad in ([_ev("r", "s1", payload={"a": 2})], [_ev("r", "s9"), _ev("r", "")],
                    [_ev("r", "s9", payload={"x": float("nan")})]):
            with pytest.raises((JournalConflict, UsageError, ValueError)):
                store.append(bad)
        epoch = store.acquire("r", "me")
        with pytest.raises(FencedOut):
            store.append([_ev("r", "s2")], epoch=epoch - 1)
        store.append([_ev("r", "s2")], epoch=epoch)
        with _raw(path) as db:
            after = db.execute(query).fetchall()
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert after[:len(before)] == before
    assert len(after) == len(before) + 1


# -- schema guard ----------------------------------------------------------------------------------------------


def test_schema_too_new_is_refused_and_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        store.append([_ev("r", "run", "start", "run")])
    with _raw(path) as db:
        db.execute("UPDATE cuaderno_meta SET value='99' WHERE key='schema_version'")
    before = journal_files(path)
    with pytest.raises(SchemaTooNew) as info:
        SqliteCheckpointer(path)
    assert (info.value.found, info.value.supported) == (99, SCHEMA_VERSION)
    assert journal_files(path) == before


def test_current_schema_version_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path):
        pass
    with _raw(path) as db:
        assert db.execute("SELECT value FROM cuaderno_meta WHERE key='schema_version'").fetchone() == (
            str(SCHEMA_VERSION),)


# -- R7: corrupt journal files ----------------------------------------------------------------------------------


def _garbage(path: Path) -> None:
    path.write_bytes(random.Random(7).randbytes(3 * 4096))


def _zero_header(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(b"\0" * 100)


@pytest.mark.parametrize("damage", [_garbage, _zero_header], ids=["garbage", "zeroed-header"])
def test_unreadable_file_is_journal_corrupt_and_untouched(tmp_path: Path, damage: Any) -> None:
    path = tmp_path / "j.db"
    original = _build(path)
    damage(path)
    before = journal_files(path)
    assert _never_silent(path, original) == len(original)
    assert journal_files(path) == before


def test_truncated_file_is_journal_corrupt_and_untouched(tmp_path: Path) -> None:
    base = tmp_path / "base.db"
    original = _build(base)
    size = base.stat().st_size
    assert size >= 10 * 4096
    sizes = sorted({*range(4096, size, 4096), 100, 1000, 4097, size // 2 + 7, size - 1})
    for cut in sizes:
        path = tmp_path / f"cut{cut}.db"
        shutil.copy(base, path)
        os.truncate(path, cut)
        before = journal_files(path)
        refused = _never_silent(path, original)
        assert refused > 0, f"a journal truncated to {cut} of {size} bytes was loaded without an error"
        assert journal_files(path) == before, f"truncated to {cut}: the file was modified"
        path.unlink()


def _edited(tmp_path: Path, statement: str, params: tuple[Any, ...] = (), rows: int = 1) -> Path:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        store.append([_ev("r", "run", "start", "run")] +
                     [_ev("r", f"s{i}", name="tool", fingerprint=f"fp{i}", payload={"i": i}) for i in range(1, 6)])
        store.append([_ev("other", "run", "start", "run")])
    with _raw(path) as db:
        changed = db.execute(statement, params).rowcount
    assert changed == rows, f"the edit {statement!r} changed {changed} rows"
    return path


@pytest.mark.parametrize(("statement", "params", "message"), [
    ("UPDATE cuaderno_events SET payload=? WHERE run_id='r' AND seq=3", (b'{"i":20}',), "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET payload=CAST(payload AS TEXT) || ' ' WHERE run_id='r' AND seq=3", (),
     "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET step_id='s9' WHERE run_id='r' AND seq=3", (), "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET phase='result' WHERE run_id='r' AND seq=3", (), "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET kind='model' WHERE run_id='r' AND seq=3", (), "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET name='other' WHERE run_id='r' AND seq=3", (), "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET decision='allow' WHERE run_id='r' AND seq=3", (), "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET fingerprint='fp9' WHERE run_id='r' AND seq=3", (), "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET row_hash=? WHERE run_id='r' AND seq=3", ("0" * 32,), "row 3 .* was altered"),
    ("UPDATE cuaderno_events SET seq=CASE seq WHEN 3 THEN 4 ELSE 3 END WHERE run_id='r' AND seq IN (3, 4)", (),
     "row 3 .* was altered"),
    ("DELETE FROM cuaderno_events WHERE run_id='r' AND seq=3", (), "row 3 is missing"),
    ("DELETE FROM cuaderno_events WHERE run_id='r' AND seq=1", (), "row 1 is missing"),
    ("DELETE FROM cuaderno_events WHERE run_id='r' AND seq=6", (), "rows removed"),
    ("UPDATE cuaderno_events SET run_id='other' WHERE run_id='r' AND seq=6", (), "rows removed"),
], ids=["payload", "payload-bytes", "step_id", "phase", "kind", "name", "decision", "fingerprint", "row_hash",
        "swapped-seq", "deleted-middle", "deleted-first", "deleted-tail", "moved-tail"])
def test_edited_rows_are_journal_corrupt(tmp_path: Path, statement: str, params: tuple[Any, ...],
                                         message: str) -> None:
    load_refused(_edited(tmp_path, statement, params, rows=2 if "CASE" in statement else 1), JournalCorrupt, message)


def test_seeded_bit_flips_are_never_silent(tmp_path: Path) -> None:
    """R7 sweep: a flipped bit anywhere past the header either raises (some error) or changes nothing
    that the hash chain covers. ``created_at`` is informational and outside the chain."""
    base = tmp_path / "base.db"
    original = _build(base)
    size = base.stat().st_size
    rnd = random.Random(20240611)
    detected = 0
    for i in range(150):
        path = tmp_path / f"flip{i}.db"
        shutil.copy(base, path)
        with path.open("r+b") as f:
            offset = rnd.randrange(100, size)
            f.seek(offset)
            byte = f.read(1)[0]
            f.seek(offset)
            f.write(bytes([byte ^ (1 << rnd.randrange(8))]))
        try:
            with SqliteCheckpointer(path) as store:
                for run, rows in original.items():
                    loaded = [_rows_of(e)[:10] + _rows_of(e)[11:] for e in store.load(run)]
                    assert loaded == [r[:10] + r[11:] for r in rows], f"flip at {offset}: {run} changed silently"
        except AssertionError:
            raise
        except Exception:  # any refusal counts here; the xfail tests below pin the types
            detected += 1
        path.unlink()
    assert detected > 50


# R7: damage found while reading (driver, decoder and type errors) is JournalCorrupt.


def test_damaged_checkpoint_row_is_journal_corrupt(tmp_path: Path) -> None:
    path = _edited(tmp_path, "UPDATE cuaderno_runs SET checkpoint='{\"run_id\":\"r\",\"sta' WHERE run_id='r'")
    with SqliteCheckpointer(path) as store, pytest.raises(JournalCorrupt):
        store.load("r")


def test_invalid_utf8_in_a_row_is_journal_corrupt(tmp_path: Path) -> None:
    path = _edited(tmp_path, "UPDATE cuaderno_events SET step_id=CAST(x'ff' AS TEXT) WHERE run_id='r' AND seq=3")
    with SqliteCheckpointer(path) as store, pytest.raises(JournalCorrupt):
        store.load("r")


def test_wrong_column_type_is_journal_corrupt(tmp_path: Path) -> None:
    path = _edited(tmp_path, "UPDATE cuaderno_events SET seq='three' WHERE run_id='r' AND seq=3")
    with SqliteCheckpointer(path) as store, pytest.raises(JournalCorrupt):
        store.load("r")


def test_damaged_events_page_is_journal_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    _build(path)
    with _raw(path) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name='cuaderno_events'").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
    with path.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\x00" * 12)  # the b-tree page header: an invalid page type
    before = journal_files(path)
    try:
        with pytest.raises(JournalCorrupt), SqliteCheckpointer(path) as store:  # at open (the rollback check) or load
            store.load("run3")
    finally:
        assert journal_files(path) == before


# -- R12: identifiers, and no string-built SQL -------------------------------------------------------------------


def _schema_and_counts(path: Path) -> tuple[list[tuple[Any, ...]], int, int, int]:
    with _raw(path) as db:
        schema = db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name").fetchall()
        events = db.execute("SELECT count(*) FROM cuaderno_events").fetchone()[0]
        runs = db.execute("SELECT count(*) FROM cuaderno_runs").fetchone()[0]
        meta = db.execute("SELECT count(*) FROM cuaderno_meta").fetchone()[0]
    return schema, events, runs, meta


def test_hostile_ids_leave_schema_and_counts_intact(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path):
        pass
    schema, _, _, meta = _schema_and_counts(path)
    with SqliteCheckpointer(path) as store:
        for value in HOSTILE_IDS:
            store.append([_ev(value, "run", "start", "run", name=value), _ev(value, value, value, name=value)])
            assert [(e.run_id, e.step_id, e.phase, e.name) for e in store.load(value)][1] == (value,) * 4
    assert _schema_and_counts(path) == (schema, 2 * len(HOSTILE_IDS), len(HOSTILE_IDS), meta)
    with SqliteCheckpointer(path) as store:
        for field in ("run_id", "step_id"):
            for bad in INVALID_IDS:
                fields: dict[str, Any] = {"run_id": "r", "step_id": "s", "phase": "p", "kind": "tool", field: bad}
                with pytest.raises(UsageError):
                    store.append([StepEvent(**fields)])
    assert _schema_and_counts(path) == (schema, 2 * len(HOSTILE_IDS), len(HOSTILE_IDS), meta)
    with _raw(path) as db:
        stored = {row[0] for row in db.execute("SELECT run_id FROM cuaderno_runs")}
    assert stored == set(HOSTILE_IDS)


_SQL = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA|REPLACE|VACUUM|ATTACH|BEGIN|COMMIT|"
                  r"ROLLBACK|WHERE|VALUES)\b")

# The only interpolations allowed in SQL (none: every statement of both dialects is written out in
# journal/_sql.py's Dialect objects).
_ALLOWED: set[tuple[str, str]] = set()


def _literal_text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return None


def _string_built_sql(source: str) -> list[tuple[int, str, ast.AST]]:
    """SQL text built with an f-string, ``%``, ``.format()`` or ``+`` on a non-literal: (line, how, node)."""
    sites: list[tuple[int, str, ast.AST]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in node.values):
            if _SQL.search(_literal_text(node) or ""):
                sites.append((node.lineno, "f-string", node))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
            texts = [_literal_text(side) for side in (node.left, node.right)]
            literal_sql = any(t is not None and _SQL.search(t) for t in texts)
            if literal_sql and (isinstance(node.op, ast.Mod) or None in texts):
                sites.append((node.lineno, "%" if isinstance(node.op, ast.Mod) else "+", node))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format"
              and _SQL.search(_literal_text(node.func.value) or "")):
            sites.append((node.lineno, ".format()", node))
    return sites


def _only_columns(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) and all(
        isinstance(v, ast.Constant) or (isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name)
                                        and v.value.id == "_COLUMNS" and v.conversion == -1 and v.format_spec is None)
        for v in node.values)


def test_no_string_built_sql_in_src() -> None:
    """R12 static check: 0 string-built SQL sites in src/cuaderno besides the whitelisted _COLUMNS lines."""
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 10
    found, allowed_seen = [], set()
    for file in files:
        rel = file.relative_to(SRC).as_posix()
        source = file.read_text(encoding="utf-8")
        lines = source.splitlines()
        for lineno, how, node in _string_built_sql(source):
            line = lines[lineno - 1].strip()
            if (rel, line) in _ALLOWED and how == "f-string" and _only_columns(node):
                allowed_seen.add((rel, line))
                continue
            found.append(f"{rel}:{lineno}: {how}: {line}")
    assert found == [], "string-built SQL (use bound parameters):\n" + "\n".join(found)
    assert allowed_seen == _ALLOWED, f"stale whitelist entries: {_ALLOWED - allowed_seen}"
    # The column list bench_step_parts.py builds its statements from: a constant list of names.
    module = ast.parse((SRC / "journal" / "sqlite.py").read_text(encoding="utf-8"))
    columns = [n.value for n in module.body if isinstance(n, ast.Assign)
               and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["_COLUMNS"]]
    assert len(columns) == 1 and isinstance(columns[0], ast.Constant) and isinstance(columns[0].value, str)
    assert re.fullmatch(r"[a-z_]+(, [a-z_]+)*", columns[0].value), "_COLUMNS must be a constant list of names"


@pytest.mark.parametrize(("snippet", "expected"), [
    ('db.execute(f"SELECT * FROM t WHERE id={run_id}")', ["f-string"]),
    ('db.execute("DELETE FROM t WHERE id=%s" % run_id)', ["%"]),
    ('db.execute("UPDATE t SET a={}".format(x))', [".format()"]),
    ('db.execute("SELECT * FROM t WHERE id=\'" + run_id + "\'")', ["+"]),
    ('db.execute(f"PRAGMA busy_timeout={int(ms)}")', ["f-string"]),
    ('db.execute(f"SELECT {_COLUMNS} FROM t WHERE id=?", (x,))', ["f-string"]),
    ('db.execute("SELECT * FROM t WHERE id=?", (run_id,))', []),
    ('db.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE \'cuaderno_%\'")', []),
    ('raise UsageError(f"run {run_id!r} was not found")', []),
    ('msg = "select one of %s" % names', []),
], ids=["f-string", "percent", "format", "concat", "pragma", "columns", "bound", "like-literal", "prose", "lower"])
def test_the_static_check_can_fail(snippet: str, expected: list[str]) -> None:
    assert [how for _, how, _ in _string_built_sql(snippet)] == expected


# -- why a journal cannot be opened --------------------------------------------------------------------


def test_a_journal_locked_by_another_process_says_so(tmp_path: Path) -> None:
    """Before, a lock was reported as 'not a readable cuaderno journal: database is locked'."""
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as store:
        store.append([_ev("r", "run", "start", "run")])
    before = path.read_bytes()
    with closing(sqlite3.connect(path, isolation_level=None)) as other:
        other.execute("PRAGMA locking_mode=EXCLUSIVE")
        other.execute("BEGIN EXCLUSIVE")
        for readonly in (False, True):
            with pytest.raises(JournalError, match="is locked by another process \\(waited 0.05 s") as info:
                SqliteCheckpointer(path, busy_timeout_ms=50, readonly=readonly)
            assert not isinstance(info.value, JournalCorrupt)
        other.execute("ROLLBACK")
    assert path.read_bytes() == before


@pytest.mark.skipif(sys.platform != "linux" or (os.geteuid() == 0 and shutil.which("setpriv") is None),
                    reason="needs another user than root (setpriv) to meet a folder's permissions")
def test_a_journal_in_a_folder_this_process_cannot_write_says_so(tmp_path: Path) -> None:
    """SQLite creates the -wal and -shm files beside a WAL journal even to read it. Before, a
    folder without write access was reported as 'not a readable cuaderno journal'."""
    folder = Path(tempfile.mkdtemp(prefix="cuaderno-ro-"))  # not under tmp_path: that is private to root
    try:
        path = folder / "j.db"
        with SqliteCheckpointer(path) as store:
            store.append([_ev("r", "run", "start", "run")])
        folder.chmod(0o555)
        path.chmod(0o644)
        code = textwrap.dedent(f"""
            from cuaderno.errors import JournalCorrupt, JournalError
            from cuaderno.journal import SqliteCheckpointer
            for readonly in (False, True):
                try:
                    SqliteCheckpointer({str(path)!r}, readonly=readonly)
                except JournalCorrupt as exc:
                    print("corrupt", exc)
                except JournalError as exc:
                    print("error", exc)
        """)
        # Root writes any folder (CAP_DAC_OVERRIDE): the child runs without that one capability,
        # still as root, so it reaches the interpreter and this checkout wherever they are (a
        # child running as another user could not, under a folder of mode 0700), while the 0555
        # folder refuses it writes. It imports the cuaderno this test runs on, by absolute path.
        without_override = (["setpriv", "--bounding-set=-dac_override", "--inh-caps=-dac_override"]
                            if os.geteuid() == 0 else [])
        source = str(Path(cuaderno.__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, *filter(None, [os.environ.get("PYTHONPATH")])])}
        done = subprocess.run([*without_override, sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, check=False, cwd=folder, env=env)
        lines = done.stdout.splitlines()
        assert len(lines) == 2, done.stderr
        assert all(line.startswith("error ") and "its folder is not writable" in line for line in lines), lines
        assert sorted(p.name for p in folder.iterdir()) == ["j.db", "j.db-anchor"]  # the anchor: from the append
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)
