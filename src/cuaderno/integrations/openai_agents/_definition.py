"""The agent definition a run is bound to: what its version fingerprint covers.

A run resumed under another agent (other instructions, tools, tool schemas, declared effect
classes, output type, model or settings, handoffs) would replay answers given to a different
question, so the fingerprint of the definition is recorded as the run's version and a changed
agent is a :class:`~cuaderno.errors.VersionMismatch` unless the caller chose a version label
(``DurableRunner(agent_version=...)``) and keeps it across the change.

Code is not fingerprinted (a function's body cannot be compared across processes): a callable
``instructions`` or ``needs_approval`` is recorded by its qualified name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agents import Agent, AgentOutputSchema, AgentOutputSchemaBase, Handoff, Model
from agents.tool import FunctionTool

from cuaderno.fingerprint import fingerprint
from cuaderno.integrations.openai_agents._effects import ToolEffect
from cuaderno.integrations.openai_agents._model import jsonable

__all__ = ["agent_fingerprint", "definition"]


def _named(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return f"<{getattr(value, '__qualname__', type(value).__qualname__)}>"


def _output(agent: Agent[Any]) -> Any:
    output_type = agent.output_type
    if output_type is None or output_type is str:
        return None
    try:
        if isinstance(output_type, AgentOutputSchemaBase):
            return output_type.json_schema()
        return AgentOutputSchema(output_type).json_schema()
    except Exception:  # a type the SDK cannot describe: recorded by name
        return _named(output_type)


def _model(model: str | Model | None) -> Any:
    if model is None or isinstance(model, str):
        return model
    return {"class": type(model).__qualname__, "model": _named(getattr(model, "model", None))}


def definition(agent: Agent[Any], effects: Mapping[str, ToolEffect], seen: frozenset[int] = frozenset()) -> dict[str, Any]:
    """The agent as plain JSON (see the module docstring); handoffs recursively (a cycle by name)."""
    if id(agent) in seen:
        return {"name": agent.name}
    seen = seen | {id(agent)}
    tools = []
    for tool in agent.tools:
        entry: dict[str, Any] = {"name": tool.name, "type": type(tool).__qualname__}
        if isinstance(tool, FunctionTool):
            entry["parameters"] = tool.params_json_schema
            entry["needs_approval"] = _named(tool.needs_approval)
            entry["effect"] = effects.get(tool.name, ToolEffect()).to_json()
        tools.append(entry)
    handoffs: list[Any] = []
    for h in agent.handoffs:
        if isinstance(h, Agent):
            handoffs.append(definition(h, effects, seen))
        elif isinstance(h, Handoff):
            handoffs.append({"handoff": h.tool_name, "agent": h.agent_name, "parameters": h.input_json_schema})
    return {"name": agent.name, "instructions": _named(agent.instructions), "model": _model(agent.model),
            "model_settings": jsonable(agent.model_settings.to_json_dict()), "tools": tools, "output": _output(agent),
            "handoffs": handoffs, "tool_use_behavior": _named(agent.tool_use_behavior)}


def agent_fingerprint(agent: Agent[Any], effects: Mapping[str, ToolEffect]) -> str:
    """The fingerprint of :func:`definition`."""
    return fingerprint(definition(agent, effects))
