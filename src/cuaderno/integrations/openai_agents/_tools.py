"""The SDK's function tools, put through the effect protocol (:class:`cuaderno.durable.Effect`).

Each call of a wrapped tool is one effect step, named ``tNNNN.tool.<call id>`` after the model
step that asked for it and the model's call id (both journaled, so a resume names it the same,
and parallel calls of one turn get distinct steps). Its effect key is derived from the tenant,
the run, the step and the arguments (:func:`cuaderno.durable.effect.effect_key`): nothing that
changes between processes, so every send, lookup and resume of the step carries the same key.

Failures are handled the SDK's way, with one exception:

- a tool that raises :class:`~cuaderno.errors.ToolError` classifies its failure: ``ambiguous``
  (sent, reply lost) is an unknown outcome, settled by the declared effect class (re-sent, looked
  up, or the run stops ``needs_human``); any other class is the step's result, and the model is
  told it through the tool's failure function, as the SDK tells it any failure;
- any other exception goes to the tool's ``failure_error_function`` (the SDK's default tells the
  model "An error occurred..."): the text is the step's result, journaled, told the same way on
  every replay. A tool declared with ``failure_error_function=None`` raises instead: the step's
  result is a ``bug`` and the run fails (the SDK's behaviour: the run raises).

What the model receives is always what the journal holds (the value as plain JSON), on the first
run as on a replay: the conversation cannot differ between the two.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from agents.run_context import RunContextWrapper
from agents.tool import (
    FunctionTool,
    maybe_invoke_function_tool_failure_error_function,
    set_function_tool_failure_error_function,
)
from agents.tool_context import ToolContext

from cuaderno import telemetry
from cuaderno.durable import Approval, Effect
from cuaderno.durable.effect import effect_key
from cuaderno.errors import ReplayDivergence, ToolError
from cuaderno.fingerprint import fingerprint
from cuaderno.integrations._compensate import scheduled
from cuaderno.integrations.openai_agents._effects import EffectCall, ToolEffect, enter, leave
from cuaderno.integrations.openai_agents._model import plain
from cuaderno.integrations.openai_agents._state import POLICY_VERSION, RunShared

__all__ = ["arguments_of", "call_fingerprint", "tool_step_id", "wrap_tool"]


def tool_step_id(turn: int, call_id: str) -> str:
    """The step of the tool call ``call_id`` the model asked for at model step ``turn``."""
    return f"t{turn:04d}.tool.{call_id}"


def arguments_of(raw: str) -> dict[str, Any]:
    """The call's arguments as the journal keeps them (a non-object kept whole under ``_raw``)."""
    try:
        args = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {"_raw": raw}
    return args if isinstance(args, dict) else {"_raw": raw}


def call_fingerprint(name: str, arguments: dict[str, Any]) -> str:
    """The fingerprint an approval binds and every intent and result of the step carries."""
    return fingerprint({"name": name, "arguments": arguments})


async def _told(tool: FunctionTool, ctx: RunContextWrapper[Any], error: Exception) -> str | None:
    """What the SDK would tell the model about ``error`` (the tool's failure function), or
    ``None`` when the tool has none (the SDK raises)."""
    told = await maybe_invoke_function_tool_failure_error_function(function_tool=tool, context=ctx, error=error)
    return None if told is None else str(told)


def wrap_tool(tool: FunctionTool, effect: ToolEffect, shared: RunShared) -> FunctionTool:
    """A copy of ``tool`` whose every call is an effect step of the run (module docstring)."""
    raw = copy.copy(tool)
    set_function_tool_failure_error_function(raw, None)  # failures reach the wrapper, classified here
    name = tool.name

    async def invoke(ctx: ToolContext[Any], input: str) -> Any:
        log = shared.log
        step_id = tool_step_id(shared.turn, ctx.tool_call_id)
        args = arguments_of(input)
        args_fp = call_fingerprint(name, args)
        recorded = log.get(step_id, "result") or log.get(step_id, "intent")
        if recorded is not None and recorded.fingerprint != args_fp:
            raise ReplayDivergence(shared.run_id, step_id, f"{name} {recorded.fingerprint}", f"{name} {args_fp}")
        approval = Approval(log, step_id, name, args, args_fp)
        if approval.requested():  # a person was asked: it runs only with their approval of exactly these arguments
            approval.require_approved()
        result = log.get(step_id, "result")
        if result is not None:
            return await _answer(tool, ctx, result.payload)
        key = effect_key(shared.tenant, f"{shared.run_id}/{step_id}", name, args, POLICY_VERSION)

        def call(attempt: int) -> EffectCall:
            return EffectCall(key=eff.key, run_id=shared.run_id, step_id=step_id, tool=name, arguments=args,
                              attempt=attempt)

        async def body(attempt: int) -> Any:
            token = enter(call(attempt))
            try:
                with telemetry.tool_call(name, run_id=shared.run_id, step_id=step_id, call_id=ctx.tool_call_id):
                    value = await raw.on_invoke_tool(ctx, input)
            except ToolError:
                raise
            except Exception as exc:
                told = await _told(tool, ctx, exc)
                if told is None:
                    raise
                return told
            finally:
                leave(token)
            return plain(value)

        async def ask(attempt: int) -> Any:
            assert effect.lookup is not None
            found = await effect.lookup(call(attempt))
            return None if found is None else plain(found)

        eff = Effect(log=log, step_id=step_id, tool=name, arguments=args, fingerprint=args_fp, key=key, body=body,
                     lookup=ask if effect.kind == "lookup" else None,
                     idempotent=effect.kind in ("idempotent", "effect_free"), effect_free=effect.kind == "effect_free",
                     policy_version=POLICY_VERSION, retry=shared.retry, sleep=asyncio.sleep,
                     compensation=scheduled(shared.compensations, name, args))
        async with shared.tool_calls.admit(shared.budget, log, name, step_id):  # within the run's tool bounds
            settled = await eff.run()
        log.commit()  # tool.K6 inside its transaction, tool.K7 after (the journal log passes them)
        return await _answer(tool, ctx, settled.payload)

    wrapped = copy.copy(tool)
    wrapped.on_invoke_tool = invoke
    return wrapped


async def _answer(tool: FunctionTool, ctx: RunContextWrapper[Any], payload: dict[str, Any]) -> Any:
    """What the model is told, from the journaled result only (the same on every replay)."""
    outcome = payload.get("outcome")
    if outcome == "ok":
        return payload.get("value")
    if outcome == "error":
        error = payload.get("error") or {}
        message = str(error.get("message") or "the tool failed")
        told = await _told(tool, ctx, ToolError(message))
        return told if told is not None else message
    return str(payload.get("reason") or f"the call was {outcome}")
