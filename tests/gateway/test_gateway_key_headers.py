"""Which header(s) carry the idempotency key on the OpenAI gateway's real request path.

The default sends it twice, as ``Idempotency-Key`` and as ``X-Idempotency-Key``: proxies that
forward only ``x-`` headers to the backend (LiteLLM) pass the second on. The end-to-end proof
through a real LiteLLM proxy is ``tests/local_model/test_litellm_proxy.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cuaderno.errors import UsageError
from cuaderno.gateway.base import ModelRequest
from cuaderno.gateway.openai import OpenAIGateway

KEY = "run-1:t0000.model:abc"
REQ = ModelRequest(instructions="be brief", messages=({"role": "user", "content": "hola"},))
MakeGw = Callable[..., OpenAIGateway]
ANSWER = {"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-test",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}


async def test_the_default_sends_the_key_in_both_headers(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=ANSWER)
    await make_openai().complete(REQ, idempotency_key=KEY)
    headers = fake.requests[0].headers
    assert (headers.get("Idempotency-Key"), headers.get("X-Idempotency-Key")) == (KEY, KEY)


async def test_configured_headers_replace_the_default(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=ANSWER).json(body=ANSWER)
    await make_openai(idempotency_header=("x-a-key", "x-b-key")).complete(REQ, idempotency_key=KEY)
    await make_openai(idempotency_header="").complete(REQ, idempotency_key=KEY)  # "" sends none, as before
    first, second = fake.requests[0].headers, fake.requests[1].headers
    assert (first.get("x-a-key"), first.get("x-b-key")) == (KEY, KEY)
    assert "Idempotency-Key" not in first and "X-Idempotency-Key" not in first
    assert KEY not in second.values()


@pytest.mark.parametrize("bad", ["bad header", "x-key\r\nx-evil", "x-key\n", ("x-k", "X-K"), (7,)])
def test_a_bad_header_name_is_refused_at_construction(make_openai: MakeGw, bad: Any) -> None:
    with pytest.raises(UsageError, match="idempotency_header"):
        make_openai(idempotency_header=bad)
