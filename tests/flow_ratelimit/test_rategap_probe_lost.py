"""A probe whose turn is lost before its send (its intent's commit fails, or its step is
cancelled) ends its hold at once: the request it held goes as the next probe within a fraction
of ``probe_timeout``, not after it. Two processes (the probe's worker and the held one), SQLite
and PostgreSQL, through the official ``openai`` SDK against the fake rate-limited provider."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from pathlib import Path

import pytest
from rategap_workers import AGENT, bucket, gateway, journal_url, said, stopped_worker, until

from cuaderno import RateLimit, Session, open_journal
from cuaderno.flow.ratelimit import SharedLimits
from cuaderno.testing.rate_limited_provider import ProviderProcess, read_log

LIMIT = RateLimit(requests_per_minute=600, max_wait=30)  # probe_timeout: the default 10 s


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize(("point", "how"), [("model.K0", "fail-commit"), ("model.K0", "cancel")],
                         ids=["intent-commit-fails", "cancelled-before-send"])
def test_a_probe_lost_before_its_send_lets_the_next_request_go_at_once(
        backend: str, point: str, how: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = journal_url(tmp_path, backend, request)
    log = tmp_path / "provider.jsonl"
    ctx = multiprocessing.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()

    async def main(base_url: str) -> float:
        store = open_journal(url)
        gw = gateway(base_url, LIMIT)
        limits = SharedLimits.of(store)
        limits.pause(bucket(gw), 0.1)  # as a 429's Retry-After leaves it: the next turn is a probe
        # The probe's worker takes the probe's turn and stops before its intent's commit (K0);
        # told to go on, its commit fails, or its step is cancelled there.
        proc = ctx.Process(target=stopped_worker, args=(url, base_url, LIMIT, "p1", point, how, out, go))
        proc.start()
        try:
            assert said(out) == ("at", point)
            held = asyncio.create_task(AGENT.run_to_end("q", session=Session("b1", gw, store)))
            await asyncio.sleep(0.5)
            assert not read_log(log), "a request went beside the probe"
            lost = time.monotonic()
            go.set()  # the probe's turn is lost: its commit fails, or its step is cancelled
            await until(lambda: bool(read_log(log)))
            went = time.monotonic() - lost
            assert (await held).output == "done"
            told = await asyncio.to_thread(said, out)
            assert told[0] == "error", told  # the probe's run stopped there, nothing sent
            proc.join(30)
            return went
        finally:
            go.set()
            if proc.is_alive():
                proc.kill()
                proc.join(30)
            await gw.aclose()
            store.close()

    with ProviderProcess(log, rpm=600) as provider:
        went = asyncio.run(main(provider.base_url))
    assert [line["status"] for line in read_log(log)] == [200]  # b1's request alone: the probe never left
    # Within a fraction of probe_timeout (10 s): the lost probe's hold ended when it was lost.
    assert went < LIMIT.probe_timeout / 4, went
