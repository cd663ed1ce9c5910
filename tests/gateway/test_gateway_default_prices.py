"""Default prices from the maintained ``genai-prices`` table, through the OpenAI gateway's real
request path (the official ``openai`` SDK over a mock ``httpx2`` transport).

Where the user gives no table: a model the table knows is priced, one it does not know stays
unpriced (``None``, never $0), a local endpoint is never priced as a hosted one, and an explicit
table always wins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cuaderno.gateway import pricing
from cuaderno.gateway.base import ModelRequest, Usage
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.gateway.pricing import MaintainedPrices, PriceTable

pytest.importorskip("genai_prices", reason="the [prices] extra (genai-prices) is not installed")

KEY = "run-1:step-1:abc"
OPENAI = "https://api.openai.com/v1"  # never reached: the mock transport answers
MakeGw = Callable[..., OpenAIGateway]

# OpenAI's published gpt-4o-mini prices, USD per million tokens (input, cached input, output).
GPT_4O_MINI = (0.15, 0.075, 0.60)


def completion(model: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 200_000,
                      "prompt_tokens_details": {"cached_tokens": 400_000}}}


def request(model: str) -> ModelRequest:
    return ModelRequest(instructions="be brief", messages=({"role": "user", "content": "hola"},), model=model)


EXPECTED = (600_000 * GPT_4O_MINI[0] + 400_000 * GPT_4O_MINI[1] + 200_000 * GPT_4O_MINI[2]) / 1e6


async def test_known_model_is_priced_from_the_maintained_table(fake: Any, make_openai: MakeGw) -> None:
    # The answer names a dated snapshot; the table knows it as gpt-4o-mini.
    fake.json(body=completion("gpt-4o-mini-2024-07-18"))
    resp = await make_openai(base_url=OPENAI).complete(request("gpt-4o-mini"), idempotency_key=KEY)
    assert resp.cost == pytest.approx(EXPECTED)


async def test_unknown_model_stays_unpriced_not_free(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion("gpt-nonexistent-9"))
    resp = await make_openai(base_url=OPENAI).complete(request("gpt-nonexistent-9"), idempotency_key=KEY)
    assert resp.cost is None
    assert resp.usage.input_tokens == 1_000_000  # it used tokens: unpriced, not $0


async def test_local_endpoint_is_not_priced_as_the_hosted_model(fake: Any, make_openai: MakeGw) -> None:
    # A llama.cpp/vLLM server whose model alias is a hosted model's name is not that model's bill.
    fake.json(body=completion("gpt-4o-mini"))
    resp = await make_openai(base_url="http://127.0.0.1:8080/v1").complete(request("gpt-4o-mini"),
                                                                         idempotency_key=KEY)
    assert resp.cost is None


async def test_an_explicit_table_wins(fake: Any, make_openai: MakeGw) -> None:
    fake.json(body=completion("gpt-4o-mini")).json(body=completion("gpt-4o-mini"))
    mine = PriceTable({"gpt-4o-mini": {"input": 1.0, "output": 1.0}})
    resp = await make_openai(base_url=OPENAI, prices=mine).complete(request("gpt-4o-mini"), idempotency_key=KEY)
    assert resp.cost == pytest.approx(1.2)
    off = await make_openai(base_url=OPENAI, prices=PriceTable()).complete(request("gpt-4o-mini"),
                                                                          idempotency_key=KEY)
    assert off.cost is None  # an empty table turns the defaults off


async def test_without_the_extra_calls_are_unpriced(fake: Any, make_openai: MakeGw,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pricing, "_HAVE_GENAI_PRICES", False)
    fake.json(body=completion("gpt-4o-mini"))
    resp = await make_openai(base_url=OPENAI).complete(request("gpt-4o-mini"), idempotency_key=KEY)
    assert resp.cost is None


def test_maintained_prices_infer_the_provider_from_the_model_without_an_endpoint() -> None:
    prices = MaintainedPrices()
    usage = Usage(input_tokens=1_000_000, output_tokens=200_000, cached_tokens=400_000)
    assert prices.cost(usage, None, "not-a-model", "gpt-4o-mini") == pytest.approx(EXPECTED)
    assert prices.cost(usage, "smollm2-135m-instruct") is None


async def test_a_failing_table_leaves_the_answer_unpriced_not_failed(fake: Any, make_openai: MakeGw,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import genai_prices

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a table this version cannot read")

    monkeypatch.setattr(genai_prices, "calc_price", broken)
    fake.json(body=completion("gpt-4o-mini"))
    resp = await make_openai(base_url=OPENAI).complete(request("gpt-4o-mini"), idempotency_key=KEY)
    assert resp.text == "hi" and resp.cost is None
