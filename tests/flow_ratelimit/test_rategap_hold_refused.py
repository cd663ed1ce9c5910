"""A request held between its intent and its send for longer than ``max_wait`` is refused
(:class:`RateLimitWaitTooLong`) without being sent, and the journal says so: an ``error.N`` that
takes back the send its intent counted, so the resume's send is not counted as possibly billed
twice. Through the official ``openai`` SDK against the fake rate-limited provider."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rategap_workers import AGENT, bucket, gateway

from cuaderno import RateLimit, RateLimitWaitTooLong, Session, SqliteCheckpointer, faults
from cuaderno.flow.ratelimit import SharedLimits
from cuaderno.testing.rate_limited_provider import ProviderProcess, read_log


def test_a_hold_after_the_intent_past_max_wait_is_journaled_as_not_sent(tmp_path: Path) -> None:
    log = tmp_path / "provider.jsonl"
    limit = RateLimit(requests_per_minute=600, max_wait=0.5)

    async def go(base_url: str) -> tuple[list[str], list[dict[str, object]], dict[str, int], str | None]:
        with SqliteCheckpointer(tmp_path / "j.db") as store:
            gw = gateway(base_url, limit)
            limits = SharedLimits.of(store)
            # Another worker learns of a 2 s pause while this one's intent is being committed.
            faults.on("model.K2", lambda: limits.pause(bucket(gw), 2.0))
            try:
                with pytest.raises(RateLimitWaitTooLong) as refused:
                    await AGENT.run_to_end("q", session=Session("r1", gw, store))
                assert refused.value.after_intent
                assert "intent is journaled" in str(refused.value)  # not "nothing ... journaled"
            finally:
                faults.on("model.K2", None)
            rows = [e.phase for e in store.load("r1") if e.kind == "model"]
            errors = [e.payload for e in store.load("r1") if e.phase == "error.1"]
            await asyncio.sleep(2.0)  # the pause ends; a resume sends the step
            done = await AGENT.run_to_end("q", session=Session("r1", gw, store))
            cp = store.checkpoint("r1")
            assert cp is not None
            counts = {k: cp.count(k) for k in ("model_sends", "possibly_billed_twice")}
            await gw.aclose()
            return rows, errors, counts, done.output

    with ProviderProcess(log, rpm=600) as provider:
        rows, errors, counts, output = asyncio.run(go(provider.base_url))
    assert rows == ["intent", "error.1"]  # the intent, then: held, not sent
    assert [e["counters"] for e in errors] == [{"model_sends": -1}]
    assert output == "done"
    assert counts == {"model_sends": 1, "possibly_billed_twice": 0}  # the resume's send alone
    assert [line["status"] for line in read_log(log)] == [200]  # nothing left before the resume
