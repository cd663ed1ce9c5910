"""open_journal: every URL form opens the journal it names, and every bad URL is one clear UsageError."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cuaderno
from cuaderno.errors import JournalError, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import MemoryCheckpointer, SqliteCheckpointer, open_journal
from cuaderno.journal._open import parse_journal_url
from cuaderno.journal.base import Checkpointer


def _start(run_id: str) -> StepEvent:
    return StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", payload={"task": "t"})


def _runs_in(path: Path) -> list[str]:
    with SqliteCheckpointer(path, create=False) as store:
        return [cp.run_id for cp in store.list_runs()]


def _write_through(store: Checkpointer, run_id: str) -> None:
    try:
        store.append([_start(run_id)])
    finally:
        store.close()


def test_a_bare_path_is_a_sqlite_file_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_journal("runs.db")
    assert isinstance(store, SqliteCheckpointer)
    _write_through(store, "bare")
    _write_through(open_journal(tmp_path / "other.db"), "pathlike")  # an os.PathLike too
    assert _runs_in(tmp_path / "runs.db") == ["bare"]
    assert _runs_in(tmp_path / "other.db") == ["pathlike"]


def test_sqlite_url_with_three_slashes_is_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    _write_through(open_journal("sqlite:///sub/runs.db"), "relative")
    assert _runs_in(tmp_path / "sub" / "runs.db") == ["relative"]


def test_sqlite_url_with_four_slashes_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    target = tmp_path / "abs dir" / "runs.db"
    target.parent.mkdir()
    assert str(target).startswith("/")
    _write_through(open_journal(f"sqlite:///{target}"), "absolute")  # "sqlite:///" + "/tmp/..."
    assert _runs_in(target) == ["absolute"]
    assert list(elsewhere.iterdir()) == []
    # Percent-escapes are decoded, as in every URL: %20 is the space in the folder's name.
    _write_through(open_journal(f"sqlite:///{str(target).replace(' ', '%20')}"), "escaped")
    assert sorted(_runs_in(target)) == ["absolute", "escaped"]


def test_sqlite_url_parameters_reach_the_store(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    _write_through(open_journal(f"sqlite:///{path}?compress=off&synchronous=NORMAL"), "r")
    readonly = open_journal(f"sqlite:///{path}?mode=ro")
    try:
        assert [cp.run_id for cp in readonly.list_runs()] == ["r"]
        before = path.read_bytes()
        with pytest.raises(UsageError, match="read-only"):
            readonly.append([_start("other")])
        assert path.read_bytes() == before
    finally:
        readonly.close()
    with pytest.raises(JournalError, match="does not exist"):
        open_journal(f"sqlite:///{tmp_path / 'missing.db'}?mode=rw")
    assert not (tmp_path / "missing.db").exists()


def test_sqlite_url_in_memory(tmp_path: Path) -> None:
    store = open_journal("sqlite:///:memory:")
    try:
        assert isinstance(store, SqliteCheckpointer) and store.path == ":memory:"
        store.append([_start("m")])
        assert [cp.run_id for cp in store.list_runs()] == ["m"]
    finally:
        store.close()


def test_memory_url_is_a_new_empty_memory_journal() -> None:
    a, b = open_journal("memory://"), open_journal("memory://")
    assert isinstance(a, MemoryCheckpointer) and isinstance(b, MemoryCheckpointer) and a is not b
    a.append([_start("m")])
    assert [cp.run_id for cp in a.list_runs()] == ["m"] and b.list_runs() == []
    with pytest.raises(JournalError, match="no existing journal"):
        open_journal("memory://", create=False)
    with pytest.raises(JournalError, match="no existing journal"):
        open_journal("memory://", readonly=True)  # not a writable journal that was asked to be read-only


def test_create_false_and_readonly_keyword_arguments(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with pytest.raises(JournalError, match="does not exist"):
        open_journal(f"sqlite:///{path}", create=False)
    assert not path.exists()
    _write_through(open_journal(path), "r")
    store = open_journal(f"sqlite:///{path}", create=False, readonly=True)
    try:
        with pytest.raises(UsageError, match="read-only"):
            store.append([_start("x")])
    finally:
        store.close()


@pytest.mark.parametrize("url", ["postgresql://cuaderno@127.0.0.1:1/test", "postgres://127.0.0.1:1/test"])
def test_postgres_url_with_no_server_is_one_journal_error(url: str) -> None:
    with pytest.raises(JournalError, match="cannot open it.*nothing was changed"):
        open_journal(url)


def test_a_password_never_reaches_the_message() -> None:
    with pytest.raises(JournalError) as caught:
        open_journal("postgresql://ana:s3cret@127.0.0.1:1/test")
    assert "s3cret" not in str(caught.value) and "ana:***@127.0.0.1" in str(caught.value)
    with pytest.raises(UsageError) as caught:
        open_journal("mysql://ana:s3cret@127.0.0.1/test")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize(("url", "message"), [
    ("", "empty"),
    ("   ", "empty"),
    ("mysql://127.0.0.1/runs", "unknown scheme 'mysql://'"),
    ("file:///tmp/runs.db", "unknown scheme 'file://'"),
    ("sqlite://", "names no file"),
    ("sqlite:///", "names no file"),
    ("sqlite:///?mode=ro", "names no file"),
    ("sqlite://host/runs.db", "has no host"),
    ("sqlite:///runs.db?timeout=5", "unknown parameter 'timeout'"),
    ("sqlite:///runs.db?synchronus=FULL", "unknown parameter 'synchronus'"),
    ("sqlite:///runs.db?synchronous=OFF", "synchronous='OFF' is not one of FULL, NORMAL"),
    ("sqlite:///runs.db?mode=memory", "mode='memory' is not one of ro, rw, rwc"),
    ("sqlite:///runs.db?mode=ro&mode=rw", "given twice"),
    ("sqlite:///runs.db?mode", "not name=value pairs"),
    ("sqlite:///runs.db#frag", "no fragment"),
    ("sqlite:runs.db", "without '//'"),
    ("memory://somewhere", "takes no path"),
    ("memory://?x=1", "takes no path"),
], ids=lambda v: v if v.strip() else "blank")
def test_bad_urls_are_one_usage_error_and_create_nothing(url: str, message: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=message) as caught:
        open_journal(url)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_not_a_string() -> None:
    with pytest.raises(UsageError, match="URL or a path"):
        open_journal(42)  # type: ignore[arg-type]


def test_parse_keeps_what_each_form_names() -> None:
    assert parse_journal_url("runs.db")[:3] == ("sqlite", "runs.db", {})
    assert parse_journal_url("C:runs.db")[:2] == ("sqlite", "C:runs.db")  # a drive letter is not a scheme
    assert parse_journal_url(":memory:")[:2] == ("sqlite", ":memory:")
    assert parse_journal_url("SQLite:///a.db?mode=rw")[:3] == ("sqlite", "a.db", {"mode": "rw"})
    assert parse_journal_url("postgres://h/db").scheme == "postgresql"
    assert parse_journal_url(os.fsencode("x.db").decode()).path == "x.db"


def test_open_journal_is_public() -> None:
    assert cuaderno.open_journal is open_journal
    assert "open_journal" in cuaderno.__all__


RACE_OPEN = """
import os, sys, time
from cuaderno import open_journal
path, n = sys.argv[1], int(sys.argv[2])
go_r, go_w = os.pipe()
pids = []
for i in range(n):
    pid = os.fork()
    if pid == 0:
        os.read(go_r, 1)  # all released at once
        try:
            open_journal(path).close()
            verdict = "ok"
        except BaseException as exc:
            verdict = f"{type(exc).__name__}: {exc}"
        with open(f"{path}.verdict.{i}", "w") as f:
            f.write(verdict)
        os._exit(0)
    pids.append(pid)
time.sleep(0.2)
os.write(go_w, b"g" * n)
for pid in pids:
    os.waitpid(pid, 0)
"""


def test_processes_opening_a_new_journal_at_once_all_open_it(tmp_path: Path) -> None:
    # Workers started together on a journal nobody created yet: before the fix, about 1 open in
    # 40 failed (SQLITE_CANTOPEN on the -wal another process had just made, or SQLITE_BUSY on
    # its switch to WAL), and a worker died at start.
    import subprocess
    import sys

    (tmp_path / "race.py").write_text(RACE_OPEN)
    for rep in range(20):
        db = tmp_path / f"runs{rep}.db"
        subprocess.run([sys.executable, str(tmp_path / "race.py"), str(db), "10"], check=True, timeout=120)
        verdicts = [(tmp_path / f"runs{rep}.db.verdict.{i}").read_text() for i in range(10)]
        assert verdicts == ["ok"] * 10, verdicts
    with SqliteCheckpointer(tmp_path / "runs0.db", create=False) as store:
        assert store.list_runs() == []
