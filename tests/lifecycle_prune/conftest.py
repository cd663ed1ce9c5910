"""The retention and backup tests' fixtures: a journal on either backend (PostgreSQL in a schema of
its own on the shared server, dropped at the end)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "crash"))  # _pg


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new journal's URL: a SQLite path, or a PostgreSQL URL naming a fresh schema."""
    from _pg import fresh_journal_url

    yield from fresh_journal_url(request.param, tmp_path)
