"""The fake rate-limited provider: its limits per key, its 429s and headers, its own log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from cuaderno.testing.rate_limited_provider import ProviderProcess, read_log, summary


async def _ask(client: openai.AsyncOpenAI, text: str = "hi", max_tokens: int | None = None) -> openai.types.chat.ChatCompletion:
    extra = {} if max_tokens is None else {"max_tokens": max_tokens}
    return await client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}], **extra)


def test_requests_over_the_minute_budget_get_429_with_openai_headers(tmp_path: Path) -> None:
    async def go(base_url: str) -> tuple[list[str], openai.RateLimitError, str]:
        a = openai.AsyncOpenAI(base_url=base_url, api_key="key-a", max_retries=0)
        b = openai.AsyncOpenAI(base_url=base_url, api_key="key-b", max_retries=0)
        answers = [(await _ask(a)).choices[0].message.content or "" for _ in range(3)]
        with pytest.raises(openai.RateLimitError) as refused:
            await _ask(a)
        other = (await _ask(b)).choices[0].message.content or ""  # another key, another budget
        await a.close()
        await b.close()
        return answers, refused.value, other

    with ProviderProcess(tmp_path / "log.jsonl", rpm=3) as provider:
        answers, refused, other = asyncio.run(go(provider.base_url))
    assert answers == ["done"] * 3 and other == "done"
    headers = refused.response.headers
    assert float(headers["retry-after-ms"]) > 10_000  # one request refills in 20 s at 3 a minute
    assert int(headers["retry-after"]) >= 1 and headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"].endswith("s") and headers["x-ratelimit-limit-requests"] == "3"
    log = read_log(tmp_path / "log.jsonl")
    assert [line["status"] for line in log] == [200, 200, 200, 429, 200]
    assert len({line["key"] for line in log}) == 2 and all("key-a" not in str(line) for line in log)
    assert summary(log)["429"] == 1


def test_tokens_are_charged_at_arrival_and_the_unused_output_given_back(tmp_path: Path) -> None:
    async def go(base_url: str) -> list[int]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        used = []
        for _ in range(3):
            answer = await _ask(client, "x" * 40, max_tokens=50)  # 18 prompt + 50 bound = 68 charged
            assert answer.usage is not None
            used.append(answer.usage.total_tokens)
        with pytest.raises(openai.RateLimitError):
            await _ask(client, "x" * 40, max_tokens=100)  # 118 > what is left of 120 + refills
        await client.close()
        return used

    with ProviderProcess(tmp_path / "log.jsonl", tpm=120, completion_tokens=5) as provider:
        used = asyncio.run(go(provider.base_url))
    assert used == [23, 23, 23]  # 68 charged, 45 given back each: three fit in a budget of 120
    log = read_log(tmp_path / "log.jsonl")
    assert [(line["status"], line["charged"]) for line in log] == [(200, 68), (200, 68), (200, 68), (429, 118)]
