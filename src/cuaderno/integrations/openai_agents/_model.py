"""The SDK's model, put through the model-call protocol (:class:`cuaderno.durable.ModelCall`).

:class:`DurableModel` wraps whatever :class:`agents.Model` the agent or the run config names (the
SDK's own ``OpenAIChatCompletionsModel`` or ``OpenAIResponsesModel``, with the user's
``AsyncOpenAI`` client): each ``get_response`` is one journaled step. The request goes through the
SDK's own client and HTTP stack; the wrapper only adds the step's idempotency key as the
``Idempotency-Key`` and ``X-Idempotency-Key`` headers (``ModelSettings.extra_headers``) and turns
the client's own retries off (the SDK's ``provider_managed_retries_disabled`` switch), so
cuaderno's model-call protocol is the only layer that sends again, with the same key, counted.

What replay needs from the framework payload this module journals with each result (named
``openai-agents``: :class:`~cuaderno.durable.FrameworkPayload`): ``output``, the SDK's output
items as JSON (the conversation goes on from them, never asked for again); ``usage``, the tokens
the SDK reports in its result; ``response_id``. The protocol's own ``response`` (text, tool
calls, usage, model) is a summary for ``cuaderno show`` and the cost counters. Results journaled
by this wrapper's first release hold the payload as ``sdk``, and are read from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from agents import Model, ModelProvider, ModelSettings, ModelTracing
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse as SdkResponse
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models._retry_runtime import provider_managed_retries_disabled
from agents.tool import Tool
from agents.usage import Usage as SdkUsage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseOutputItem,
    ResponseOutputItemDoneEvent,
    ResponseUsage,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import TypeAdapter

from cuaderno import telemetry
from cuaderno.durable import FrameworkPayload, ModelCall
from cuaderno.errors import GatewayError, ReplayDivergence, StreamInterrupted, UsageError
from cuaderno.fingerprint import fingerprint, idempotency_key
from cuaderno.flow.ratelimit import RateGate, framework_gate
from cuaderno.gateway import rate
from cuaderno.gateway.base import ModelRequest, ModelResponse, ToolCall, Usage
from cuaderno.gateway.errors import from_exception
from cuaderno.gateway.pricing import Prices
from cuaderno.integrations._budget import check_budget
from cuaderno.integrations._rate import watch_rate_headers
from cuaderno.integrations.openai_agents._state import RunShared
from cuaderno.journal.base import Checkpointer

__all__ = ["FRAMEWORK", "KEY_HEADERS", "DurableModel", "DurableModelProvider", "completed_event", "jsonable", "plain"]

KEY_HEADERS = ("Idempotency-Key", "X-Idempotency-Key")
"""The headers the step's key is sent in (the gateways' defaults: see ``cuaderno.gateway.openai``)."""

FRAMEWORK = "openai-agents"
"""The name the framework payload of each model step is journaled under."""

_OUTPUT = TypeAdapter(ResponseOutputItem)


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON (pydantic models dumped, dataclasses as dicts), for fingerprints
    and the journal. Anything else is refused: ``repr`` could hold a memory address, and a
    fingerprint that changes between processes would read as a divergence on every resume."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return jsonable(dump(mode="json", exclude_none=True))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    raise UsageError(f"a {type(value).__name__} in the model request cannot be journaled as JSON")


def request_fingerprint(system_instructions: str | None, input: str | list[TResponseInputItem], tools: list[Tool],
                        output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff[Any, Any]]) -> str:
    """What the step asks: instructions, conversation, the tools and handoffs it offers and the
    output it wants. A resume that would ask another question at this position is a divergence."""
    schema = None
    if output_schema is not None and not output_schema.is_plain_text():
        schema = output_schema.json_schema()
    return fingerprint({"system": system_instructions, "input": _without_nulls(jsonable(input)),
                        "tools": sorted(t.name for t in tools), "handoffs": sorted(h.tool_name for h in handoffs),
                        "output": schema})


def _without_nulls(value: Any) -> Any:
    """``value`` with every ``None`` field dropped: the SDK hands back the items it built from a
    live response with their unset fields as ``None`` and the same items rebuilt from the journal
    without them; both say the same, and must fingerprint the same."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """``value`` as the journal gives it back (:func:`jsonable`, keys sorted): what a tool's
    result is handed to the SDK as, live and on replay alike (the SDK turns a dict into text,
    so a key order that differed between the two would be another conversation)."""
    return json.loads(json.dumps(jsonable(value), sort_keys=True))


def to_journal(response: SdkResponse) -> dict[str, Any]:
    """The SDK's response as the result's ``sdk`` field (see the module docstring)."""
    u = response.usage
    return {"output": [item.model_dump(mode="json") for item in response.output],
            "usage": {"requests": u.requests, "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                      "total_tokens": u.total_tokens},
            "response_id": response.response_id}


def from_journal(sdk: dict[str, Any]) -> SdkResponse:
    """The SDK response a journaled result holds: what the run goes on with, unchanged."""
    output: list[TResponseOutputItem] = [_OUTPUT.validate_python(item) for item in sdk["output"]]
    u = sdk.get("usage") or {}
    usage = SdkUsage(requests=int(u.get("requests", 1)), input_tokens=int(u.get("input_tokens", 0)),
                     output_tokens=int(u.get("output_tokens", 0)), total_tokens=int(u.get("total_tokens", 0)))
    return SdkResponse(output=output, usage=usage, response_id=sdk.get("response_id"))


def summary(response: SdkResponse, model: str | None, prices: Prices | None = None) -> ModelResponse:
    """The protocol's view of the SDK's answer: its text and tool calls (what ``cuaderno show``
    prints and the empty-answer verdict reads), its usage (the run's token counters) and its cost
    at ``prices`` (``None``, unpriced, when they do not know the model)."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in response.output:
        if item.type == "message":
            texts.extend(c.text for c in item.content if c.type == "output_text")
        elif item.type == "function_call":
            try:
                args = json.loads(item.arguments or "{}")
                calls.append(ToolCall(id=item.call_id, name=item.name, arguments=args if isinstance(args, dict)
                                      else {"value": args}))
            except json.JSONDecodeError as exc:
                calls.append(ToolCall(id=item.call_id, name=item.name, arguments_error=str(exc),
                                      raw_arguments=item.arguments))
    u = response.usage
    usage = Usage(input_tokens=u.input_tokens, output_tokens=u.output_tokens,
                  cached_tokens=u.input_tokens_details.cached_tokens or 0,
                  reasoning_tokens=u.output_tokens_details.reasoning_tokens or 0)
    return ModelResponse(text="".join(texts), tool_calls=tuple(calls), finish_reason="stop", usage=usage,
                         model=model, response_id=response.response_id,
                         cost=prices.cost(usage, model) if prices is not None else None)


@contextlib.contextmanager
def _classified() -> Iterator[None]:
    """The SDK's client raised: classify it the one way cuaderno does (a ``GatewayError`` as is)."""
    try:
        yield
    except GatewayError:
        raise
    except Exception as exc:
        answer = getattr(exc, "response", None)  # the SDK's HTTP error keeps the answer it read
        if answer is not None and hasattr(answer, "headers"):
            # A 429's Retry-After (and any x-ratelimit-*) pauses every worker of the key.
            rate.report(answer.headers, status=getattr(answer, "status_code", None))
        raise from_exception(exc, provider="openai") from exc


def _usage(usage: ResponseUsage | None) -> SdkUsage:
    """A streamed response's usage as the SDK counts it (one request; zero when not reported)."""
    if usage is None:
        return SdkUsage(requests=1)
    return SdkUsage(requests=1, input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
                    total_tokens=usage.total_tokens)


def completed_event(response: SdkResponse, model: str) -> ResponseCompletedEvent:
    """The one stream event a journaled answer replays as: ``response.completed`` holding the
    journaled output, usage and response id (all the SDK's streamed loop reads from it)."""
    u = response.usage
    usage = ResponseUsage(input_tokens=u.input_tokens, output_tokens=u.output_tokens, total_tokens=u.total_tokens,
                          input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
                          output_tokens_details=OutputTokensDetails(reasoning_tokens=0))
    full = Response(id=response.response_id or "", created_at=0, model=model, object="response",
                    output=list(response.output), parallel_tool_calls=False, tool_choice="auto", tools=[],
                    usage=usage)
    return ResponseCompletedEvent(response=full, sequence_number=0, type="response.completed")


class DurableModel(Model):
    """A :class:`agents.Model` whose every ``get_response`` and ``stream_response`` is a
    journaled model step (see the module docstring)."""

    def __init__(self, inner: Model, shared: RunShared, name: str | None = None) -> None:
        self.inner = inner
        self.shared = shared
        self.name = name or str(getattr(inner, "model", "") or type(inner).__name__)

    async def get_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                           model_settings: ModelSettings, tools: list[Tool], output_schema: AgentOutputSchemaBase | None,
                           handoffs: list[Handoff[Any, Any]], tracing: ModelTracing, *,
                           previous_response_id: str | None, conversation_id: str | None,
                           prompt: ResponsePromptParam | None) -> SdkResponse:
        call, journaled = self._step(system_instructions, input, tools, output_schema, handoffs)
        if journaled is not None:
            response = journaled  # paid for once: never asked again
        else:
            settings = self._keyed(model_settings, call)
            got: list[SdkResponse] = []

            async def request() -> ModelResponse:
                with self._span(call, settings) as span, _classified(), provider_managed_retries_disabled(True):
                    response = await self.inner.get_response(
                        system_instructions, input, settings, tools, output_schema, handoffs, tracing,
                        previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt)
                    got.append(response)
                    answer = summary(response, self.name, self.shared.prices)
                    span.response(answer)
                return answer

            await self._journal(call, request, lambda: got[-1], self._gate(system_instructions, input, settings))
            response = got[-1]
        self._answered(call)
        return response

    async def stream_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                              model_settings: ModelSettings, tools: list[Tool],
                              output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff[Any, Any]],
                              tracing: ModelTracing, *, previous_response_id: str | None,
                              conversation_id: str | None,
                              prompt: ResponsePromptParam | None) -> AsyncIterator[TResponseStreamEvent]:
        """The step as a stream: live, the inner model's events as they arrive, except its
        ``response.completed``, which is handed on only once the whole answer is journaled (the
        SDK acts on it: tools must not run on an answer a crash could lose). A step answered in
        the journal streams that one event, rebuilt from the journal: nothing is sent.

        A stream cut before its end is :class:`~cuaderno.errors.StreamInterrupted` (ambiguous:
        maybe billed); the protocol sends the step again with the same key, counted, and the
        events of the cut attempt, already handed on, are followed by the new attempt's."""
        call, journaled = self._step(system_instructions, input, tools, output_schema, handoffs)
        if journaled is not None:
            self._answered(call)
            yield completed_event(journaled, self.name)
            return
        settings = self._keyed(model_settings, call)
        events: asyncio.Queue[TResponseStreamEvent] = asyncio.Queue()
        got: list[tuple[SdkResponse, TResponseStreamEvent]] = []

        async def request() -> ModelResponse:
            completed: ResponseCompletedEvent | None = None
            items: list[TResponseOutputItem] = []
            with self._span(call, settings) as span, _classified(), provider_managed_retries_disabled(True):
                async for event in self.inner.stream_response(
                        system_instructions, input, settings, tools, output_schema, handoffs, tracing,
                        previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt):
                    if isinstance(event, ResponseCompletedEvent):
                        completed = event  # held back until journaled
                    elif isinstance(event, ResponseOutputItemDoneEvent):
                        items.append(event.item)
                        events.put_nowait(event)
                    else:
                        events.put_nowait(event)
                if completed is None:
                    raise StreamInterrupted(f"{self.name}: the stream ended without response.completed")
                response = completed.response
                # Some backends leave the final response's output empty and send the items only in
                # their item.done events (the SDK's own streamed loop fills it the same way).
                output = list(response.output) or items
                got.append((SdkResponse(output=output, usage=_usage(response.usage), response_id=response.id),
                            completed))
                answer = summary(got[-1][0], self.name, self.shared.prices)
                span.response(answer)
            return answer

        sending = asyncio.ensure_future(self._journal(call, request, lambda: got[-1][0],
                                                      self._gate(system_instructions, input, settings)))
        try:
            while not sending.done() or not events.empty():
                if events.empty():
                    waiting = asyncio.ensure_future(events.get())
                    await asyncio.wait({sending, waiting}, return_when=asyncio.FIRST_COMPLETED)
                    if not waiting.done():
                        waiting.cancel()
                        continue
                    yield waiting.result()
                else:
                    yield events.get_nowait()
            sending.result()  # raises what the protocol raised (journaled as it journals it)
        finally:
            if not sending.done():  # the consumer stopped reading: the send stops with it
                sending.cancel()
        self._answered(call)
        yield got[-1][1]

    def _step(self, system_instructions: str | None, input: str | list[TResponseInputItem], tools: list[Tool],
              output_schema: AgentOutputSchemaBase | None,
              handoffs: list[Handoff[Any, Any]]) -> tuple[ModelCall, SdkResponse | None]:
        """The step this request is (the next model step of the run), and its journaled answer."""
        shared = self.shared
        n = shared.model_steps
        step_id = f"t{n:04d}.model"
        request_fp = request_fingerprint(system_instructions, input, tools, output_schema, handoffs)
        log = shared.log
        recorded = log.get(step_id, "result") or log.get(step_id, "intent")
        if recorded is not None and recorded.fingerprint != request_fp:
            raise ReplayDivergence(shared.run_id, step_id, f"request {recorded.fingerprint}", f"request {request_fp}")
        # A started step keeps the key its first intent carried (keep_key): the provider knows that one.
        call = ModelCall(log, step_id, key=idempotency_key(shared.run_id, step_id, request_fp), turn=n,
                         fingerprint=request_fp, keep_key=True)
        journaled = call.framework_payload(FRAMEWORK)
        answered = call.answered()
        if journaled is None and answered is not None:
            journaled = answered.payload.get("sdk")  # journaled by this wrapper's first release
        return call, from_journal(journaled) if isinstance(journaled, dict) else None

    def _answered(self, call: ModelCall) -> None:
        # Counted only once answered: a runner-managed retry of a failed call is the same step,
        # sent again with the same key (the protocol counts it), not a new one.
        self.shared.model_steps = call.turn + 1
        self.shared.turn = call.turn

    def _span(self, call: ModelCall, settings: ModelSettings) -> telemetry.ModelCallSpan:
        """The ``chat`` span of one send (a replayed answer is not a call: never traced)."""
        asked = ModelRequest(instructions="", messages=(), model=self.name, max_output_tokens=settings.max_tokens,
                             temperature=settings.temperature)
        return telemetry.model_call(asked, run_id=self.shared.run_id, step_id=call.step_id, provider="openai")

    @staticmethod
    def _keyed(model_settings: ModelSettings, call: ModelCall) -> ModelSettings:
        headers = {**(model_settings.extra_headers or {}), **{h: call.key for h in KEY_HEADERS}}
        return dataclasses.replace(model_settings, extra_headers=headers)

    def _gate(self, system_instructions: str | None, input: str | list[TResponseInputItem],
              settings: ModelSettings) -> RateGate | None:
        """The shared rate limit's gate for this request (``None`` without a limit)."""
        limit = self.shared.rate_limit
        if limit is None:
            return None
        # The SDK's models keep their openai client in ``_client`` (no public name): its base URL
        # and key name the budget an OpenAIGateway of the same key counts against too.
        watch_rate_headers(getattr(self.inner, "_client", None))  # success answers report their headers too
        return framework_gate(self.shared.store, limit, client=getattr(self.inner, "_client", None),
                              model=self.name, prompt=[system_instructions, jsonable(input)],
                              max_output_tokens=settings.max_tokens)

    async def _journal(self, call: ModelCall, request: Callable[[], Awaitable[ModelResponse]],
                       answer: Callable[[], SdkResponse], gate: RateGate | None = None) -> None:
        """Send through the protocol (intent, send, re-sends with the key) and journal the answer,
        with ``answer()``, the SDK's response the last send kept, as the framework payload.
        ``gate``: the shared rate limit's turn, taken before the intent is written."""
        shared = self.shared
        if shared.budget is not None and isinstance(shared.store, Checkpointer):
            # Before the intent: a run over its budget sends nothing more (BudgetExceeded).
            check_budget(shared.store, shared.run_id, shared.budget)
        sent = await call.send(request, retry=shared.retry, sleep=asyncio.sleep, rng=random.Random(), gate=gate)
        call.finish(sent, framework=FrameworkPayload(FRAMEWORK, to_journal(answer())))
        shared.log.commit()  # model.K6 inside its transaction, model.K7 after (the journal log passes them)


class DurableModelProvider(ModelProvider):
    """The run config's model provider with every model it returns wrapped in :class:`DurableModel`."""

    def __init__(self, inner: ModelProvider, shared: RunShared) -> None:
        self.inner = inner
        self.shared = shared

    def get_model(self, model_name: str | None) -> Model:
        model = self.inner.get_model(model_name)
        return model if isinstance(model, DurableModel) else DurableModel(model, self.shared, model_name)
