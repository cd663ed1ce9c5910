"""Every tool call of a wrapped agent through the effect protocol (:class:`Effect`).

The agent's own toolset still validates the arguments and calls the function (with its
``RunContext``); this wrapper journals the call around it: a call whose result is journaled is
answered from the journal (the function is not called again); one never started runs after its
intent commits; one started and not finished is settled by the tool's declared effect class
(:mod:`._effects`), or stops the run ``needs_human``.

A tool whose result comes from outside the agent (Pydantic AI's external deferred tools: a tool
that raises ``CallDeferred``, or one of an ``ExternalToolset``) becomes a step waiting for an
external result: its intent is journaled, then an ``uncertain`` record whose reason says it waits
for an external result (``external: true``, with the call's ``metadata``), and the run stops
``needs_human`` (:class:`~cuaderno.errors.UncertainEffect`). The result is given with ``cuaderno
resolve RUN STEP --happened --result JSON`` (or :func:`cuaderno.resolve`): journaled as the step's
result, bound to the fingerprint of the call's exact arguments, and handed to the agent as the
tool's return value by the next run of the run id (the tool itself is not called again).

What replay needs from the journaled result (beyond :mod:`cuaderno.durable.effect`'s own):
``value``, the tool's return value as JSON: the agent is handed that same JSON on every pass,
live or replayed, so the model sees one answer; ``error.data.model_retry``: the tool asked the
model to try again (``ModelRetry``), which replay raises again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic_ai.exceptions import CallDeferred, ModelRetry
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import PydanticSerializationError, to_jsonable_python

from cuaderno import telemetry
from cuaderno.durable.approval import Approval
from cuaderno.durable.effect import BodyBug, Effect, effect_key, stage_uncertain
from cuaderno.errors import ApprovalMismatch, ErrorClass, ReplayDivergence, ToolError, ToolResultInvalid
from cuaderno.fingerprint import fingerprint
from cuaderno.integrations._compensate import scheduled
from cuaderno.integrations.pydantic_ai._effects import _EFFECT_KEY, Lookup, effect_of
from cuaderno.integrations.pydantic_ai._state import RunState

__all__ = ["EFFECT_VERSION", "EXTERNAL", "JournaledToolset", "ToolBug", "arguments_fingerprint"]

EFFECT_VERSION = "pydantic-ai/1"
"""The rules the effect keys are derived under (the ``policy_version`` part of the key)."""


class ToolBug(Exception):
    """A tool raised something it did not classify (not a ``ToolError``, not ``ModelRetry``): its
    result (``error``, class ``bug``) is journaled; the agent ends the run ``failed`` and raises
    :attr:`cause`, as cuaderno's own loop does with a tool's bug."""

    def __init__(self, step_id: str, tool: str, cause: Exception) -> None:
        super().__init__(f"tool {tool!r} at step {step_id!r} raised {type(cause).__name__}: {cause}")
        self.step_id, self.tool, self.cause = step_id, tool, cause


def arguments_fingerprint(tool: str, arguments: Any) -> str:
    """What an approval and an effect are bound to: the tool and its exact arguments (as JSON)."""
    return fingerprint({"name": tool, "arguments": to_jsonable_python(arguments, fallback=repr)})


EXTERNAL = "waiting for an external result (pydantic-ai deferred tool): give it with cuaderno resolve --happened --result"
"""The reason an external call's ``uncertain`` record gives (``cuaderno show`` prints it)."""


class _Deferred(BaseException):
    """The call's result comes from outside (a tool raised ``CallDeferred``, or an external tool
    was called). Not an outcome of the body: a BaseException, so the effect protocol stages no
    result for it; :meth:`JournaledToolset.call_tool` journals the wait instead."""

    def __init__(self, metadata: Any) -> None:
        super().__init__("deferred")
        self.metadata = metadata


@dataclass
class JournaledToolset(WrapperToolset[Any]):
    """The agent's assembled toolset, each call journaled (see the module docstring)."""

    state: RunState | None = None
    external: set[str] = field(default_factory=set[str])
    """The tools of the wrapped toolset declared external: offered to the framework as function
    tools, so that their calls reach :meth:`call_tool` and wait in the journal."""

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await super().get_tools(ctx)
        for name, tool in list(tools.items()):
            if tool.tool_def.kind == "external":
                self.external.add(name)
                tools[name] = replace(tool, tool_def=replace(tool.tool_def, kind="function"))
        return tools

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        state = self.state
        assert state is not None, "JournaledToolset is built with its run's state"
        log = state.log
        step_id = state.tool_step(ctx.tool_call_id)
        arguments = to_jsonable_python(tool_args, fallback=repr)
        args_fp = arguments_fingerprint(name, tool_args)
        recorded = log.get(step_id, "result")
        if recorded is not None:
            if recorded.name != name or (recorded.fingerprint is not None and recorded.fingerprint != args_fp):
                raise ReplayDivergence(state.run_id, step_id, f"{recorded.name} {recorded.fingerprint}",
                                       f"{name} {args_fp}")
            return _answer(recorded.payload)
        if tool.tool_def.kind == "unapproved":
            _check_approved(state, step_id, name, arguments, args_fp, approved=ctx.tool_call_approved)
        declared = effect_of(state.effects, name)

        async def body(attempt: int) -> Any:
            if name in self.external:
                raise _Deferred(None)  # nothing here runs it: its result comes from outside
            token = _EFFECT_KEY.set(effect.key)
            try:
                with telemetry.tool_call(name, run_id=state.run_id, step_id=step_id, call_id=ctx.tool_call_id):
                    value = await self.wrapped.call_tool(name, tool_args, ctx, tool)
            except CallDeferred as deferred:
                raise _Deferred(deferred.metadata) from None
            except ModelRetry as retry:
                # The tool asks the model to try again: a classified outcome, journaled and
                # raised again on replay (the model is told the same thing on every pass).
                raise ToolError(str(retry.message), error_class=ErrorClass.INVALID_INPUT, sent=False,
                                data={"model_retry": True}) from retry
            finally:
                _EFFECT_KEY.reset(token)
            try:
                return to_jsonable_python(value)
            except PydanticSerializationError as exc:
                raise ToolResultInvalid(state.run_id, step_id, name, f"a value the journal cannot hold: {exc}") from exc

        async def lookup(attempt: int) -> Any:
            assert isinstance(declared, Lookup)
            return await declared.find(effect.key, dict(arguments))

        effect = Effect(log=log, step_id=step_id, tool=name, arguments=arguments, fingerprint=args_fp,
                        key=effect_key(state.tenant, f"{state.run_id}/{step_id}", name, arguments, EFFECT_VERSION),
                        body=body, lookup=lookup if isinstance(declared, Lookup) else None,
                        idempotent=declared in ("idempotent", "effect_free"), effect_free=declared == "effect_free",
                        decision="approved" if tool.tool_def.kind == "unapproved" else None,
                        compensation=scheduled(state.compensations, name, arguments),
                        policy_version=EFFECT_VERSION, retry=state.retry, sleep=asyncio.sleep, rng=state.rng)
        try:
            async with state.tool_calls.admit(state.budget, log, name, step_id):  # within the run's tool bounds
                settled = await effect.run()
        except _Deferred as deferred:
            # Its intent is journaled; the result comes from outside: say so, and stop the run
            # for it (UncertainEffect). A resolve with the result lets the next run go on.
            stage_uncertain(log, step_id, name, arguments, effect.key,
                            {"reason": EXTERNAL, "external": True,
                             "metadata": to_jsonable_python(deferred.metadata, fallback=repr)})
        except BodyBug as bug:
            log.commit()  # the bug's result is evidence: journaled before the run fails with it
            raise ToolBug(step_id, name, bug.cause) from bug.cause
        log.commit()  # tool.K6 inside its transaction, tool.K7 after (the journal log passes them)
        return _answer(settled.payload)


def _check_approved(state: RunState, step_id: str, tool: str, arguments: Any, args_fp: str, *,
                    approved: bool) -> None:
    """Run a tool that requires approval only with a person's decision journaled for exactly these
    arguments (the framework's ``tool_call_approved`` alone is a flag anyone may pass)."""
    if not approved:
        raise ApprovalMismatch(f"run {state.run_id!r} step {step_id!r}: {tool} requires approval and the agent "
                               "ran it without one; nothing ran")
    Approval(state.log, step_id, tool, arguments, args_fp).require_approved()


def _answer(payload: dict[str, Any]) -> Any:
    """What the agent is told from a journaled result (the same on every pass)."""
    if payload.get("outcome") == "ok":
        return payload.get("value")
    error = payload.get("error") or {}
    message = str(error.get("message") or payload.get("reason") or "the tool call failed")
    if (error.get("data") or {}).get("model_retry"):
        raise ModelRetry(message)
    return f"tool failed ({error.get('error_class', payload.get('outcome'))}): {message}"
