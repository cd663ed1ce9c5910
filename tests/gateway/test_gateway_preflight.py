"""A new run on an unreachable endpoint, or without credentials, fails before any journal write."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cuaderno import Agent, ErrorClass, GatewayError, Session, SqliteCheckpointer, UsageError
from cuaderno.gateway.anthropic import AnthropicGateway
from cuaderno.gateway.openai import OpenAIGateway


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("make", [
    lambda url: OpenAIGateway(model="m", base_url=url, api_key="k"),
    lambda url: AnthropicGateway(model="m", base_url=url, api_key="k"),
], ids=["openai", "anthropic"])
async def test_unreachable_endpoint_fails_before_the_journal(make: object, tmp_path: Path) -> None:
    gateway = make(f"http://127.0.0.1:{_closed_port()}/v1")  # type: ignore[operator]
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        with pytest.raises(GatewayError) as info:
            async for _ in Agent(instructions="i").run("t", session=Session("r", gateway, store)):
                pass
        assert info.value.error_class is ErrorClass.TRANSIENT and info.value.sent is False
        assert "unreachable" in str(info.value)
        assert store.checkpoint("r") is None and store.list_runs() == []
    finally:
        store.close()


def test_missing_key_is_a_usage_error_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(UsageError):
        OpenAIGateway(model="gpt")
    with pytest.raises(UsageError):
        AnthropicGateway(model="claude")
