"""Issue 35, part 4: a model's answer over the journal's per-payload limit becomes a journaled failure
(``error.N``, ``ResponseTooLarge`` naming the step and the size) the run reports, not an append
refused in the middle of a step. Driven through the real OpenAI SDK (httpx2 MockTransport: a fake
provider that counts the requests it answers, independently of the journal)."""

from __future__ import annotations

import asyncio
import pickle
import socket
from typing import Any

import httpx2
import pytest

from cuaderno import Agent, ResponseTooLarge, Session, open_journal
from cuaderno.errors import ErrorClass, GatewayError
from cuaderno.gateway.openai import OpenAIGateway


def _completion(text: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-test",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}


class _Provider:
    """Answers every request with ``text``; ``answered`` counts them (the provider's own record)."""

    def __init__(self, text: str) -> None:
        self.text, self.answered = text, 0

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        self.answered += 1
        return httpx2.Response(200, json=_completion(self.text))


async def _run(store: Any, provider: _Provider) -> Any:
    # A loopback port that accepts connections: the loop's preflight (one TCP connect before a new
    # run) passes; every request goes to the mock transport.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        return await _run_at(url, store, provider)


async def _run_at(url: str, store: Any, provider: _Provider) -> Any:
    gateway = OpenAIGateway("gpt-test", base_url=url, api_key="sk-test",
                            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(provider.handler)))
    try:
        return await Agent(instructions="answer", name="talker").run_to_end(
            "say a lot", session=Session("big-answer", gateway, store))
    finally:
        await gateway.aclose()


def test_an_answer_over_the_limit_is_a_journaled_failure_naming_step_and_size(journal_url: str) -> None:
    provider = _Provider("w" * 200_000)
    store = open_journal(journal_url)
    store.max_payload = 100_000
    try:
        with pytest.raises(ResponseTooLarge) as caught:
            asyncio.run(_run(store, provider))
        err = caught.value
        assert isinstance(err, GatewayError) and err.error_class is ErrorClass.PERMANENT and err.sent is True
        assert (err.run_id, err.step_id, err.limit) == ("big-answer", "t0000.model", 100_000)
        assert 200_000 < err.size < 201_000 and "t0000.model" in str(err) and "200," in str(err)
        assert provider.answered == 1  # sent once, answered once: not retried
        events = store.load("big-answer")  # the journal verifies, and holds the failure
        failed = [e for e in events if e.step_id == "t0000.model" and e.phase == "error.1"]
        assert len(failed) == 1
        record = failed[0].payload["error"]
        assert (record["type"], record["size"], record["limit"]) == ("ResponseTooLarge", err.size, 100_000)
        assert not [e for e in events if e.step_id == "t0000.model" and e.phase == "result"]
        assert max(len(e.encoded_payload()) for e in events) < 100_000
        assert store.checkpoint("big-answer").status == "running"  # type: ignore[union-attr]
        # Under a raised limit, a resume sends again and the answer is journaled (offloaded).
        store.max_payload = 1_000_000
        store.offload_above = 50_000
        result = asyncio.run(_run(store, provider))
        assert result.status == "completed" and provider.answered == 2
        assert result.output == "w" * 200_000
    finally:
        store.close()


def test_the_error_round_trips() -> None:
    err = ResponseTooLarge("r", "t0001.model", 123_456, 1000)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is ResponseTooLarge and str(again) == str(err) and again.size == 123_456
    assert again.to_json()["size"] == 123_456 and again.to_json()["type"] == "ResponseTooLarge"
