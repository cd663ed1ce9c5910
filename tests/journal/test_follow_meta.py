"""After another connection's commit, a SQLite store reads the journal's meta rows again before it
appends (``_follow_meta``): in one statement, and still refusing everything it refused when it read
them one by one. Each refusal is checked after a commit of another store that changed nothing (the
rows the store derived its answer from are then remembered), so that remembering them cannot hide a
change made later."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from cuaderno.errors import JournalCorrupt, KeyMissing, SchemaTooNew
from cuaderno.events import CODEC_JSON, StepEvent
from cuaderno.journal import SqliteCheckpointer
from cuaderno.journal._compress import CODEC_JSON_ZSTD
from cuaderno.journal.base import SCHEMA_VERSION

_PROSE = "the quick brown fox jumps over the lazy dog " * 40  # long enough to be compressed


def _ev(run_id: str, step: str, payload: dict[str, Any] | None = None) -> StepEvent:
    if payload is None:
        return StepEvent(run_id=run_id, step_id=step, phase="start", kind="run")
    return StepEvent(run_id=run_id, step_id=step, phase="result", kind="tool", name="work", fingerprint="fp",
                     payload=payload)


def _rows(path: Path) -> dict[str, str]:
    with closing(sqlite3.connect(path)) as db:
        return dict(db.execute("SELECT step_id, codec FROM cuaderno_events").fetchall())


def _meta_statements(store: SqliteCheckpointer, seen: list[str]) -> None:
    store._db.set_trace_callback(lambda sql: seen.append(sql) if "cuaderno_meta" in sql else None)


def test_another_commit_costs_one_meta_statement_and_none_without_one(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    seen: list[str] = []
    with SqliteCheckpointer(path) as mine, SqliteCheckpointer(path) as other:
        mine.append([_ev("a", "run")])
        _meta_statements(mine, seen)
        mine.append([_ev("a", "s1", {"value": 1})])
        assert seen == []  # nobody else committed: nothing is read again
        for n in range(3):
            other.append([_ev(f"b{n}", "run")])
            mine.append([_ev("a", f"s{n + 2}", {"value": n})])
        assert len(seen) == 3, seen  # one per commit of another store (it read three or four)


@pytest.mark.parametrize("change", ["schema", "encryption", "garbage", "off"])
def test_a_change_after_an_unchanged_commit_is_still_followed_or_refused(tmp_path: Path, change: str) -> None:
    path = tmp_path / "j.db"
    with SqliteCheckpointer(path) as mine, SqliteCheckpointer(path) as other:
        mine.append([_ev("a", "run")])
        other.append([_ev("b", "run")])  # another commit, the meta rows as they were
        mine.append([_ev("a", "before", {"value": _PROSE})])
        with closing(sqlite3.connect(path)) as db, db:  # what another store (or a newer cuaderno) records
            if change == "schema":
                db.execute("UPDATE cuaderno_meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
            elif change == "encryption":
                db.execute("INSERT INTO cuaderno_meta (key, value) VALUES ('encryption', 'aesgcm')")
            else:
                db.execute("INSERT OR REPLACE INTO cuaderno_meta (key, value) VALUES ('compress', ?)", (change,))
        refused = {"schema": SchemaTooNew, "encryption": KeyMissing, "garbage": JournalCorrupt}.get(change)
        if refused is None:
            mine.append([_ev("a", "after", {"value": _PROSE})])  # follows the setting: plain from now on
        else:
            with pytest.raises(refused):
                mine.append([_ev("a", "after", {"value": _PROSE})])
            with pytest.raises(refused):  # and again: a refusal is not remembered as an answer
                mine.append([_ev("a", "after", {"value": _PROSE})])
    codecs = _rows(path)
    assert codecs["before"] == CODEC_JSON_ZSTD
    assert codecs.get("after") == (CODEC_JSON if refused is None else None)
