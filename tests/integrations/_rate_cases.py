"""The shared-rate-limit cases both integrations must pass, against the fake rate-limited
provider on loopback (its log is the truth). Each integration's test module gives ``one``: run
``run_id`` to its end on its own store and ``openai`` client (as separate workers have), with
the limit, and return the run's model rows."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from cuaderno import RateLimit, SqliteCheckpointer
from cuaderno.testing.rate_limited_provider import ProviderProcess, read_log

KEY = "sk-shared-key"
One = Callable[[Path, str, "RateLimit | None", str], Awaitable[list[str]]]


async def _three_runs_at_once(one: One, journal: Path, base_url: str, limit: RateLimit | None) -> list[list[str]]:
    return list(await asyncio.gather(*(one(journal, base_url, limit, f"r{i}") for i in range(3))))


def runs_sharing_a_key_take_turns(one: One, tmp_path: Path) -> None:
    """A budget of 2 requests, one more a second: three runs at once with the shared limit (one a
    second) meet no 429, each step sent once; without it the third request is refused."""
    log = tmp_path / "provider.jsonl"
    with ProviderProcess(log, rpm=2, window=2) as provider:
        rows = asyncio.run(_three_runs_at_once(one, tmp_path / "j.db", provider.base_url,
                                               RateLimit(requests_per_minute=60)))
    lines: list[dict[str, Any]] = read_log(log)
    assert [line["status"] for line in lines] == [200, 200, 200], lines
    gaps = [b["t"] - a["t"] for a, b in zip(lines, lines[1:], strict=False)]
    # One turn a second on the journal's clock; the provider sees the sends, each a commit (the
    # intent) after its turn: under load two of them came 0.86 s apart. The statuses above are
    # the truth (the provider refuses a third request inside its window); this says they were spread.
    assert min(gaps) >= 0.5, gaps
    assert rows == [["intent", "result"]] * 3  # no re-send, nothing counted as possibly billed twice

    unlimited = tmp_path / "unlimited.jsonl"
    with ProviderProcess(unlimited, rpm=2, window=2) as provider:
        asyncio.run(_three_runs_at_once(one, tmp_path / "j2.db", provider.base_url, None))
    assert 429 in [line["status"] for line in read_log(unlimited)]  # the test can fail


async def another_client_spends(base_url: str, requests: int) -> None:
    """Another client of the key (not a run, no limiter) spends ``requests`` of its budget."""
    rogue = AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    for _ in range(requests):
        await rogue.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    await rogue.close()


def a_429_pauses_the_other_runs(one: One, tmp_path: Path) -> None:
    """Another client of the key spends the budget; the first run's request is refused with a 429
    (Retry-After under 1 s), which pauses every run of the key: the second, started inside the
    pause, has no model row until it ends, and nobody is refused after it."""
    log = tmp_path / "provider.jsonl"
    journal = tmp_path / "j.db"

    async def go(base_url: str) -> list[str]:
        await another_client_spends(base_url, 2)
        # Far above the provider's budget: only the 429 it answers can hold the runs back.
        limit = RateLimit(requests_per_minute=600)
        first = asyncio.create_task(one(journal, base_url, limit, "a1"))
        while not any(line["status"] == 429 for line in read_log(log)):
            await asyncio.sleep(0.01)
        second = asyncio.create_task(one(journal, base_url, limit, "b1"))
        await asyncio.sleep(0.4)  # inside the pause the 429 asked for
        with SqliteCheckpointer(journal, readonly=True) as reader:
            waiting = [e.phase for e in reader.load("b1") if e.kind == "model"] if reader.checkpoint("b1") else []
        await asyncio.gather(first, second)
        return waiting

    with ProviderProcess(log, rpm=2, window=2) as provider:
        waiting = asyncio.run(go(provider.base_url))
    lines: list[dict[str, Any]] = read_log(log)
    assert [line["status"] for line in lines[:3]] == [200, 200, 429], lines
    assert waiting == []  # no intent, no key used while it waited
    # Nobody sent inside the pause the 429 asked for (its exact length, as retry-after-ms said it:
    # shorter than a second when the run's first request came late in the provider's window).
    pause = lines[2]["retry_after_s"]
    assert min(line["t"] - lines[2]["t"] for line in lines[3:]) >= pause - 0.02, (pause, lines)
    # Nobody was refused again: the second run and the first one's re-send each waited for the
    # budget the answers announced (the 429's, then the next 200's "0 remaining"), not for a
    # fixed second: how long the pause is depends on when the first run's request arrived.
    assert [line["status"] for line in lines[3:]] == [200, 200], lines


def a_spent_budget_in_a_success_answer_pauses_the_others(one: One, tmp_path: Path) -> None:
    """Another client of the key spends half the budget; the first run's request is answered 200
    with ``x-ratelimit-remaining-requests: 0``: that success answer's headers reach the shared
    limit, so the next run waits for the budget to refill before its intent and meets no 429.
    (Without them, only a 429 would hold it back: it is sent at once and refused.) No timing is
    asserted: the provider's log says whether it was refused."""
    log = tmp_path / "provider.jsonl"
    journal = tmp_path / "j.db"

    async def go(base_url: str) -> None:
        await another_client_spends(base_url, 1)
        limit = RateLimit(requests_per_minute=600)  # far above the provider's: only its headers can pace
        await one(journal, base_url, limit, "a1")
        await one(journal, base_url, limit, "b1")

    # Two requests, one more every 3 s: after a1 the budget is spent, and b1 sent at once
    # (as it is without the headers: only a 429 says so then) would be refused.
    with ProviderProcess(log, rpm=2, window=6) as provider:
        asyncio.run(go(provider.base_url))
    lines: list[dict[str, Any]] = read_log(log)
    assert [line["status"] for line in lines] == [200, 200, 200], lines


def after_a_pause_one_probe_goes_before_the_others(one: One, tmp_path: Path) -> None:
    """Two runs wait out one 429's pause together, under a local limit whose burst would let both
    go at its end; the provider has one request's budget there and answers slowly (0.4 s). The
    first request after the pause is a probe: the other run is held until its answer, which says
    the budget is spent again (a new pause, a new probe), so the provider refuses nothing after
    the pause. (Without the probe both were sent at the pause's end and the second refused: the
    CI failure of ``a_429_pauses_the_other_runs``, made certain here by the slow answer.)"""
    log = tmp_path / "provider.jsonl"
    journal = tmp_path / "j.db"

    async def go(base_url: str) -> None:
        await another_client_spends(base_url, 1)
        # Far above the provider's budget, and both runs' turns may leave together.
        limit = RateLimit(requests_per_minute=600, burst_seconds=1)
        await asyncio.gather(one(journal, base_url, limit, "a1"), one(journal, base_url, limit, "b1"))

    # One request, one more every 3 s (the runs' first sends, a run's start-up after the rogue's,
    # meet a spent budget); each answer takes 0.4 s (the budget is taken on arrival).
    with ProviderProcess(log, rpm=1, window=3, latency=0.4) as provider:
        asyncio.run(go(provider.base_url))
    lines: list[dict[str, Any]] = read_log(log)
    statuses = [line["status"] for line in lines]
    # The rogue's request, then the runs' first sends refused (one or both: the second may start
    # inside the first one's pause), then one 200 each and nothing refused after the pause.
    refused = statuses.index(200, 1) - 1
    assert statuses[0] == 200 and refused in (1, 2) and statuses[1 + refused:] == [200, 200], lines
    first_ok, second_ok = lines[1 + refused:]
    # The second went only after the probe's answer (0.4 s after it arrived) told of the spent budget.
    assert second_ok["t"] - first_ok["t"] >= 2.5, lines
