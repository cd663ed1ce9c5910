"""Fixtures of the web page's tests: a journal with runs in every state, and the app over it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import starlette  # noqa: F401
except ImportError:  # the ui extra is not installed: skipped locally, a failure under CI
    if os.environ.get("CI", "").lower() == "true":
        raise
    collect_ignore_glob = ["test_*.py"]
else:
    from starlette.testclient import TestClient

    from cuaderno.ui.app import create_app

from _runs import HOSTILE_RUN, hostile_run, run_agent, uncertain_run, unpriced_run

from cuaderno import SqliteCheckpointer


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """pay-1 and pay-2 waiting for an approval, a hostile run (and one with a hostile id), an
    uncertain effect and an unpriced run."""
    path = tmp_path / "runs.db"
    assert run_agent(path, "pay-1") == "suspended"
    assert run_agent(path, "pay-2", 250) == "suspended"
    with SqliteCheckpointer(path) as store:
        hostile_run(store)
        hostile_run(store, HOSTILE_RUN)
        uncertain_run(store)
        unpriced_run(store)
    return path


BROWSER = {"origin": "http://testserver"}
"""What a browser sends with every form of the page: its origin (the app refuses a POST without one)."""


@pytest.fixture
def client(db: Path) -> Iterator[TestClient]:
    with TestClient(create_app(db, allow_decisions=True, allowed_hosts=["testserver"]), headers=BROWSER) as c:
        yield c


@pytest.fixture
def ro_client(db: Path) -> Iterator[TestClient]:
    with TestClient(create_app(db, allowed_hosts=["testserver"])) as c:
        yield c
