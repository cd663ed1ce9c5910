"""Token streaming: the caller sees the answer as it is generated; the journal records it whole.

``agent.stream(task, session=...)`` returns a :class:`TokenStream`. Iterate it for
:class:`Token` objects as the provider sends them, or ``await`` it (with an ``on_token``
callback) for the :class:`~cuaderno.loop.result.RunResult`; either way the run is the same
durable run as :meth:`~cuaderno.loop.agent.Agent.run_to_end`:

- the model call's intent is committed before the request leaves, as for any call;
- tokens are handed to the caller as they arrive and are **never journaled**: only the complete
  response is, in the same result row as a non-streamed one (so a replay cannot tell, and does
  not need to tell, that it was streamed);
- a crash mid-stream leaves an intent without a result: the resumed run re-sends the request
  with the same idempotency key (``intent.2``, after ``crash``), counted in
  ``possibly_billed_twice``, because the provider may bill the generation it had started;
- a stream cut mid-way (the connection closed, an event cut in the middle) is
  :class:`~cuaderno.errors.StreamInterrupted`, ``ambiguous``: re-sent within
  ``RetryPolicy.max_resends`` and counted the same way, journaled as the step's error past it.

What the caller sees is therefore *at least* the answer, sometimes more: a re-send starts the
step's text over, announced by a token with ``reset=True`` (discard what that step showed). An
answer this process did not stream (a completed run answered from its journal, or a final turn
whose response was journaled before a crash) is handed over as one token with ``replayed=True``,
so a caller that prints the tokens always prints the final answer once.

Streaming goes through the model-call seam (:mod:`cuaderno.loop.model_calls`): the loop body is
unchanged. A gateway with ``complete_streaming`` (the OpenAI and Anthropic gateways) streams;
any other gateway answers whole and its text is one token. A session with its own
``model_caller`` (Temporal) keeps it: only the final answer is handed over, as a replayed token.

Crash point: ``model.token`` is passed before each token is handed to the caller
(``CUADERNO_CRASH_AT=model.token:3`` kills the process at the third token).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cuaderno import faults, telemetry
from cuaderno.errors import BudgetExceeded, RunCancelled, RunClosed, UncertainEffect, UsageError
from cuaderno.events import model_step_id
from cuaderno.gateway.base import ModelGateway, ModelRequest, ModelResponse
from cuaderno.loop.steps import FinalStep, Step

if TYPE_CHECKING:
    from cuaderno.loop.agent import Agent, Session
    from cuaderno.loop.result import RunResult
    from cuaderno.loop.runner import Runner

__all__ = ["Emit", "StreamingCaller", "Token", "TokenStream", "drive", "run_streaming"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Token:
    """A piece of a model answer, handed to the caller before the answer is journaled.

    Attributes:
        text: the piece (one provider delta; the whole text for a non-streaming gateway).
        step_id: the model step it belongs to (``t0002.model``).
        send: which send of that step this process made (2 after a cut stream was re-sent).
        reset: the step is sent again: discard the text this step showed so far (``text`` is "").
        replayed: the final answer, taken from the journal: this process did not stream it.
    """

    text: str
    step_id: str
    send: int = 1
    reset: bool = False
    replayed: bool = False


Emit = Callable[[Token], None]


class StreamingCaller:
    """A :class:`~cuaderno.loop.model_calls.ModelCaller` that streams: one ``chat`` span per
    send, like the default caller, with each token handed to ``emit`` as it arrives."""

    def __init__(self, gateway: ModelGateway, emit: Emit) -> None:
        self.gateway = gateway
        self.emit = emit
        self.sends: dict[str, int] = {}
        """Sends this process made, per step id (a step in it was streamed here)."""
        self._provider: str | None = None

    @property
    def provider(self) -> str:
        """``gen_ai.provider.name`` of every chat span."""
        if self._provider is None:
            self._provider = telemetry.provider_name(self.gateway)
        return self._provider

    async def call(self, request: ModelRequest, *, run_id: str, step_id: str, idempotency_key: str) -> ModelResponse:
        send = self.sends.get(step_id, 0) + 1
        self.sends[step_id] = send
        if send > 1:
            self.emit(Token(text="", step_id=step_id, send=send, reset=True))

        def on_token(text: str) -> None:
            faults.point("model.token")  # a kill here: the intent is journaled, the answer is not
            self.emit(Token(text=text, step_id=step_id, send=send))

        with telemetry.model_call(request, run_id=run_id, step_id=step_id, provider=self.provider) as span:
            streaming = getattr(self.gateway, "complete_streaming", None)
            if streaming is None:
                response = await self.gateway.complete(request, idempotency_key=idempotency_key)
                if response.text:
                    on_token(response.text)
            else:
                response = await streaming(request, idempotency_key=idempotency_key, on_token=on_token)
            span.response(response)
        return response


async def drive(steps: AsyncIterator[Step], agent: Agent, session: Session) -> RunResult:
    """Iterate a run's steps until it stops and return its :class:`RunResult` (as
    :func:`~cuaderno.loop.result.run_to_end`, for a runner built here)."""
    from cuaderno.loop.result import _result

    seen: list[Step] = []
    final: FinalStep | None = None
    try:
        async for step in steps:
            seen.append(step)
            if isinstance(step, FinalStep):
                final = step
    except (BudgetExceeded, RunCancelled, RunClosed, UncertainEffect):
        pass  # a state the journal records and the checkpoint reports, as in run_to_end
    return _result(agent, session, seen, final)


async def run_streaming(agent: Agent, session: Session, emit: Emit,
                        runner: Callable[[Session], Runner]) -> RunResult:
    """Drive the run ``runner(session)`` builds with a streaming caller on a copy of ``session``;
    hand the final answer over as a replayed token when this process did not stream it."""
    caller: StreamingCaller | None = None
    streamed = session
    if session.model_caller is None:
        caller = StreamingCaller(session.gateway, emit)
        streamed = copy.copy(session)  # the caller's session object is left as it was
        streamed.model_caller = caller
    result = await drive(runner(streamed).steps(), agent, streamed)
    if result.completed and result.text:
        turn = (result.outcome or {}).get("turn")
        step_id = model_step_id(turn) if type(turn) is int else "final"
        if caller is None or step_id not in caller.sends:
            emit(Token(text=result.text, step_id=step_id, replayed=True))
    return result


class TokenStream:
    """A run whose model answers stream to the caller. Use it once, one of two ways::

        async for token in agent.stream(task, session=session):
            print(token.text, end="")          # stream.result holds the RunResult afterwards

        result = await agent.stream(task, session=session, on_token=show)
        result = agent.stream(task, session=session, on_token=show).run_sync()

    ``on_token`` is called for every token in both ways, as the token arrives (before the next
    one is read). Iterating, tokens are queued for the ``async for``: the run does not wait for
    the consumer. Errors are raised as by
    ``run_to_end``. To leave the ``async for`` early, iterate inside
    ``contextlib.aclosing(stream.__aiter__())``: closing it cancels the run's task (results
    already in are journaled; the call in flight is re-sent with the same key, counted as
    possibly billed twice, when the run is resumed).
    """

    def __init__(self, start: Callable[[Emit], Awaitable[RunResult]], on_token: Emit | None = None) -> None:
        self._start = start
        self._on_token = on_token
        self._used = False
        self.result: RunResult | None = None
        """The run's result, once the stream ended."""

    def _claim(self) -> None:
        if self._used:
            raise UsageError("a TokenStream runs once: call agent.stream(...) again to resume the run")
        self._used = True

    def _emit(self, token: Token) -> None:
        if self._on_token is not None:
            self._on_token(token)

    def __await__(self) -> Generator[None, None, RunResult]:
        return self.run_to_end().__await__()

    async def run_to_end(self) -> RunResult:
        """Run to the end, handing each token to ``on_token``; the same as ``await stream``."""
        self._claim()
        self.result = await self._start(self._emit)
        return self.result

    def run_sync(self) -> RunResult:
        """:meth:`run_to_end` for synchronous code (not inside a running event loop)."""
        from cuaderno.loop.result import run_sync

        return run_sync(self.run_to_end())

    async def __aiter__(self) -> AsyncIterator[Token]:
        self._claim()
        queue: asyncio.Queue[Token | None] = asyncio.Queue()

        def emit(token: Token) -> None:
            self._emit(token)
            queue.put_nowait(token)

        task = asyncio.ensure_future(self._start(emit))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (token := await queue.get()) is not None:
                yield token
            self.result = task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
