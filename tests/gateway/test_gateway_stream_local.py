"""``agent.stream`` and a streamed conversation against the real llama.cpp server (SmolLM2-135M):
several tokens arrive before the answer is journaled, and the journaled text is their sum."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cuaderno import Agent, Session, SqliteCheckpointer, Token
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.testing.llama_server import LlamaServer, LlamaServerError, local_model_available

pytestmark = pytest.mark.local_model


@pytest.fixture(scope="module")
def server() -> Iterator[LlamaServer]:
    missing = local_model_available()
    if missing is not None:
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"local_model tests cannot run under CI=true: {missing}", pytrace=False)
        pytest.skip(missing)
    srv = LlamaServer(n_threads=max(1, int(os.environ.get("CUADERNO_LLAMA_THREADS", "1") or 1)),
                      extra_args=["--seed", "1234"])
    try:
        srv.start()
    except LlamaServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield srv
    finally:
        srv.stop()
        # llama_cpp (imported by the availability check) opens os.devnull twice and never closes
        # it: close them, as tests/local_model/conftest.py does, or the exit prints ResourceWarnings.
        utils = sys.modules.get("llama_cpp._utils")
        for name in ("outnull_file", "errnull_file"):
            handle = getattr(utils, name, None)
            if handle is not None:
                handle.close()


async def test_tokens_stream_from_the_real_server_and_the_journal_holds_their_sum(server: LlamaServer,
                                                                                 tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    gw = OpenAIGateway(server.model_alias, base_url=server.base_url)
    try:
        agent = Agent(instructions="Answer in one short sentence.", model=server.model_alias, max_output_tokens=24,
                      temperature=0.0)
        tokens: list[Token] = []
        result = await agent.stream("What colour is the sky?", session=Session("local-s", gw, store),
                                    on_token=tokens.append)
        assert result.completed and result.text
        assert len(tokens) > 1, "the answer arrived in one piece: nothing was streamed"
        assert "".join(t.text for t in tokens) == result.text
        journaled = [e for e in store.load("local-s") if e.kind == "model" and e.phase == "result"]
        assert journaled[0].payload["response"]["text"] == result.text
        # llama-cpp-python 0.3 sends no usage in a stream (it ignores stream_options): the tokens
        # are not known, and the call is unpriced, never $0.
        assert result.usage.output_tokens == 0
        assert result.cost_usd == 0 and result.unpriced_calls == 1

        # A conversation streams its second message with the first exchange in its request.
        conv = agent.conversation(session=Session("local-c", gw, store))
        first = await conv.stream("Say hello.")
        shown: list[str] = []
        second = await conv.stream("Now say goodbye.", on_token=lambda t: shown.append(t.text))
        assert first.completed and second.completed and "".join(shown) == second.text
        again = agent.conversation(session=Session("local-c", gw, store))
        replayed: list[Any] = [(await again.send("Say hello.")).replayed, (await again.send("Now say goodbye.")).replayed]
        assert replayed == [True, True]
    finally:
        await gw.aclose()
        store.close()
