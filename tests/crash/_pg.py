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
