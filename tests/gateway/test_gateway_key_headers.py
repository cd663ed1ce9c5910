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


def test_the_documented_headers_are_the_defaults() -> None:
    # What the README's provider table and each quickstart tell a user to look for in their logs
    # is what the gateways send by default; a changed default without its docs fails here.
    import inspect
    import re
    from pathlib import Path

    from cuaderno.gateway.anthropic import AnthropicGateway
    from cuaderno.gateway.openai import DEFAULT_KEY_HEADERS

    root = Path(__file__).resolve().parents[2]
    readme = root.joinpath("README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line.split("|")[2] for line in readme.splitlines()
            if line.startswith("| OpenAI, or") or line.startswith("| Anthropic (")}
    openai_row = next(v for k, v in rows.items() if k.startswith("OpenAI"))
    anthropic_row = next(v for k, v in rows.items() if k.startswith("Anthropic"))
    assert re.findall(r"`([^`]+)`", openai_row) == list(DEFAULT_KEY_HEADERS)
    anthropic_default = inspect.signature(AnthropicGateway.__init__).parameters["idempotency_header"].default
    assert re.findall(r"`([^`]+)`", anthropic_row) == [anthropic_default]
    quick = root / "docs" / "quickstart"
    for page, headers in (("openai.md", DEFAULT_KEY_HEADERS), ("anthropic.md", (anthropic_default,))):
        line = next(x for x in quick.joinpath(page).read_text(encoding="utf-8").splitlines() if "**Key header**" in x)
        assert re.findall(r"`([A-Za-z-]+-Key)`", line) == list(headers), (page, line)
