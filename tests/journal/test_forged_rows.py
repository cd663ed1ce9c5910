"""Rows past a run's summary are not taken on trust (issue 19, item 4).

The hash chain is not a signature: anyone who can write the file can append a row whose hash
chains. A summary that ends *before* the journal's last row is therefore no proof that the rows
after it are the run's own: it looks exactly like a forged row appended without touching the
summary. ``rebuild-summary`` without ``--trust-journal`` must refuse it, and nothing is written.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from _files import journal_files
from typer.testing import CliRunner

from cuaderno import harness
from cuaderno.checkpoint import verified
from cuaderno.cli import app
from cuaderno.errors import JournalCorrupt
from cuaderno.events import StepEvent
from cuaderno.journal import SqliteCheckpointer

RUN = "r-pay"
STEP = "t0000.tool00"


def _intent_without_result(path: Path) -> None:
    """A run whose transfer was journaled as an intent and never ran (no result)."""
    with SqliteCheckpointer(path) as store:
        store.append([StepEvent(run_id=RUN, step_id="run", phase="start", kind="run", fingerprint="f",
                                payload={"task": "t", "versions": {}})])
        store.append([StepEvent(run_id=RUN, step_id=STEP, phase="intent", kind="tool", name="transfer",
                                fingerprint="fp", payload={"arguments": {"amount": 100}, "effect_key": "k"})])


def _forge_result(path: Path, scratch: Path) -> None:
    """Append to ``path`` a result row whose hash chains, as anyone with write access can: made on a
    copy with the store's own code, then inserted alone (the summary is left as it was)."""
    shutil.copy(path, scratch)
    with SqliteCheckpointer(scratch) as store:
        store.append([StepEvent(run_id=RUN, step_id=STEP, phase="result", kind="tool", name="transfer",
                                payload={"outcome": "ok", "result": {"id": "forged"}})])
    with closing(sqlite3.connect(scratch)) as src:
        row = src.execute("SELECT * FROM cuaderno_events WHERE seq=3").fetchone()
    with closing(sqlite3.connect(path)) as db, db:
        db.execute("INSERT INTO cuaderno_events VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)", row)


def test_a_forged_result_is_not_accepted_by_rebuild_summary_without_trust(tmp_path: Path) -> None:
    """Before: the resume's refusal advised rebuild-summary, which then counted the forged
    result as the effect done (``tool_calls`` 1) although it never ran."""
    path = tmp_path / "j.db"
    _intent_without_result(path)
    _forge_result(path, tmp_path / "scratch.db")
    before = journal_files(path)
    with SqliteCheckpointer(path) as store:
        with pytest.raises(JournalCorrupt, match="ends at event 2, the journal holds 3.*nothing proves who wrote"):
            verified(store, RUN)
        with pytest.raises(JournalCorrupt, match="1 row past the end of its summary.*--trust-journal"):
            harness.rebuild_summary(store, RUN)
        cp = store.checkpoint(RUN)
        assert cp is not None and cp.count("tool_calls") == 0 and cp.last_seq == 2
    assert journal_files(path) == before
    refused = CliRunner().invoke(app, ["--db", str(path), "rebuild-summary", RUN])
    assert refused.exit_code == 4 and "--trust-journal" in refused.output, refused.output
    assert journal_files(path) == before
    # A person who knows the rows are the run's own says so; then, and only then, they count.
    trusted = CliRunner().invoke(app, ["--db", str(path), "rebuild-summary", RUN, "--trust-journal"])
    assert trusted.exit_code == 0, trusted.output
    with SqliteCheckpointer(path) as store:
        assert verified(store, RUN)[0].count("tool_calls") == 1
