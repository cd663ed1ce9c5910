"""A request whose turn was taken before another worker learned of a pause, and whose intent
was being committed meanwhile, is held between its intent and its send: it does not go into the
pause (the provider's log says whether it was refused). Two processes, SQLite and PostgreSQL,
through the official ``openai`` SDK against the fake rate-limited provider."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

import pytest
from rategap_workers import (
    AGENT,
    another_client_spends,
    bucket,
    gateway,
    journal_url,
    said,
    statuses,
    stopped_worker,
    until,
)

from cuaderno import RateLimit, Session, open_journal
from cuaderno.flow.ratelimit import SharedLimits
from cuaderno.testing.rate_limited_provider import ProviderProcess, read_log

# Far above the provider's budget: only what its answers say can hold a request back.
LIMIT = RateLimit(requests_per_minute=600, max_wait=30)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_turn_taken_before_a_pause_is_held_after_its_intent(backend: str, tmp_path: Path,
                                                               request: pytest.FixtureRequest) -> None:
    url = journal_url(tmp_path, backend, request)
    log = tmp_path / "provider.jsonl"
    ctx = multiprocessing.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()

    async def main(base_url: str) -> None:
        store = open_journal(url)
        gw = gateway(base_url, LIMIT)
        limits = SharedLimits.of(store)
        # Worker B takes its turn (nothing is paused), commits its intent and stops before the send.
        proc = ctx.Process(target=stopped_worker, args=(url, base_url, LIMIT, "b1", "model.K2", "go", out, go))
        proc.start()
        try:
            assert said(out) == ("at", "model.K2")
            # Another client of the key spends the budget; worker A's request is refused with a
            # 429 whose Retry-After pauses the key.
            await another_client_spends(base_url, 1)
            a = asyncio.create_task(AGENT.run_to_end("q", session=Session("a1", gw, store)))
            await until(lambda: limits.paused_for(bucket(gw)) > 0)
            go.set()  # B goes on, inside the pause: its turn was taken before it
            assert (await a).output == "done"
            assert await asyncio.to_thread(said, out) == ("done", "done")
            proc.join(30)
            rows = [e.phase for e in store.load("b1") if e.kind == "model"]
            assert rows == ["intent", "result"]  # one send, not counted as a re-send
        finally:
            go.set()
            if proc.is_alive():
                proc.kill()
                proc.join(30)
            await gw.aclose()
            store.close()

    # One request, one more every 2 s.
    with ProviderProcess(log, rpm=1, window=2) as provider:
        asyncio.run(main(provider.base_url))
    lines = read_log(log)
    # The other client's request, A's refused one, then A's and B's, one at a time: B was held
    # after its intent until the pause ended (and the probe's answer said the budget was spent
    # again), not sent into the pause. (Without the hold: [200, 429, 429, ...], B refused.)
    assert statuses(log) == [200, 429, 200, 200], lines
