"""``agent.stream``: tokens reach the caller while the journal records each complete response; a
stream cut mid-token is re-sent with the same key, counted as possibly billed twice, nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from test_gateway_stream import USAGE, chunk, sse, streamed

from cuaderno import (
    Agent,
    ModelStep,
    RetryPolicy,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    StreamInterrupted,
    Token,
    UsageError,
    tool,
)
from cuaderno.checkpoint import cost_upper_usd, verified
from cuaderno.gateway.pricing import PriceTable

PRICES = PriceTable({"gpt-test": {"input": 1000.0, "output": 1000.0}})  # 15 tokens: $0.015 a call
CUT = httpx2.RemoteProtocolError("peer closed connection without sending complete message body")


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


@pytest.fixture
def make_openai(make_openai: Any) -> Iterator[Callable[..., Any]]:
    """The gateway of conftest, at a loopback port that accepts connections: the loop's preflight
    (one TCP connect before a new run) passes; every request still goes to the mock transport."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        yield lambda **kw: make_openai(**{"base_url": url, **kw})


def answer(*pieces: str) -> Callable[[httpx2.Request], httpx2.Response]:
    return streamed(sse(*(chunk(p) for p in pieces[:-1]), chunk(pieces[-1], finish="stop"), USAGE))


def cut_after(*pieces: str) -> Callable[[httpx2.Request], httpx2.Response]:
    return streamed([*sse(*(chunk(p) for p in pieces), done=False), b'data: {"choices": [{"delta": {"cont'], cut=CUT)


@tool
def look(q: str) -> str:
    """Look something up."""
    return f"found {q}"


async def test_tokens_stream_and_the_journal_holds_the_complete_responses(store: Any, fake: Any,
                                                                         make_openai: Any) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"q": "x"}'}}
    fake.queue(streamed(sse(chunk(tool_calls=[{"index": 0, **call}]), chunk(finish="tool_calls"), USAGE)),
               answer("Found", " it", "."))
    agent = Agent(instructions="i", tools=[look], model="gpt-test")
    stream = agent.stream("find x", session=Session("s1", make_openai(prices=PRICES), store))
    tokens = [t async for t in stream]
    assert [t.text for t in tokens] == ["Found", " it", "."]
    assert {t.step_id for t in tokens} == {"t0001.model"} and not any(t.reset or t.replayed for t in tokens)
    result = stream.result
    assert result is not None and result.completed and result.output == "Found it."
    assert [type(s).__name__ for s in result.steps] == ["ModelStep", "ToolStep", "ModelStep", "FinalStep"]
    journaled = [e.payload["response"] for e in store.load("s1") if e.kind == "model" and e.phase == "result"]
    assert journaled[1]["text"] == "Found it." and journaled[0]["tool_calls"][0]["arguments"] == {"q": "x"}
    assert result.cost_usd == pytest.approx(0.03) and result.possibly_billed_twice == 0
    assert len(fake.requests) == 2

    # Run again: the completed run's answer comes from the journal, as one replayed token.
    again = agent.stream("find x", session=Session("s1", make_openai(prices=PRICES), store))
    assert [(t.text, t.replayed) async for t in again] == [("Found it.", True)]
    assert len(fake.requests) == 2, "a journaled answer was asked again"


async def test_a_stream_cut_mid_token_is_resent_with_the_same_key_and_counted(store: Any, fake: Any,
                                                                              make_openai: Any) -> None:
    fake.queue(cut_after("Hel"), answer("Hel", "lo"))
    shown: list[Token] = []
    agent = Agent(instructions="i", model="gpt-test")
    result = await agent.stream("hi", session=Session("s2", make_openai(prices=PRICES), store,
                                                      retry=RetryPolicy(base_delay=0)), on_token=shown.append)
    assert [(t.text, t.send, t.reset) for t in shown] == [("Hel", 1, False), ("", 2, True), ("Hel", 2, False),
                                                          ("lo", 2, False)]
    assert result.completed and result.output == "Hello"
    keys = [r.headers["idempotency-key"] for r in fake.requests]
    assert len(keys) == 2 and keys[0] == keys[1], "the re-send must carry the same key"
    assert result.possibly_billed_twice == 1
    cp, events = verified(store, "s2")
    assert [e.phase for e in events if e.kind == "model"] == ["intent", "intent.2", "result"]
    assert events[[e.phase for e in events].index("intent.2")].payload["after"] == "ambiguous"
    assert cost_upper_usd(cp, events) == pytest.approx(2 * cp.cost_usd)
    model_steps = [s for s in result.steps if isinstance(s, ModelStep)]
    assert model_steps[0].attempts == 2


async def test_cut_past_the_resend_bound_fails_the_step_journaled_and_a_resume_finishes(store: Any, fake: Any,
                                                                                       make_openai: Any) -> None:
    fake.queue(cut_after("a"), cut_after("a", "b"))
    agent = Agent(instructions="i", model="gpt-test")
    session = Session("s3", make_openai(prices=PRICES), store, retry=RetryPolicy(base_delay=0, max_resends=1))
    with pytest.raises(StreamInterrupted):
        await agent.stream("hi", session=session)
    cp, events = verified(store, "s3")
    errors = [e for e in events if e.phase.startswith("error")]
    assert len(errors) == 1 and errors[0].payload["error"]["type"] == "StreamInterrupted"
    assert errors[0].payload["error"]["error_class"] == "ambiguous"
    assert cp.status == "running" and cp.count("possibly_billed_twice") == 1 and cp.count("model_sends") == 2
    # Nothing lost: the run resumes (a third send, same key, counted again) and completes.
    fake.queue(answer("ok"))
    result = await agent.stream("hi", session=Session("s3", make_openai(prices=PRICES), store))
    assert result.completed and result.output == "ok" and result.possibly_billed_twice == 2
    assert len({r.headers["idempotency-key"] for r in fake.requests}) == 1


async def test_leaving_the_stream_early_cancels_the_run_and_a_resume_resends(store: Any, fake: Any,
                                                                             make_openai: Any) -> None:
    never = asyncio.Event()  # the provider is still generating when the caller leaves

    def slow(request: httpx2.Request) -> httpx2.Response:
        async def body() -> AsyncIterator[bytes]:
            yield sse(chunk("one"), done=False)[0]
            await never.wait()
            yield b"data: [DONE]\n\n"

        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    fake.queue(slow)
    agent = Agent(instructions="i", model="gpt-test")
    stream = agent.stream("hi", session=Session("s4", make_openai(), store))
    async with contextlib.aclosing(stream.__aiter__()) as tokens:
        async for token in tokens:
            assert token.text == "one"
            break
    assert stream.result is None
    cp = store.checkpoint("s4")
    assert cp is not None and cp.status == "running" and cp.count("model_calls") == 0
    assert cp.count("model_sends") == 1  # the intent was committed before the request left
    fake.queue(answer("one", " two"))
    result = await agent.stream("hi", session=Session("s4", make_openai(), store))
    assert result.output == "one two" and result.possibly_billed_twice == 1
    assert fake.requests[0].headers["idempotency-key"] == fake.requests[1].headers["idempotency-key"]


async def test_a_gateway_without_streaming_gives_its_answer_as_one_token(store: Any) -> None:
    agent = Agent(instructions="i")
    texts = [t.text async for t in agent.stream("t", session=Session("s5", ScriptedGateway([
        ScriptedGateway.text("whole")]), store))]
    assert texts == ["whole"]


async def test_a_stream_runs_once_and_bad_input_is_refused(store: Any) -> None:
    agent = Agent(instructions="i")
    stream = agent.stream("t", session=Session("s6", ScriptedGateway([ScriptedGateway.text("x")]), store))
    await stream
    with pytest.raises(UsageError):
        await stream
    with pytest.raises(UsageError):
        agent.stream(3, session=Session("s7", ScriptedGateway([]), store))  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        agent.stream("t", session="s")  # type: ignore[arg-type]


def test_run_sync_of_a_stream(store: Any) -> None:
    agent = Agent(instructions="i")
    shown: list[str] = []
    result = agent.stream("t", session=Session("s8", ScriptedGateway([ScriptedGateway.text("x")]), store),
                          on_token=lambda t: shown.append(t.text)).run_sync()
    assert result.output == "x" and shown == ["x"]
    assert json.dumps(result.text) == '"x"'
