"""OpenTelemetry spans and metrics for model calls and tool calls.

cuaderno depends on ``opentelemetry-api`` only. With no SDK installed or configured, every
helper here returns a shared do-nothing handle after two provider look-ups: no span, no
attribute, no clock read. Install and configure the SDK (or call :func:`configure`) and the same
calls emit telemetry that follows the OpenTelemetry GenAI semantic conventions (status
*development*, now kept in ``open-telemetry/semantic-conventions-genai``). The attribute names
are plain string constants in this module, so nothing depends on the unpinned, incubating
``opentelemetry-semantic-conventions`` package.

Spans (each carries ``gen_ai.conversation.id``, the run id):

- ``invoke_agent {gen_ai.agent.name}``, kind ``INTERNAL``, one per pass of a run (:func:`agent_pass`):
  every other span of the pass is its child, and a pass after the first links to the previous
  one through a marker journaled by it (:data:`PASS_PHASE`), in whatever process it ran.
- ``chat {gen_ai.request.model}`` (just ``chat`` when the request names no model), kind
  ``CLIENT``, one per attempt sent through the gateway. Attributes given at start (where a
  sampler can see them): ``gen_ai.operation.name="chat"``, ``gen_ai.request.model``,
  ``gen_ai.provider.name`` (:func:`provider_name`; ``TracedGateway`` always sets it), ``cuaderno.run_id``,
  ``cuaderno.step_id``; then ``gen_ai.request.max_tokens`` and ``gen_ai.request.temperature``
  when set. A response adds ``gen_ai.response.model``, ``gen_ai.response.id`` (when the provider gave one),
  ``gen_ai.response.finish_reasons``,
  ``gen_ai.usage.input_tokens`` (cached tokens included, as the conventions ask),
  ``gen_ai.usage.output_tokens`` (reasoning tokens included), and, when non-zero,
  ``gen_ai.usage.cache_read.input_tokens`` and ``gen_ai.usage.reasoning.output_tokens``. It
  also adds ``cuaderno.cost_usd`` for a priced answer or ``cuaderno.unpriced=true`` when the cost
  is ``None`` (unpriced, never free), ``cuaderno.tier`` and ``cuaderno.provider_request_id`` when
  known, and one ``cuaderno.escalation`` event per lower-tier answer a tiered gateway rejected.
- ``execute_tool {gen_ai.tool.name}``, kind ``INTERNAL``: ``gen_ai.operation.name="execute_tool"``,
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``cuaderno.run_id``, ``cuaderno.step_id``.

A failure sets the span status to ``ERROR``, records the exception as a span event and sets
``error.type``. For a :class:`~cuaderno.errors.GatewayError` or :class:`~cuaderno.errors.ToolError`
that is its :class:`~cuaderno.errors.ErrorClass` value (``transient``, ``ambiguous``...). For any
other exception it is the exception's type name. Success leaves the status ``UNSET``, as the
tracing spec asks of instrumentation libraries.

Metrics (meter ``cuaderno``). Their attributes are the low-cardinality ones only:
``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.response.model``, ``cuaderno.tier``, ``gen_ai.tool.name``, ``error.type``. Run and step
ids stay on spans.

- ``gen_ai.client.token.usage``: histogram, ``{token}``, one record per call and
  ``gen_ai.token.type`` (``input`` / ``output``).
- ``gen_ai.client.operation.duration``: histogram, ``s``; ``error.type`` on failures.
- ``gen_ai.execute_tool.duration``: histogram, ``s``, per tool execution; ``error.type`` on failures.
- ``cuaderno.model.cost``: counter, ``USD``, added to for priced calls only.
- ``cuaderno.model.unpriced_calls``: counter, ``{call}``, one per call whose cost is ``None``.

A tiered gateway's escalations were real, maybe billed calls. Their tokens and cost are recorded
in the token, cost and unpriced metrics too, under the lower tier's model and ``cuaderno.tier``, so
metric totals match the run's :class:`~cuaderno.checkpoint.Checkpoint` accounting. The span's
``gen_ai.usage.*`` and ``cuaderno.cost_usd`` describe the final answer only; escalation events
carry the rest.

Providers are looked up on every call: the ones given to :func:`configure`, else the global ones.
Nothing is captured at import time. A provider set after cuaderno was imported, or after earlier
calls, is used from the next call on, and instruments are created on the real provider, not
through the API's proxy. Telemetry never changes what the loop does: an error inside it is
logged and swallowed, and an exception from the wrapped code always propagates unchanged.
"""

from __future__ import annotations

from cuaderno.telemetry._model_call import ModelCallSpan, model_call
from cuaderno.telemetry._names import *  # noqa: F403  (the attribute and metric names, as before)
from cuaderno.telemetry._otel import configure
from cuaderno.telemetry._passes import AgentPassSpan, agent_pass
from cuaderno.telemetry._provider_name import provider_name
from cuaderno.telemetry._spans import error_type
from cuaderno.telemetry._tool_call import ToolCallSpan, tool_call

__all__ = [
    "AgentPassSpan",
    "ModelCallSpan",
    "ToolCallSpan",
    "agent_pass",
    "configure",
    "error_type",
    "model_call",
    "provider_name",
    "tool_call",
]
