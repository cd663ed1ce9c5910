"""The shared limit through the official ``openai`` SDK's HTTP path: ``OpenAIGateway`` against the
fake rate-limited provider on loopback, two workers (two stores, two gateways) on one journal.

The truth is the provider's own log: which requests arrived when, and which were refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from cuaderno import Agent, OpenAIGateway, RateLimit, RateLimitWaitTooLong, Session, SqliteCheckpointer
from cuaderno.testing.rate_limited_provider import ProviderProcess, read_log

AGENT = Agent(instructions="answer", name="answerer")
KEY = "sk-shared-key"


async def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _model_rows(store: SqliteCheckpointer, run_id: str) -> list[str]:
    return [ev.phase for ev in store.load(run_id) if ev.kind == "model"]


def test_a_429_seen_by_one_worker_holds_the_other_before_its_intent(tmp_path: Path) -> None:
    log = tmp_path / "provider.jsonl"
    journal = tmp_path / "j.db"

    async def go(base_url: str) -> dict[str, Any]:
        limit = RateLimit(requests_per_minute=60)
        a = OpenAIGateway("m", base_url=base_url, api_key=KEY, rate_limit=limit)
        b = OpenAIGateway("m", base_url=base_url, api_key=KEY, rate_limit=limit)
        store_a, store_b, reader = SqliteCheckpointer(journal), SqliteCheckpointer(journal), SqliteCheckpointer(journal)
        # Another client of the same key, outside cuaderno, spends the provider's budget.
        rogue = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0)
        for _ in range(2):
            await rogue.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        await rogue.close()
        first = asyncio.create_task(AGENT.run_to_end("q", session=Session("a1", a, store_a)))
        await _until(lambda: any(line["status"] == 429 for line in read_log(log)))
        refused_at = time.monotonic()
        second = asyncio.create_task(AGENT.run_to_end("q", session=Session("b1", b, store_b)))
        await asyncio.sleep(0.4)  # inside the pause the 429 asked for (about 1 s)
        waiting_rows = _model_rows(reader, "b1")
        results = await asyncio.gather(first, second)
        out = {"waiting_rows": waiting_rows, "outputs": [r.output for r in results],
               "b_waited": time.monotonic() - refused_at, "a1": _model_rows(reader, "a1"),
               "b1": _model_rows(reader, "b1")}
        for s in (store_a, store_b, reader):
            s.close()
        await a.aclose()
        await b.aclose()
        return out

    # 2 requests a window of 2 s: a budget of 2, one more each second.
    with ProviderProcess(log, rpm=2, window=2) as provider:
        out = asyncio.run(go(provider.base_url))
    lines = read_log(log)
    statuses = [line["status"] for line in lines]
    # The rogue's two, a1's refused first send, then a1's retry and b1, each accepted.
    assert statuses == [200, 200, 429, 200, 200], lines
    assert out["outputs"] == ["done", "done"]
    # While b1 waited for the pause, its run had no model row at all: no intent, no key used.
    assert out["waiting_rows"] == []
    assert out["b1"] == ["intent", "result"]  # one send, not counted as a re-send
    assert out["a1"] == ["intent", "result"]  # a 429 is retried under the same intent
    t429 = lines[2]["t"]
    later = [line["t"] - t429 for line in lines[3:]]
    assert min(later) >= 0.9  # nobody sent during the pause (Retry-After ≈ 1 s)
    assert abs(later[1] - later[0]) >= 0.95  # and after it, the turns are a second apart (60 a minute)


def test_a_wait_past_max_wait_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"

    async def go(base_url: str) -> list[Any]:
        gateway = OpenAIGateway("m", base_url=base_url, api_key=KEY,
                                rate_limit=RateLimit(requests_per_minute=6, max_wait=2))
        store = SqliteCheckpointer(journal)
        done = await AGENT.run_to_end("q", session=Session("r1", gateway, store))
        with pytest.raises(RateLimitWaitTooLong) as refused:
            await AGENT.run_to_end("q", session=Session("r2", gateway, store))
        rows = _model_rows(store, "r2")
        store.close()
        await gateway.aclose()
        return [done.output, refused.value, rows]

    with ProviderProcess(tmp_path / "provider.jsonl", rpm=600) as provider:
        output, refused, rows = asyncio.run(go(provider.base_url))
    assert output == "done"
    assert refused.wait == pytest.approx(10.0, abs=0.5) and refused.max_wait == 2
    assert rows == []  # nothing of the step was written
    assert len(read_log(tmp_path / "provider.jsonl")) == 1  # and nothing was sent


def test_a_cancelled_wait_writes_nothing(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"

    async def go(base_url: str) -> list[str]:
        gateway = OpenAIGateway("m", base_url=base_url, api_key=KEY, rate_limit=RateLimit(requests_per_minute=6))
        store = SqliteCheckpointer(journal)
        await AGENT.run_to_end("q", session=Session("r1", gateway, store))
        waiting = asyncio.create_task(AGENT.run_to_end("q", session=Session("r2", gateway, store)))
        await asyncio.sleep(0.5)  # r2 waits 10 s for its turn
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        rows = _model_rows(store, "r2")
        store.close()
        await gateway.aclose()
        return rows

    with ProviderProcess(tmp_path / "provider.jsonl", rpm=600) as provider:
        rows = asyncio.run(go(provider.base_url))
    assert rows == []
    assert len(read_log(tmp_path / "provider.jsonl")) == 1
