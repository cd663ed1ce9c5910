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
import dataclasses
import json
import random
from collections.abc import AsyncIterator
from typing import Any

from agents import Model, ModelProvider, ModelSettings, ModelTracing
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse as SdkResponse
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models._retry_runtime import provider_managed_retries_disabled
from agents.tool import Tool
from agents.usage import Usage as SdkUsage
from openai.types.responses import ResponseOutputItem
from openai.types.responses.response_prompt_param import ResponsePromptParam
from pydantic import TypeAdapter

from cuaderno.durable import FrameworkPayload, ModelCall
from cuaderno.errors import GatewayError, ReplayDivergence, UsageError
from cuaderno.fingerprint import fingerprint, idempotency_key
from cuaderno.gateway.base import ModelResponse, ToolCall, Usage
from cuaderno.gateway.errors import from_exception
from cuaderno.integrations.openai_agents._state import RunShared

__all__ = ["FRAMEWORK", "KEY_HEADERS", "DurableModel", "DurableModelProvider", "jsonable", "plain"]

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


def summary(response: SdkResponse, model: str | None) -> ModelResponse:
    """The protocol's view of the SDK's answer: its text and tool calls (what ``cuaderno show``
    prints and the empty-answer verdict reads) and its usage (the run's token counters)."""
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
    return ModelResponse(text="".join(texts), tool_calls=tuple(calls), finish_reason="stop",
                         usage=Usage(input_tokens=u.input_tokens, output_tokens=u.output_tokens), model=model,
                         response_id=response.response_id)


class DurableModel(Model):
    """A :class:`agents.Model` whose every ``get_response`` is a journaled model step (see the
    module docstring). Streaming is not durable here: ``stream_response`` raises."""

    def __init__(self, inner: Model, shared: RunShared, name: str | None = None) -> None:
        self.inner = inner
        self.shared = shared
        self.name = name or str(getattr(inner, "model", "") or type(inner).__name__)

    async def get_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                           model_settings: ModelSettings, tools: list[Tool], output_schema: AgentOutputSchemaBase | None,
                           handoffs: list[Handoff[Any, Any]], tracing: ModelTracing, *,
                           previous_response_id: str | None, conversation_id: str | None,
                           prompt: ResponsePromptParam | None) -> SdkResponse:
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
        if isinstance(journaled, dict):
            response = from_journal(journaled)  # paid for once: never asked again
        else:
            response = await self._send(call, system_instructions, input, model_settings, tools,
                                        output_schema, handoffs, tracing, previous_response_id, conversation_id,
                                        prompt)
        # Counted only once answered: a runner-managed retry of a failed call is the same step,
        # sent again with the same key (the protocol counts it), not a new one.
        shared.model_steps = n + 1
        shared.turn = n
        return response

    async def _send(self, call: ModelCall, system_instructions: str | None,
                    input: str | list[TResponseInputItem], model_settings: ModelSettings, tools: list[Tool],
                    output_schema: AgentOutputSchemaBase | None, handoffs: list[Handoff[Any, Any]],
                    tracing: ModelTracing, previous_response_id: str | None, conversation_id: str | None,
                    prompt: ResponsePromptParam | None) -> SdkResponse:
        shared = self.shared
        headers = {**(model_settings.extra_headers or {}), **{h: call.key for h in KEY_HEADERS}}
        settings = dataclasses.replace(model_settings, extra_headers=headers)
        got: list[SdkResponse] = []

        async def request() -> ModelResponse:
            try:
                with provider_managed_retries_disabled(True):
                    response = await self.inner.get_response(
                        system_instructions, input, settings, tools, output_schema, handoffs, tracing,
                        previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt)
            except GatewayError:
                raise
            except Exception as exc:  # the SDK's client raised: classify it the one way cuaderno does
                raise from_exception(exc, provider="openai") from exc
            got.append(response)
            return summary(response, self.name)

        sent = await call.send(request, retry=shared.retry, sleep=asyncio.sleep, rng=random.Random())
        call.finish(sent, framework=FrameworkPayload(FRAMEWORK, to_journal(got[-1])))
        shared.log.commit()  # model.K6 inside its transaction, model.K7 after (the journal log passes them)
        return got[-1]

    def stream_response(self, system_instructions: str | None, input: str | list[TResponseInputItem],
                        model_settings: ModelSettings, tools: list[Tool], output_schema: AgentOutputSchemaBase | None,
                        handoffs: list[Handoff[Any, Any]], tracing: ModelTracing, *,
                        previous_response_id: str | None, conversation_id: str | None,
                        prompt: ResponsePromptParam | None) -> AsyncIterator[TResponseStreamEvent]:
        raise UsageError("DurableRunner journals whole responses: streaming is not supported (use run())")


class DurableModelProvider(ModelProvider):
    """The run config's model provider with every model it returns wrapped in :class:`DurableModel`."""

    def __init__(self, inner: ModelProvider, shared: RunShared) -> None:
        self.inner = inner
        self.shared = shared

    def get_model(self, model_name: str | None) -> Model:
        model = self.inner.get_model(model_name)
        return model if isinstance(model, DurableModel) else DurableModel(model, self.shared, model_name)
