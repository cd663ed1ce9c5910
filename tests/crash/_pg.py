"""The machine's PostgreSQL for the tests marked ``postgres``: a fresh schema per journal.

Tests run in parallel (xdist), so each journal lives in a schema of its own with a random name,
dropped when the test ends; run locks are keyed on the journal's own id, so journals in one
database never share one. Under ``CI=true`` an unreachable server fails these tests (the CI
starts it); elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

PG_URL = os.environ.get("CUADERNO_TEST_PG", "postgresql://127.0.0.1:5432/test")


def server_or_skip() -> None:
    import psycopg

    try:
        psycopg.connect(PG_URL, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PostgreSQL at {PG_URL} is unreachable under CI: {exc}")
        pytest.skip(f"PostgreSQL at {PG_URL} is unreachable: {exc}")


def new_schema() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


def schema_url(schema: str) -> str:
    return f"{PG_URL}?schema={schema}"


def drop_schemas(names: list[str]) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def pg_schemas() -> Iterator[list[str]]:
    """A list a test appends the schemas it creates to; they are dropped when it ends."""
    server_or_skip()
    names: list[str] = []
    yield names
    drop_schemas(names)


# Version 1's tables, as a cuaderno of that version created them (the first migration, verbatim).
V1_TABLES = (

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


def fresh_journal_url(backend: str, folder: Any) -> Iterator[str]:
    """A new journal's URL for a fixture to yield from: a SQLite file in ``folder``, or a PostgreSQL
    URL naming a fresh schema on the shared server (skipped without one), dropped after."""
    if backend == "sqlite":
        yield str(folder / "runs.db")
        return
    server_or_skip()
    schema = new_schema()
    try:
        yield schema_url(schema)
    finally:
        drop_schemas([schema])


def version_1_journal(schema: str, source: Any) -> None:
    """Create ``schema`` as version 1 of the journal's tables (before the queue's tables and the
    rows' digest keys), holding every run of ``source`` (a ``MemoryCheckpointer``, whose rows are
    hashed as version 1 wrote them), so that opening it migrates a real old journal forward."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        for statement in V1_TABLES:
            conn.execute(statement)
        for cp in source.list_runs(limit=10_000):
            for e in source.load(cp.run_id):
                conn.execute("INSERT INTO cuaderno_events VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                             (e.run_id, e.step_id, e.phase, e.seq, e.kind, e.name, e.decision, e.fingerprint,
                              e.codec, e.encoded_payload(), e.created_at, e.row_hash))
            conn.execute("INSERT INTO cuaderno_runs (run_id, status, epoch, owner, updated_at, checkpoint) VALUES "
                         "(%s, %s, 0, NULL, 1.0, %s)", (cp.run_id, cp.status, cp.dumps()))
