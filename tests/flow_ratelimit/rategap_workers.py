"""Helpers of the rategap tests: a journal URL per backend, and a worker process whose model
step stops at a named fault point (between its turn and its send) until the test says go."""

from __future__ import annotations

import asyncio
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from cuaderno import Agent, OpenAIGateway, RateLimit, Session
from cuaderno.gateway.base import ModelRequest
from cuaderno.testing.rate_limited_provider import read_log

AGENT = Agent(instructions="answer", name="answerer")
KEY = "sk-shared-key"


def journal_url(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'j.db'}"
    from _pg import new_schema, schema_url

    schemas: list[str] = request.getfixturevalue("pg_schemas")
    schemas.append(new_schema())
    return schema_url(schemas[-1])


def said(out: Any, timeout: float = 90) -> tuple[str, Any]:
    """The next message of a worker process (its queue), or the test fails after ``timeout`` s."""
    try:
        got: tuple[str, Any] = out.get(timeout=timeout)
    except queue.Empty:
        pytest.fail(f"the worker process said nothing in {timeout} s")
    return got


def gateway(base_url: str, limit: RateLimit) -> OpenAIGateway:
    return OpenAIGateway("m", base_url=base_url, api_key=KEY, rate_limit=limit)


def bucket(gw: OpenAIGateway) -> str:
    return gw.rate_bucket(ModelRequest(instructions="answer", messages=(), model="m"))


class Stop(Exception):
    """What the stopped worker raises at its point when told to (``how="raise"``)."""


def _fail_commit() -> None:
    raise Stop("the intent's commit failed")


def stopped_worker(url: str, base_url: str, limit: RateLimit, run_id: str, point: str, how: str,
                   out: Any, go: Any) -> None:
    """Run ``run_id`` through the SDK; at fault point ``point`` (once) say ``("at", point)`` and wait
    for ``go``, then go on (``how="go"``), raise :class:`Stop` there (``"raise"``), raise
    ``asyncio.CancelledError`` there (``"cancel"``: the step cancelled before its send), or go on
    and fail the intent's commit (``"fail-commit"``: :class:`Stop` raised inside its transaction,
    at ``model.K1``; not stopped there, which would hold SQLite's write lock). Says
    ``("done", output)`` or ``("error", type name)`` at the end."""
    from cuaderno import faults, open_journal

    try:
        store = open_journal(url)
        gw = gateway(base_url, limit)

        def stop() -> None:
            out.put(("at", point))
            if not go.wait(60):
                raise RuntimeError("the test never said go")
            if how == "raise":
                raise Stop(f"stopped at {point}")
            if how == "cancel":
                raise asyncio.CancelledError
            if how == "fail-commit":  # the next journal transaction of the step (its intent's) fails
                faults.on("model.K1", _fail_commit)

        faults.on(point, stop)

        async def go_on() -> str | None:
            try:
                return (await AGENT.run_to_end("q", session=Session(run_id, gw, store))).output
            finally:
                await gw.aclose()

        output = asyncio.run(go_on())
        out.put(("done", output))
    except BaseException as exc:  # said to the test, which would otherwise wait for it in vain
        out.put(("error", type(exc).__name__))
    finally:
        faults.on(point, None)
        faults.on("model.K1", None)


async def another_client_spends(base_url: str, requests: int) -> None:
    """Another client of the key (not a run, no limiter) spends ``requests`` of its budget."""
    import openai

    rogue = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    for _ in range(requests):
        await rogue.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    await rogue.close()


async def until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def statuses(log: Path) -> list[int]:
    return [line["status"] for line in read_log(log)]
