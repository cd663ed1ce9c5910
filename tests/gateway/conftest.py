"""Fixtures driving the real SDKs through ``httpx2.MockTransport``.

Both ``openai`` 3.57 and ``anthropic`` 2.16 are built on ``httpx2`` (respx only patches the old
``httpx``), so the fake provider is an ``httpx2.MockTransport`` handler that records every request
and answers from a queue. Nothing leaves the process.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2
import pytest

from cuaderno.gateway.anthropic import AnthropicGateway
from cuaderno.gateway.openai import OpenAIGateway

Answer = httpx2.Response | BaseException | Callable[[httpx2.Request], httpx2.Response]


class FakeProvider:
    """A scripted HTTP endpoint: queue answers, then read back the requests it received."""

    def __init__(self) -> None:
        self.requests: list[httpx2.Request] = []
        self._answers: deque[Answer] = deque()

    def queue(self, *answers: Answer) -> FakeProvider:
        self._answers.extend(answers)
        return self

    def json(self, status: int = 200, body: Any = None, headers: dict[str, str] | None = None) -> FakeProvider:
        return self.queue(httpx2.Response(status, json=body, headers=headers))

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if not self._answers:
            raise AssertionError(f"unexpected extra request #{len(self.requests)}: {request.method} {request.url}")
        answer = self._answers.popleft()
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return answer(request)
        return answer

    def body(self, index: int = -1) -> dict[str, Any]:
        data = json.loads(self.requests[index].content)
        assert isinstance(data, dict)
        return data

    def client(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler))


@pytest.fixture
def fake() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
def other_fake() -> FakeProvider:
    """A second, independent endpoint (e.g. the strong tier)."""
    return FakeProvider()


@pytest.fixture
async def make_openai(fake: FakeProvider) -> AsyncIterator[Callable[..., OpenAIGateway]]:
    made: list[OpenAIGateway] = []

    def make(**kwargs: Any) -> OpenAIGateway:
        kwargs.setdefault("base_url", "http://127.0.0.1:9/v1")
        kwargs.setdefault("api_key", "sk-test")
        kwargs.setdefault("http_client", fake.client())
        gw = OpenAIGateway(kwargs.pop("model", "gpt-test"), **kwargs)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        await gw.aclose()


@pytest.fixture
async def make_anthropic(fake: FakeProvider) -> AsyncIterator[Callable[..., AnthropicGateway]]:
    made: list[AnthropicGateway] = []

    def make(**kwargs: Any) -> AnthropicGateway:
        kwargs.setdefault("base_url", "http://127.0.0.1:9")
        kwargs.setdefault("api_key", "sk-ant-test")
        kwargs.setdefault("http_client", fake.client())
        gw = AnthropicGateway(kwargs.pop("model", "claude-test"), **kwargs)
        made.append(gw)
        return gw

    yield make
    for gw in made:
        await gw.aclose()


LazyBody = Callable[..., tuple[Callable[[], int], Callable[[], AsyncIterator[bytes]]]]


def _lazy_body(total: int, chunk: int = 64 * 1024) -> tuple[Callable[[], int], Callable[[], AsyncIterator[bytes]]]:
    """A streamed body of ``total`` bytes generated on demand, and a counter of bytes pulled so far."""
    pulled = 0

    async def gen() -> AsyncIterator[bytes]:
        nonlocal pulled
        sent = 0
        while sent < total:
            piece = min(chunk, total - sent)
            pulled += piece
            sent += piece
            yield b" " * piece

    def count() -> int:
        return pulled

    return count, gen


@pytest.fixture
def lazy_body() -> LazyBody:
    return _lazy_body


@pytest.fixture
def unused_port() -> int:
    """A loopback port nobody listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    """A loopback HTTP server that reads the request and never answers: a read timeout after send."""
    tasks: list[asyncio.Task[None]] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(3600)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    server.close()
    await server.wait_closed()
