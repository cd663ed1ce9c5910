"""Every model request of a wrapped agent through the model-call protocol (:class:`ModelCall`).

The request is still made by the agent's own model (``OpenAIChatModel`` and its ``AsyncOpenAI``
client: the real HTTP path); this wrapper only decides whether it is made at all. A request whose
result is journaled is answered from the journal (never paid again); one never sent is sent after
its intent commits, carrying the step's idempotency key in the provider's headers
(``Idempotency-Key`` by default, through the framework's ``extra_headers`` setting); one whose
fate is unknown (an intent and no result) is sent again with the same key and counted as possibly
billed twice. A streamed request (``request_stream``: an ``event_stream_handler``) is the same
step, read whole inside its send and journaled before its events are handed on
(:meth:`JournaledModel.request_stream`).

What replay needs from the journaled result (beyond :mod:`cuaderno.durable.model_call`'s own):
its framework payload (``framework``, named ``pydantic-ai``: :class:`~cuaderno.durable.FrameworkPayload`),
the framework's dump of the response, handed back to the agent unchanged (its tool call ids are
what the tool steps are placed by). Results journaled by the first release of this wrapper hold
the dump as ``pydantic_ai`` instead, and are read from there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelMessage, ModelResponse, ModelResponseStreamEvent, ToolCallPart
from pydantic_ai.models import CompletedStreamedResponse, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext

from cuaderno import telemetry
from cuaderno.durable.model_call import FrameworkPayload, ModelCall
from cuaderno.errors import GatewayError, ReplayDivergence, StreamInterrupted, UsageError
from cuaderno.fingerprint import fingerprint, idempotency_key
from cuaderno.flow.ratelimit import framework_gate
from cuaderno.gateway import rate
from cuaderno.gateway.base import ModelRequest as JournalRequest
from cuaderno.gateway.base import ModelResponse as JournalResponse
from cuaderno.gateway.errors import from_exception, from_status
from cuaderno.gateway.pricing import default_prices
from cuaderno.integrations._budget import check_budget
from cuaderno.integrations._rate import watch_rate_headers
from cuaderno.integrations.pydantic_ai._messages import content, dump, load_response, to_journal
from cuaderno.integrations.pydantic_ai._state import RunState
from cuaderno.journal.base import Checkpointer

__all__ = ["FRAMEWORK", "JournaledModel", "check_sdk_retries"]

FRAMEWORK = "pydantic-ai"
"""The name the framework payload of each model step is journaled under."""


class JournaledModel(WrapperModel):
    """The agent's model, with each request journaled, keyed and counted (module docstring)."""

    def __init__(self, wrapped: Any, state: RunState) -> None:
        super().__init__(wrapped)
        check_sdk_retries(self.wrapped)
        self.state = state

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        call, journaled = self._step(messages, model_request_parameters)
        if journaled is not None:
            return journaled
        settings = self._keyed(model_settings, call)

        async def ask() -> tuple[ModelResponse, list[ModelResponseStreamEvent] | None]:
            return await self.wrapped.request(messages, ModelSettings(**settings),  # type: ignore[typeddict-item]
                                              model_request_parameters), None

        response, _ = await self._journal(call, messages, settings, ask)
        return response

    @asynccontextmanager
    async def request_stream(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                             model_request_parameters: ModelRequestParameters,
                             run_context: RunContext[Any] | None = None) -> AsyncIterator[StreamedResponse]:
        """The step as a stream (``run_stream``, ``event_stream_handler``, ``iter``'s ``node.stream``).

        Live, the inner model's stream is read whole inside the send and the answer journaled
        before any of its events is handed on: the agent acts on a streamed answer (runs its
        tools, ends the run) only once a crash can no longer lose it. The events are then handed
        on as the stream delivered them (pydantic-ai's ``CompletedStreamedResponse`` with the
        captured events, as its own durable wrappers hand on a stream read inside a step). A
        step answered in the journal streams its journaled parts: nothing is sent. A stream cut
        before its end is a failed send of unknown fate: sent again with the same key, counted."""
        call, journaled = self._step(messages, model_request_parameters)
        if journaled is not None:
            yield CompletedStreamedResponse(journaled, model_request_parameters=model_request_parameters,
                                            replay_events=True)
            return
        settings = self._keyed(model_settings, call)

        async def ask() -> tuple[ModelResponse, list[ModelResponseStreamEvent] | None]:
            async with self.wrapped.request_stream(messages, ModelSettings(**settings),  # type: ignore[typeddict-item]
                                                   model_request_parameters, run_context) as stream:
                try:
                    events = [event async for event in stream]
                except Exception as exc:
                    # The provider answered and the stream broke off (a reset, a stream the
                    # profile says must end with a finish reason ending without one): a
                    # fragment, maybe billed whole. Never journaled as the answer; sent again.
                    raise StreamInterrupted(f"{self.wrapped.model_name}: the stream broke off "
                                            f"({type(exc).__name__}: {exc})") from exc
                response = stream.get()
            if response.state != "complete":
                raise StreamInterrupted(f"{self.wrapped.model_name}: the stream ended {response.state}")
            return response, events

        response, events = await self._journal(call, messages, settings, ask)
        yield CompletedStreamedResponse(response, model_request_parameters=model_request_parameters,
                                        replay_events=events if events is not None else True)

    def _step(self, messages: list[ModelMessage],
              model_request_parameters: ModelRequestParameters) -> tuple[ModelCall, ModelResponse | None]:
        """The next model step of the run, and its journaled answer (``None``: not answered yet)."""
        state = self.state
        log = state.log
        step_id = state.next_model_step()
        # What the model is asked: the conversation's content and the tools and output offered.
        # Replay asks the same question at the same step, or the journal's answer is not for it.
        asked = fingerprint({"messages": content(dump(messages)),
                             "params": content(_jsonable(model_request_parameters)),
                             "model": self.wrapped.model_name})
        recorded = log.get(step_id, "result") or log.get(step_id, "intent")
        if recorded is not None and recorded.fingerprint is not None and recorded.fingerprint != asked:
            raise ReplayDivergence(state.run_id, step_id, f"request {recorded.fingerprint}", f"request {asked}")
        # A started step keeps the key its first intent carried (keep_key): the provider knows that one.
        call = ModelCall(log, step_id, key=idempotency_key(state.run_id, step_id, asked),
                         turn=state.model_steps - 1, fingerprint=asked, keep_key=True)
        journaled = call.framework_payload(FRAMEWORK)
        answered_before = call.answered()
        if journaled is None and answered_before is not None:
            journaled = answered_before.payload.get("pydantic_ai")  # journaled by this wrapper's first release
        if journaled is None:
            return call, None
        response = load_response(journaled)
        state.place_calls(step_id, _call_ids(response))
        return call, response

    def _keyed(self, model_settings: ModelSettings | None, call: ModelCall) -> dict[str, Any]:
        settings: dict[str, Any] = dict(model_settings or {})
        settings["extra_headers"] = {**dict(settings.get("extra_headers") or {}),
                                     **{name: call.key for name in self.state.key_headers}}
        return settings

    async def _journal(self, call: ModelCall, messages: list[ModelMessage], settings: dict[str, Any],
                       ask: Callable[[], Awaitable[tuple[ModelResponse, list[ModelResponseStreamEvent] | None]]],
                       ) -> tuple[ModelResponse, list[ModelResponseStreamEvent] | None]:
        """Send through the protocol (budget, rate limit, intent, ``ask()``, re-sends with the key)
        and journal the answer, the framework's response as the step's payload."""
        state = self.state
        step_id = call.step_id
        answered: list[tuple[ModelResponse, list[ModelResponseStreamEvent] | None]] = []
        asked_of = JournalRequest(instructions="", messages=(), model=self.wrapped.model_name,
                                  max_output_tokens=settings.get("max_tokens"), temperature=settings.get("temperature"))

        async def send() -> JournalResponse:
            # The chat span of this send (a replayed answer is not a call: never traced).
            with telemetry.model_call(asked_of, run_id=state.run_id, step_id=step_id,
                                      provider=self.wrapped.system) as span:
                try:
                    got = await ask()
                except GatewayError:
                    raise
                except Exception as exc:
                    # Classified once, by cuaderno's mapping of the SDK's exceptions (pydantic-ai
                    # keeps the openai error as the cause): a refused connection provably left
                    # nothing; a read timeout or a 5xx may have been billed, and is re-sent only
                    # after a new intent, counted.
                    raise _classified(exc) from exc
                answered.append(got)
                prices = state.prices if state.prices is not None else default_prices(self.wrapped.base_url)
                answer = to_journal(got[0], prices)
                span.response(answer)
            return answer

        if state.budget is not None and isinstance(state.store, Checkpointer):
            # Before the intent: a run over its budget sends nothing more (BudgetExceeded).
            check_budget(state.store, state.run_id, state.budget)
        gate = None
        if state.rate_limit is not None:
            # The provider's limit, shared by every worker on the journal: the turn is taken
            # before the intent. The model's openai client names the budget (endpoint and key).
            watch_rate_headers(getattr(self.wrapped, "client", None))  # success answers report their headers too
            gate = framework_gate(state.store, state.rate_limit, client=getattr(self.wrapped, "client", None),
                                  model=self.wrapped.model_name, prompt=dump(messages),
                                  max_output_tokens=settings.get("max_tokens"))
        sent = await call.send(send, retry=state.retry, sleep=asyncio.sleep, rng=state.rng, gate=gate)
        response, events = answered[-1]
        call.finish(sent, framework=FrameworkPayload(FRAMEWORK, dump([response])[0]))
        state.log.commit()  # model.K6 inside its transaction, model.K7 after (the journal log passes them)
        state.place_calls(step_id, _call_ids(response))
        return response, events


def check_sdk_retries(model: object) -> None:
    """Refuse a model whose OpenAI client retries on its own (checked when the agent is wrapped,
    and again for the model that serves each request: a model named by a string, or chosen at run
    time, is only known then; nothing has been sent when it is refused)."""
    client = getattr(model, "client", None)
    retries = getattr(client, "max_retries", 0)
    if isinstance(retries, int) and retries > 0:
        raise UsageError(f"the agent's model client retries on its own (max_retries={retries}): each retry would be a "
                         "send the journal never counts. Build it with max_retries=0, e.g. OpenAIProvider("
                         "openai_client=AsyncOpenAI(..., max_retries=0)); DurableAgent's retry= is the one retry layer")


def _classified(exc: Exception) -> GatewayError:
    for err in (exc, exc.__cause__):
        answer = getattr(err, "response", None)  # the openai SDK's HTTP error keeps the answer it read
        if answer is not None and hasattr(answer, "headers"):
            # A 429's Retry-After (and any x-ratelimit-*) pauses every worker of the key.
            rate.report(answer.headers, status=getattr(answer, "status_code", None))
            break
    if isinstance(exc, ModelHTTPError):
        # The framework's own HTTP error: the SDK's error (with the response headers) is its cause.
        cause = exc.__cause__
        if cause is not None:
            mapped = from_exception(cause, provider="openai")
            if mapped.status is not None:
                return mapped
        return from_status(exc.status_code, {}, exc.body, provider="openai")
    return from_exception(exc, provider="openai")


def _call_ids(response: ModelResponse) -> list[str]:
    return [p.tool_call_id for p in response.parts if isinstance(p, ToolCallPart)]


def _jsonable(params: ModelRequestParameters) -> Any:
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(params, fallback=repr)
