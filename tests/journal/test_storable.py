"""One check of what an id can be, for both SQL backends.

An id that no append can store (a NUL, a lone surrogate, not text) is "not found" by every read,
takeover and rebuild of both backends, before it reaches the database, and an append of one is a
:class:`~cuaderno.errors.UsageError`; the journal is left as it was. Before the check was one
function, SQLite sent a NUL id to the database and a lone surrogate in a status or step id made
its driver fail (a read that reported damage), while PostgreSQL answered "not found".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _pg import PG_URL, new_schema, pg_schemas  # noqa: F401 - the fixture

from cuaderno.errors import RunNotFound, UsageError
from cuaderno.events import StepEvent
from cuaderno.journal._rows import storable
from cuaderno.journal._sql import SqlJournal

BAD_IDS = ["a\x00b", "\ud800x"]


@pytest.mark.parametrize(("value", "ok"), [
    ("r", True), ("ünï ✓", True), ("", True),  # "" is validate_event's to refuse, with its reason
    ("a\x00b", False), ("\x00", False), ("\ud800x", False), (5, False), (None, False), (b"r", False),
])
def test_storable(value: object, ok: bool) -> None:
    assert storable(value) is ok


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlJournal]:
    s: SqlJournal
    if request.param == "sqlite":
        from cuaderno.journal.sqlite import SqliteCheckpointer

        s = SqliteCheckpointer(tmp_path / "j.db")
    else:
        from cuaderno.journal.postgres import PostgresCheckpointer

        schemas = request.getfixturevalue("pg_schemas")
        schemas.append(new_schema())
        s = PostgresCheckpointer(PG_URL, schema=schemas[-1], pool_size=2)
    with s:
        s.append([StepEvent(run_id="r", step_id="run", phase="start", kind="run")])
        yield s


@pytest.mark.parametrize("bad", BAD_IDS, ids=["nul", "surrogate"])
def test_an_id_no_append_can_store_is_not_found_by_either_backend(store: SqlJournal, bad: str) -> None:
    s: object = store
    before = store.load("r")
    with pytest.raises(RunNotFound):
        store.load(bad)
    assert store.checkpoint(bad) is None
    with pytest.raises(RunNotFound):
        store.load_tail(bad, "run")
    with pytest.raises(RunNotFound):
        store.load_tail("r", bad)  # a step id is checked too
    assert store.list_runs(status=bad) == []
    with pytest.raises(RunNotFound):
        s.rebuild_checkpoint(bad)  # type: ignore[attr-defined]
    with pytest.raises(RunNotFound):
        s.acquire(bad, "me")  # type: ignore[attr-defined]
    assert store.release(bad, 1) is None  # type: ignore[func-returns-value]
    assert s.holders([bad]) == {}  # type: ignore[attr-defined]
    with pytest.raises(UsageError):
        store.append([StepEvent(run_id=bad, step_id="run", phase="start", kind="run")])
    assert store.load("r") == before
    assert [cp.run_id for cp in store.list_runs()] == ["r"]
