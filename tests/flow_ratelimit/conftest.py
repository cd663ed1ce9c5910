"""The rate-limit tests: PostgreSQL schemas from the crash tests' helper (``_pg``), and two stores
on one journal (``two_stores``: two processes' worth of connections, on SQLite and PostgreSQL)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "crash"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _pg import pg_schemas  # noqa: F401  (a fixture)

from cuaderno import SqliteCheckpointer


def _stores(tmp_path: Path, backend: str, schemas: list[str]) -> tuple[Any, Any]:
    if backend == "sqlite":
        path = tmp_path / "j.db"
        return SqliteCheckpointer(path), SqliteCheckpointer(path)
    from _pg import new_schema, schema_url

    from cuaderno.journal.postgres import PostgresCheckpointer

    schemas.append(new_schema())
    url = schema_url(schemas[-1])
    return PostgresCheckpointer.from_url(url), PostgresCheckpointer.from_url(url)


@pytest.fixture(params=["sqlite", "postgres"])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """Two stores on one journal (each its own limiter connection, as two processes have)."""
    schemas: list[str] = request.getfixturevalue("pg_schemas") if request.param == "postgres" else []
    a, b = _stores(tmp_path, request.param, schemas)
    yield a, b
    a.close()
    b.close()
