"""A refusal leaves every file as it was, also with a ``-wal`` that still holds commits (issue 19,
item 3).

SQLite folds the ``-wal`` into the database file when the last connection to it closes (and
deletes it). So before, a command refused on a journal with a stale or foreign ``-wal`` rewrote
the database file on its way out: the evidence was gone. The ``-wal`` files here are real ones, left
by processes killed with SIGKILL.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cuaderno import harness
from cuaderno.checkpoint import verified
from cuaderno.cli import app
from cuaderno.errors import JournalCorrupt, SchemaTooNew, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal import JournalRolledBack, SqliteCheckpointer

RUN = "r"


def _files(path: Path) -> dict[str, str]:
    """Hashes of the journal, its -wal and its -shm, those present (the anchor is not SQLite's)."""
    return {s: hashlib.sha256(Path(f"{path}{s}").read_bytes()).hexdigest()
            for s in ("", "-wal", "-shm") if Path(f"{path}{s}").exists()}


def _killed(code: str) -> None:
    """Run ``code`` in a fresh interpreter that SIGKILLs itself at its end (no connection closes,
    so nothing is folded into the database file)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code) + "\nimport os, signal\n"
                           "os.kill(os.getpid(), signal.SIGKILL)\n"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == -9, done.stderr


def _hot(path: Path, *, tamper: bool) -> None:
    """A journal of one run of three events, killed with its commits still in its -wal; with
    ``tamper``, row 2's payload then edited by another process, killed too (the edit is in the -wal)."""
    _killed(f"""
        from cuaderno.events import StepEvent
        from cuaderno.journal import SqliteCheckpointer
        store = SqliteCheckpointer({str(path)!r}, compress=False)
        store.append([StepEvent(run_id={RUN!r}, step_id="run", phase="start", kind="run", fingerprint="f",
                                payload={{"task": "t", "versions": {{}}}})])
        for phase in ("intent", "result"):
            store.append([StepEvent(run_id={RUN!r}, step_id="t0000.tool00", phase=phase, kind="tool", name="pay",
                                    payload={{"amount": 100, "outcome": "ok"}})])
    """)
    if tamper:
        _killed(f"""
            import sqlite3
            db = sqlite3.connect({str(path)!r}, isolation_level=None)
            db.execute("UPDATE cuaderno_events SET payload=replace(payload, '100', '999') WHERE seq=2")
        """)  # noqa: S608 - a test's own constant SQL, in a child's source
    assert Path(f"{path}-wal").stat().st_size > 0 and Path(f"{path}-shm").exists()


def test_a_refused_load_with_a_hot_wal_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    """The open checks pass (the edit is in the middle of the run); the load finds the row altered."""
    path = tmp_path / "j.db"
    _hot(path, tamper=True)
    before = _files(path)
    with SqliteCheckpointer(path) as store:
        with pytest.raises(JournalCorrupt, match="journal row 2 .* was altered"):
            verified(store, RUN)
        with pytest.raises(JournalCorrupt, match="journal row 2 .* was altered"):
            harness.rebuild_summary(store, RUN, trust_journal=True)
    assert _files(path) == before  # not folded, not even the -shm rebuilt: the evidence is kept


@pytest.mark.parametrize("command", [["show", RUN], ["rebuild-summary", RUN], ["approve", RUN, "x"]])
def test_a_command_refused_with_a_hot_wal_leaves_every_file_as_it_was(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "j.db"
    _hot(path, tamper=True)
    before = _files(path)
    done = CliRunner().invoke(app, ["--db", str(path), *command])
    assert done.exit_code == 4 and "was altered" in done.output, done.output
    assert _files(path) == before


def test_a_stale_wal_refused_at_open_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    """A -wal left from an earlier state of the same journal, put back beside the file after the
    run went on (a restore of some of the files): refused at open, with not one byte changed, -shm
    included."""
    path = tmp_path / "j.db"
    _hot(path, tamper=False)
    stale = {s: Path(f"{path}{s}").read_bytes() for s in ("-wal", "-shm")}
    with SqliteCheckpointer(path) as store:  # folds the -wal in, and the run goes on
        store.append([StepEvent(run_id=RUN, step_id="t0001.tool00", phase="intent", kind="tool", name="pay",
                                payload={"amount": 5})])
    assert not Path(f"{path}-wal").exists()
    for s, data in stale.items():
        Path(f"{path}{s}").write_bytes(data)
    before = _files(path)
    # The stale -wal's pages win over the file's: the journal reads as it was before the last event.
    with pytest.raises(JournalRolledBack, match="older than the last one this machine saw"):
        SqliteCheckpointer(path)
    assert _files(path) == before
    done = CliRunner().invoke(app, ["--db", str(path), "rebuild-summary", RUN])
    assert done.exit_code == 4 and "older than the last one" in done.output, done.output
    assert _files(path) == before


def test_a_journal_refused_at_open_with_a_hot_wal_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    """A refusal at open (a newer schema, recorded in the -wal by a process killed since)."""
    path = tmp_path / "j.db"
    _hot(path, tamper=False)
    _killed(f"""
        import sqlite3
        db = sqlite3.connect({str(path)!r}, isolation_level=None)
        db.execute("UPDATE cuaderno_meta SET value='99' WHERE key='schema_version'")
    """)  # noqa: S608 - a test's own constant SQL, in a child's source
    before = _files(path)
    with pytest.raises(SchemaTooNew):
        SqliteCheckpointer(path)
    assert _files(path) == before
    done = CliRunner().invoke(app, ["--db", str(path), "approve", RUN, "x"])
    assert done.exit_code == 4 and "99" in done.output, done.output
    assert _files(path) == before


def test_accept_rollback_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="accept_rollback must be True or False"):
        SqliteCheckpointer(tmp_path / "j.db", accept_rollback="yes")  # type: ignore[arg-type]
