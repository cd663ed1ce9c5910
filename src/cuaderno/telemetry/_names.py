"""The names telemetry writes: the GenAI semantic conventions' attribute and metric names and
cuaderno's own, as plain strings (nothing depends on the incubating semantic-conventions package),
and the journal step of a pass marker. :mod:`cuaderno.telemetry` exports every one of them."""

from __future__ import annotations

from typing import Final

from opentelemetry.util.types import AttributeValue

__all__ = [
    "Attributes",
    "CUADERNO_COST_USD",
    "CUADERNO_ESCALATION_EVENT",
    "CUADERNO_LINK",
    "CUADERNO_PASS",
    "CUADERNO_PROVIDER_REQUEST_ID",
    "CUADERNO_RUN_ID",
    "CUADERNO_STEP_ID",
    "CUADERNO_TIER",
    "CUADERNO_UNPRICED",
    "ERROR_TYPE",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_CONVERSATION_ID",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MAX_TOKENS",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_REQUEST_TEMPERATURE",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_ID",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_TOKEN_TYPE",
    "GEN_AI_TOOL_CALL_ID",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "GEN_AI_USAGE_REASONING_OUTPUT_TOKENS",
    "INSTRUMENTATION_NAME",
    "METRIC_MODEL_COST",
    "METRIC_OPERATION_DURATION",
    "METRIC_TOKEN_USAGE",
    "METRIC_TOOL_DURATION",
    "METRIC_UNPRICED_CALLS",
    "OPERATION_CHAT",
    "OPERATION_EXECUTE_TOOL",
    "OPERATION_INVOKE_AGENT",
    "PASS_PHASE",
    "PASS_STEP_ID",
    "TOKEN_TYPE_INPUT",
    "TOKEN_TYPE_OUTPUT",
]

INSTRUMENTATION_NAME: Final = "cuaderno"

# -- GenAI semantic conventions (attribute and metric names, as strings) ---------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
ERROR_TYPE: Final = "error.type"

OPERATION_CHAT: Final = "chat"
OPERATION_EXECUTE_TOOL: Final = "execute_tool"
OPERATION_INVOKE_AGENT: Final = "invoke_agent"
TOKEN_TYPE_INPUT: Final = "input"
TOKEN_TYPE_OUTPUT: Final = "output"

METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"

# -- cuaderno's own names -------------------------------------------------------------------------
CUADERNO_RUN_ID: Final = "cuaderno.run_id"
CUADERNO_STEP_ID: Final = "cuaderno.step_id"
CUADERNO_COST_USD: Final = "cuaderno.cost_usd"
CUADERNO_UNPRICED: Final = "cuaderno.unpriced"
CUADERNO_TIER: Final = "cuaderno.tier"
CUADERNO_PROVIDER_REQUEST_ID: Final = "cuaderno.provider_request_id"
CUADERNO_ESCALATION_EVENT: Final = "cuaderno.escalation"
CUADERNO_PASS: Final = "cuaderno.pass"
CUADERNO_LINK: Final = "cuaderno.link"

METRIC_MODEL_COST: Final = "cuaderno.model.cost"
METRIC_UNPRICED_CALLS: Final = "cuaderno.model.unpriced_calls"

# -- the journal step of a pass marker -------------------------------------------------------------
PASS_STEP_ID: Final = "run"
PASS_PHASE: Final = "pass"
"""A pass marker is the journal event ``("run", "pass")``, then ``pass.2``, ``pass.3``... (kind
``run``). Its payload, ``{"trace_id", "span_id"}`` (lowercase hex), names the ``invoke_agent``
span of the pass that wrote it, so a later pass (in any process) links to it. Replay reads none
of it: the checkpoint's projection ignores the phase, and the loop replays only model, tool and
final steps."""

Attributes = dict[str, AttributeValue]
