"""The offload tests' fixtures: a journal on either backend (PostgreSQL in a schema of its own on the
shared server, dropped at the end)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "crash"))  # _pg
sys.path.insert(0, str(HERE.parent / "lifecycle_prune"))  # prune_journals


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new journal's URL: a SQLite path, or a PostgreSQL URL naming a fresh schema."""
    if request.param == "sqlite":
        yield str(tmp_path / "runs.db")
        return
    from _pg import drop_schemas, new_schema, schema_url, server_or_skip

    server_or_skip()
    schema = new_schema()
    try:
        yield schema_url(schema)
    finally:
        drop_schemas([schema])
