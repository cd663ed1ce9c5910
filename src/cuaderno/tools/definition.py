"""Tools declared from typed Python functions.

``@tool`` reads the function's signature: the JSON schema the model sees comes from the type
hints (through pydantic), arguments are validated against it before the tool runs, and a
parameter annotated :class:`ToolContext` receives the run's identity instead of a model argument.

A tool is **not idempotent** unless it says so. That is the safe default: a non-idempotent tool
gets its intent committed to disk before its body runs, and an intent without a result on resume
is an :class:`~cuaderno.errors.UncertainEffect`, never a silent second execution.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints, overload

import pydantic

from cuaderno.errors import ToolArgumentsInvalid, UsageError
from cuaderno.fingerprint import fingerprint
from cuaderno.plainjson import JSONObject, JSONValue, journalable

__all__ = ["Compensation", "Lookup", "Tool", "ToolContext", "tool"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolContext:
    """What a tool may know about the step it runs in.

    ``effect_key`` is derived from the *intent* (tenant, task, effect type, canonical arguments,
    policy version), never from the attempt: every retry and every resume of the same intent sees
    the same key, so a receiving system that deduplicates by key applies the effect once.
    """

    run_id: str
    step_id: str
    tool: str
    effect_key: str
    attempt: int = 1
    tenant: str = "default"
    data: JSONObject = field(default_factory=dict[str, JSONValue])
    call_id: str | None = None
    """The model's id for this call; a compensation, which no model asked for, has its step id."""


Lookup = Callable[[ToolContext, JSONObject], Any]
"""A reconciliation lookup: given the context (with ``effect_key``) and the arguments, return the
recorded result if the effect exists, ``None`` if its absence is proven, or raise if unknown."""


@dataclass(frozen=True, slots=True)
class Compensation:
    """How to undo a completed effect if its run is cancelled: another tool, other arguments.

    The compensation is a separate action: it gets its own effect key, its own policy decision,
    and it can fail on its own. It is scheduled when the run is cancelled and runs only through
    :func:`cuaderno.compensate`.

    Attributes:
        tool: the name of the compensating tool (one of the agent's tools).
        arguments: ``(original_arguments, original_result) -> compensating tool's arguments``.
    """

    tool: str
    arguments: Callable[[JSONObject, Any], Mapping[str, object]]


class Tool:
    """A callable the model may ask for, with its schema and its side-effect class."""

    def __init__(self, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                 idempotent: bool = False, effect_type: str | None = None, lookup: Lookup | None = None,
                 business_id: Callable[[JSONObject], str] | None = None,
                 compensation: Compensation | None = None, effect_free: bool = False) -> None:
        self.fn = fn
        self.effect_free = effect_free
        """It only reads: running it changes nothing anywhere. Implies idempotent; an attempt of
        unknown outcome that fails when run again has simply failed (there was no effect to wonder
        about), where an idempotent tool with an effect stops uncertain."""
        self.compensation = compensation
        self.name = name or fn.__name__
        if not self.name.replace("_", "").replace("-", "").isalnum() or len(self.name) > 64:
            raise UsageError(f"tool name {self.name!r} must be 1-64 letters, digits, '_' or '-'")
        self.description = (description or inspect.getdoc(fn) or "").strip()
        self.idempotent = idempotent or effect_free
        self.effect_type = effect_type or self.name
        self.lookup = lookup
        self.business_id = business_id
        self.is_async = inspect.iscoroutinefunction(fn)
        self._ctx_param, self._model = _signature_model(fn, self.name)
        schema = self._model.model_json_schema()
        schema.pop("title", None)
        self.parameters: JSONObject = schema

    def schema(self) -> JSONObject:
        """The neutral tool schema sent to the model."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def schema_fingerprint(self) -> str:
        """Identifies this tool's contract; part of the run's capability version."""
        # effect_free enters only when set, so every tool declared before it keeps its fingerprint
        # (a changed fingerprint is a VersionMismatch for its runs).
        extra = {"effect_free": True} if self.effect_free else {}
        return fingerprint({**self.schema(), "idempotent": self.idempotent, "effect_type": self.effect_type, **extra})

    def validate(self, arguments: Mapping[str, object]) -> dict[str, object]:
        """Check arguments against the schema; return them as the function will receive them.

        Raises:
            ToolArgumentsInvalid: the arguments do not fit the schema (the tool does not run).
        """
        try:
            model = self._model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
            raise ToolArgumentsInvalid(f"arguments for {self.name!r} do not match its schema: "
                                       + "; ".join(f"{'.'.join(map(str, p['loc'])) or '(root)'}: {p['msg']}"
                                                   for p in problems), data={"errors": problems}) from None
        return {k: getattr(model, k) for k in type(model).model_fields}

    async def call(self, arguments: Mapping[str, object], ctx: ToolContext) -> Any:
        """Validate and run the tool; return its JSON-able result."""
        return await self.invoke(self.validate(arguments), ctx)

    async def invoke(self, kwargs: Mapping[str, object], ctx: ToolContext) -> Any:
        """Run the tool on arguments already returned by :meth:`validate`.

        Sync tools run inline on the event loop (no thread hop: a thread costs more than most
        tools); a tool that blocks for long should be ``async``.
        """
        kwargs = dict(kwargs)
        if self._ctx_param is not None:
            kwargs[self._ctx_param] = ctx
        if self.is_async:
            result = await self.fn(**kwargs)
        else:
            result = self.fn(**kwargs)
            if inspect.isawaitable(result):
                result = await result
        # A value the journal refuses is a bug of the tool (ToolResultInvalid): the loop journals
        # it as the step's evidence and ends the run failed, in one transaction.
        return journalable(result, run_id=ctx.run_id, step_id=ctx.step_id, tool=self.name)

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, idempotent={self.idempotent})"


def _signature_model(fn: Callable[..., Any], name: str) -> tuple[str | None, type[pydantic.BaseModel]]:
    sig = inspect.signature(fn)
    try:
        hints = get_type_hints(fn)
    except Exception as exc:
        raise UsageError(f"tool {name!r}: cannot resolve its type hints: {exc}") from exc
    ctx_param: str | None = None
    fields: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise UsageError(f"tool {name!r}: *args/**kwargs cannot be described to a model")
        annotation = hints.get(pname)
        if annotation is ToolContext:
            ctx_param = pname
            continue
        if annotation is None:
            raise UsageError(f"tool {name!r}: parameter {pname!r} needs a type hint (it becomes the schema)")
        default = ... if param.default is param.empty else param.default
        fields[pname] = (annotation, default)
    model = pydantic.create_model(
        f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)
    return ctx_param, model


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(*, name: str | None = None, description: str | None = None, idempotent: bool = False,
         effect_type: str | None = None, lookup: Lookup | None = None,
         business_id: Callable[[JSONObject], str] | None = None,
         compensation: Compensation | None = None, effect_free: bool = False) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None,
         idempotent: bool = False, effect_type: str | None = None, lookup: Lookup | None = None,
         business_id: Callable[[JSONObject], str] | None = None,
         compensation: Compensation | None = None, effect_free: bool = False) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool from a typed function: ``@tool`` or ``@tool(idempotent=True)``.

    Args:
        name: the name the model sees (default: the function's name).
        description: default: the docstring.
        idempotent: running it twice has the effect of running it once. Default ``False``.
        effect_type: names the effect in its effect key (default: the tool name).
        lookup: reconciliation: find an effect by its key when nobody knows if it happened.
        business_id: derive a business identifier from the arguments, for lookups.
        compensation: how to undo the effect if the run is cancelled (a separate action).
        effect_free: it only reads (implies ``idempotent``): a run of unknown outcome that fails
            when run again has simply failed, instead of stopping uncertain.
    """
    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, idempotent=idempotent, effect_type=effect_type,
                    lookup=lookup, business_id=business_id, compensation=compensation, effect_free=effect_free)

    if fn is not None:
        return wrap(fn)
    return wrap

