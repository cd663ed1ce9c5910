"""A PostgreSQL journal of version 1 (before rows had digest keys) migrates forward at the first
open for writing: its rows keep their first-version hashes and verify, new rows chain after them
over keyed digests, a read-only store refuses it until then, and its runs can be erased."""

from __future__ import annotations

import psycopg
import pytest
from _pg import PG_URL, new_schema, pg_schemas  # noqa: F401 - the fixture
from psycopg import sql

from cuaderno.errors import JournalError
from cuaderno.events import StepEvent
from cuaderno.journal import MemoryCheckpointer
from cuaderno.journal.postgres import PostgresCheckpointer
from cuaderno.operations import erase

pytestmark = pytest.mark.postgres

# Version 1's tables, as a cuaderno of that version created them (the first migration, verbatim).
_V1 = (
    """CREATE TABLE cuaderno_events (
        run_id TEXT NOT NULL, step_id TEXT NOT NULL, phase TEXT NOT NULL,
        seq BIGINT NOT NULL, kind TEXT NOT NULL, name TEXT, decision TEXT, fingerprint TEXT,
        codec TEXT NOT NULL, payload BYTEA NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        row_hash TEXT NOT NULL,
        PRIMARY KEY (run_id, step_id, phase)
    )""",
    """CREATE TABLE cuaderno_runs (
        run_id TEXT PRIMARY KEY, status TEXT NOT NULL, epoch BIGINT NOT NULL, owner TEXT,
        updated_at DOUBLE PRECISION NOT NULL, checkpoint TEXT NOT NULL
    )""",
    "CREATE INDEX cuaderno_runs_updated ON cuaderno_runs (updated_at)",
    "CREATE TABLE cuaderno_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "INSERT INTO cuaderno_meta (key, value) VALUES ('journal_id', md5(random()::text))",
    "CREATE TABLE cuaderno_migrations (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    "INSERT INTO cuaderno_migrations (version) VALUES (1)",
)


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
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for statement in _V1:
            conn.execute(statement)
        for e in events:
            conn.execute("INSERT INTO cuaderno_events VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                         (e.run_id, e.step_id, e.phase, e.seq, e.kind, e.name, e.decision, e.fingerprint, e.codec,
                          e.encoded_payload(), e.created_at, e.row_hash))
        conn.execute("INSERT INTO cuaderno_runs (run_id, status, epoch, owner, updated_at, checkpoint) VALUES "
                     "(%s, %s, 0, NULL, 1.0, %s)", ("old", cp.status, cp.dumps()))
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
        assert conn.execute("SELECT max(version) FROM cuaderno_migrations").fetchone() == (2,)
        blobs = conn.execute("SELECT payload FROM cuaderno_events WHERE run_id='old'").fetchall()
        summary = conn.execute("SELECT checkpoint FROM cuaderno_runs WHERE run_id='old'").fetchone()
    assert all(b"secret" not in bytes(b[0]) for b in blobs)
    assert summary is not None and "secret" not in summary[0]
