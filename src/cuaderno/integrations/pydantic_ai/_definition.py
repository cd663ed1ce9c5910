"""The fingerprint of a Pydantic AI agent's definition: what a resumed run is checked against.

A run journaled by one agent and resumed by another (other instructions, tools, output type, model
or effect declarations) would replay answers given to another question: the opening refuses it as
a :class:`~cuaderno.errors.VersionMismatch` unless the caller chooses otherwise
(``on_version_mismatch``).

Read from the agent as constructed. The framework exposes its tools publicly (``agent.toolsets``);
the static instructions and system prompts only as private attributes, read here defensively (a
release that renames them leaves them out of the fingerprint rather than failing the run). A
dynamic instruction (a function) counts by its qualified name: its output is checked anyway, as
part of every request's fingerprint.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_core import to_jsonable_python

from cuaderno.fingerprint import fingerprint
from cuaderno.integrations.pydantic_ai._effects import ToolEffect, declared_as

__all__ = ["agent_definition", "definition_fingerprint"]


def agent_definition(agent: Agent[Any, Any], effects: Mapping[str, ToolEffect],
                     compensations: Collection[str] = ()) -> dict[str, Any]:
    """The parts of ``agent`` that decide what it asks and does, as JSON. ``compensations``: the
    tools declared with one (listed only when there are some: the fingerprint of a definition
    without any is the one earlier releases recorded)."""
    definition = {
        "name": agent.name,
        "model": _model(agent.model),
        "instructions": [_piece(i) for i in getattr(agent, "_instructions", ())],
        "system_prompts": [_piece(p) for p in getattr(agent, "_system_prompts", ())],
        "output": _output(agent.output_type),
        "tools": _tools(agent),
        "effects": {name: declared_as(d) for name, d in sorted(effects.items())},
    }
    if compensations:
        definition["compensations"] = sorted(compensations)
    return definition


def definition_fingerprint(agent: Agent[Any, Any], effects: Mapping[str, ToolEffect],
                           compensations: Collection[str] = ()) -> str:
    return fingerprint(agent_definition(agent, effects, compensations))


def _model(model: object) -> str | None:
    if isinstance(model, Model):
        return f"{model.system}:{model.model_name}"
    return None if model is None else str(model)


def _piece(value: object) -> Any:
    if isinstance(value, str):
        return value
    return getattr(value, "__qualname__", None) or type(value).__qualname__


def _output(output_type: object) -> Any:
    try:
        return TypeAdapter[Any](output_type).json_schema()  # type: ignore[arg-type]
    except Exception:  # a list of output types, a marker class: its repr names it well enough
        return repr(output_type)


def _tools(agent: Agent[Any, Any]) -> dict[str, Any]:
    tools: dict[str, Any] = {}
    for i, toolset in enumerate(agent.toolsets):
        found = getattr(toolset, "tools", None)
        if not isinstance(found, Mapping):
            tools[f"toolset{i}"] = type(toolset).__qualname__
            continue
        for name, tool in found.items():
            schema = getattr(getattr(tool, "function_schema", None), "json_schema", None)
            tools[str(name)] = {"description": getattr(tool, "description", None),
                                "schema": to_jsonable_python(schema, fallback=repr),
                                "requires_approval": bool(getattr(tool, "requires_approval", False))}
    return tools
