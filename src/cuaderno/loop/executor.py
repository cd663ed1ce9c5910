"""The tool-executor seam: how the loop runs a tool, by name, with plain data in and out.

The loop's tool steps (:mod:`cuaderno.loop._tool_steps`) never touch a :class:`~cuaderno.tools.
definition.Tool`: they ask the :class:`ToolExecutor` on their :class:`~cuaderno.loop.agent.Session`
what a tool is (:class:`ToolInfo`: its effect type, whether it is idempotent, whether it has a
lookup), whether arguments fit it, to run it, and to look an effect up by its key. Arguments
are the JSON object the model wrote; results and receipts are JSON-able values; the context is
a :class:`~cuaderno.tools.definition.ToolContext` of plain fields. :class:`AgentTools`, the
default, runs the agent's own ``@tool`` functions in this process, and :class:`TracedTools`
wraps it in an ``execute_tool`` span per run of a tool body (:mod:`cuaderno.telemetry`): the loop
body itself opens no span.

Under Temporal, a workflow plugs an executor whose ``invoke`` and ``lookup`` each run a tool
activity (tool name, arguments and context in, the JSON result out), its retry profile derived
from the tool's effect class, while ``info``, ``check`` and ``compensation`` stay in the workflow
(they read only the agent's declarations, deterministically).
"""

from __future__ import annotations

import inspect
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Required, TypedDict

from pydantic_core import to_jsonable_python

from cuaderno import telemetry
from cuaderno.plainjson import JSONObject, JSONValue, not_plain
from cuaderno.tools.definition import Tool, ToolContext

__all__ = ["AgentTools", "CompensationCall", "ToolExecutor", "ToolInfo", "TracedTools"]


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """What the loop's decisions read of a tool: static, from its declaration."""

    name: str
    effect_type: str
    """Names the effect in its effect key."""
    idempotent: bool
    """Running it twice has the effect of running it once: an unknown outcome is sent again."""
    has_lookup: bool
    """It can find an effect by its key: an unknown outcome is reconciled through :meth:`ToolExecutor.lookup`."""
    effect_free: bool = False
    """It only reads: a run of unknown outcome that fails when run again has simply failed."""


class CompensationCall(TypedDict, total=False):
    """The compensation a completed call declares, as journaled with its result (``compensation``)."""

    tool: Required[str]
    arguments: Required[JSONValue]
    """The compensating tool's arguments; ``None`` when they could not be worked out (``error`` says why)."""
    error: str


class ToolExecutor(Protocol):
    """Runs tools by name for the loop."""

    def names(self) -> list[str]:
        """Every tool's name, sorted (for the model, when it names one that does not exist)."""
        ...

    def info(self, name: str) -> ToolInfo | None:
        """The tool's declaration, or ``None`` if there is no such tool."""
        ...

    def check(self, name: str, arguments: JSONObject) -> None:
        """Raise :class:`~cuaderno.errors.ToolError` (``invalid_input``) if the arguments do not
        fit the tool's schema. Nothing runs."""
        ...

    def context_data(self, name: str, arguments: JSONObject) -> JSONObject:
        """Extra context for the tool and its lookup (the business id the tool declares)."""
        ...

    def compensation(self, name: str, arguments: JSONObject, value: Any) -> CompensationCall | None:
        """The compensation the tool declares for this completed call (``{"tool", "arguments"}``,
        or with ``"error"`` when its arguments cannot be worked out), or ``None``."""
        ...

    async def invoke(self, name: str, arguments: JSONObject, ctx: ToolContext) -> Any:
        """Run the tool once on arguments :meth:`check` accepted; return its JSON-able result.
        A :class:`~cuaderno.errors.ToolError` is a classified failure; anything else is a bug."""
        ...

    async def lookup(self, name: str, arguments: JSONObject, ctx: ToolContext) -> Any:
        """Ask the receiver whether the effect keyed ``ctx.effect_key`` happened: its JSON-able
        receipt, ``None`` when its absence is proven; raise when nobody can tell."""
        ...


class AgentTools:
    """The default executor: the agent's ``@tool`` functions, run in this process."""

    def __init__(self, tools: Mapping[str, Tool]) -> None:
        self.tools = tools
        self._info: dict[str, tuple[Tool, ToolInfo]] = {}
        # The arguments last checked and what validation made of them. Validating costs about as
        # much as the rest of a tool step's bookkeeping, and the loop checks a call's arguments
        # before its intent, then runs it (maybe more than once) on the same dict: it is
        # validated once. Keyed by identity (the dict itself is kept, so its id is never reused).
        self._checked: tuple[str, JSONObject, dict[str, object]] | None = None

    def names(self) -> list[str]:
        return sorted(self.tools)

    def info(self, name: str) -> ToolInfo | None:
        tool = self.tools.get(name)
        if tool is None:
            return None
        known = self._info.get(name)
        if known is None or known[0] is not tool:
            known = (tool, ToolInfo(name=tool.name, effect_type=tool.effect_type, idempotent=tool.idempotent,
                                    has_lookup=tool.lookup is not None, effect_free=tool.effect_free))
            self._info[name] = known
        return known[1]

    def check(self, name: str, arguments: JSONObject) -> None:
        self._kwargs(name, arguments)

    def _kwargs(self, name: str, arguments: JSONObject) -> dict[str, object]:
        checked = self._checked
        if checked is not None and checked[0] == name and checked[1] is arguments:
            return checked[2]
        kwargs = self.tools[name].validate(arguments)
        self._checked = (name, arguments, kwargs)
        return kwargs

    def context_data(self, name: str, arguments: JSONObject) -> JSONObject:
        business_id = self.tools[name].business_id
        return {"business_id": business_id(arguments)} if business_id else {}

    def compensation(self, name: str, arguments: JSONObject, value: Any) -> CompensationCall | None:
        declared = self.tools[name].compensation
        if declared is None:
            return None
        try:
            worked_out = to_jsonable_python(declared.arguments(arguments, value))
            if (problem := not_plain(worked_out)) is not None:  # would fail the result's write, after the effect
                raise ValueError(f"the compensation's arguments hold {problem}")
        except Exception as exc:
            return {"tool": declared.tool, "arguments": None, "error": f"{type(exc).__name__}: {exc}"}
        return {"tool": declared.tool, "arguments": worked_out}

    def invoke(self, name: str, arguments: JSONObject, ctx: ToolContext) -> Coroutine[Any, Any, Any]:
        # The tool's own coroutine, not one more around it: a coroutine frame per tool step is
        # measurable next to the rest of a step's bookkeeping.
        return self.tools[name].invoke(self._kwargs(name, arguments), ctx)

    async def lookup(self, name: str, arguments: JSONObject, ctx: ToolContext) -> Any:
        find = self.tools[name].lookup
        assert find is not None, "lookup is asked only of a tool whose info has_lookup"
        found = find(ctx, arguments)
        if inspect.isawaitable(found):
            found = await found
        return None if found is None else to_jsonable_python(found)


class TracedTools:
    """An executor with one ``execute_tool`` span around each run of a tool body."""

    def __init__(self, inner: ToolExecutor) -> None:
        self.inner = inner
        self.names, self.info, self.check = inner.names, inner.info, inner.check
        self.context_data, self.compensation, self.lookup = inner.context_data, inner.compensation, inner.lookup

    async def invoke(self, name: str, arguments: JSONObject, ctx: ToolContext) -> Any:
        with telemetry.tool_call(name, run_id=ctx.run_id, step_id=ctx.step_id, call_id=ctx.call_id) as span:
            value = await self.inner.invoke(name, arguments, ctx)
            span.ok()
        return value
