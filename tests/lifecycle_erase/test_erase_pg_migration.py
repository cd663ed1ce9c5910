"""A PostgreSQL journal of version 1 (before rows had digest keys) migrates forward at the first
open for writing: its rows keep their first-version hashes and verify, new rows chain after them
over keyed digests, a read-only store refuses it until then, and its runs can be erased."""

from __future__ import annotations

import psycopg
import pytest
from _pg import PG_URL, new_schema, pg_schemas, version_1_journal  # noqa: F401 - the fixture
from psycopg import sql

from cuaderno.errors import JournalError
from cuaderno.events import StepEvent
from cuaderno.journal import MemoryCheckpointer
from cuaderno.journal.postgres import SCHEMA_VERSION, PostgresCheckpointer
from cuaderno.operations import erase

pytestmark = pytest.mark.postgres

def _version_1_journal(schema: str) -> list[StepEvent]:
    """A version-1 journal holding one ended run, its rows hashed as version 1 wrote them (the
    in-memory store still writes that version)."""
    mem = MemoryCheckpointer()
    mem.append([StepEvent(run_id="old", step_id="run", phase="start", kind="run", fingerprint="f-task",
                          payload={"task": "an old secret task", "versions": {}})])
    mem.append([StepEvent(run_id="old", step_id="final", phase="result", kind="final",
                          payload={"output": "an old secret answer"})])
    events = mem.load("old")
    cp = mem.checkpoint("old")
    assert cp is not None and cp.status == "completed" and all(e.salt is None for e in events)
    version_1_journal(schema, mem)
    return events


def test_version_1_migrates_forward_and_its_runs_verify_and_erase(pg_schemas: list[str]) -> None:  # noqa: F811
    schema = new_schema()
    pg_schemas.append(schema)
    old = _version_1_journal(schema)
    with pytest.raises(JournalError, match="Open it once for writing"):
        PostgresCheckpointer(PG_URL, schema=schema, readonly=True)
    with PostgresCheckpointer(PG_URL, schema=schema) as store:
        assert [e.row_hash for e in store.load("old")] == [e.row_hash for e in old]
        store.append([StepEvent(run_id="new", step_id="run", phase="start", kind="run", payload={"task": "t"})])
        assert store.load("new")[0].salt is not None  # new rows are keyed
        done = erase(store, "old", reason="migrated")
        assert done.rows == 2
        after = store.load("old")
        assert [e.row_hash for e in after] == [e.row_hash for e in old] and all(e.erased for e in after)
    with psycopg.connect(PG_URL) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        # Version 2 added the queue's tables, version 3 the rows' digest keys, version 4 the wrapped
        # data keys of encryption at rest, version 5 the blob tables: a writable open takes every step.
        assert conn.execute("SELECT max(version) FROM cuaderno_migrations").fetchone() == (SCHEMA_VERSION,)
        blobs = conn.execute("SELECT payload FROM cuaderno_events WHERE run_id='old'").fetchall()
        summary = conn.execute("SELECT checkpoint FROM cuaderno_runs WHERE run_id='old'").fetchone()
    assert all(b"secret" not in bytes(b[0]) for b in blobs)
    assert summary is not None and "secret" not in summary[0]
