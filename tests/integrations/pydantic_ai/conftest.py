"""The loopback servers (the truth outside cuaderno) and the process runner the tests share.

Each test names its own scenario (its own logs on the servers, its own journal), so one pair of
servers and one forking runner serve a whole module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _pyd_runs import Runner
from _servers import Provider, Receipts


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Provider, Receipts]]:
    logs = tmp_path_factory.mktemp("truth")
    with Provider(logs) as provider, Receipts(logs) as receipts:
        yield provider, receipts


@pytest.fixture(scope="module")
def runner() -> Iterator[Runner]:
    r = Runner()
    yield r
    r.close()
