"""The agent's guardrails, each run journaled as an effect-free step.

A guardrail is a function the SDK runs beside the agent (input guardrails, on the first turn) or
on its final output (output guardrails); it often asks a model itself (an agent run inside the
guardrail). Left alone, a resume would run it again: paid again, and free to decide otherwise, so
the replayed run could trip where the first did not. Wrapped, each call is an effect-free step of
the run (:class:`cuaderno.durable.Effect`): its output is journaled once and a resume hands back
the journaled output without calling the function (a call in flight at a crash runs again: it
only reads).

Step ids: ``guard.in.NN.<name>`` and ``guard.out.NN.<name>``, ``NN`` counting the calls of that
guardrail in one pass over the run. Not the model step's number: an input guardrail runs in
parallel with the first model call, and on a resume that call answers from the journal at once,
so which of the two starts first is not stable; the SDK's order of guardrail calls is.

What replay needs from the journaled result (``value``): ``tripwire_triggered``, the decision,
and ``output_info`` as plain JSON (a pydantic model is dumped: a resume hands the guardrail's
caller the JSON form, not the model instance).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

from agents import GuardrailFunctionOutput, InputGuardrail, OutputGuardrail

from cuaderno.durable import Effect
from cuaderno.durable.effect import effect_key
from cuaderno.fingerprint import fingerprint
from cuaderno.integrations.openai_agents._model import jsonable
from cuaderno.integrations.openai_agents._state import POLICY_VERSION, RunShared

__all__ = ["journaled_input_guardrail", "journaled_output_guardrail"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def journaled_input_guardrail(guard: InputGuardrail[Any], shared: RunShared) -> InputGuardrail[Any]:
    """``guard`` with each call journaled (module docstring)."""
    return dataclasses.replace(guard, guardrail_function=_journaled("in", guard.get_name(), guard.guardrail_function,
                                                                     shared), name=guard.get_name())


def journaled_output_guardrail(guard: OutputGuardrail[Any], shared: RunShared) -> OutputGuardrail[Any]:
    """``guard`` with each call journaled (module docstring)."""
    return dataclasses.replace(guard, guardrail_function=_journaled("out", guard.get_name(), guard.guardrail_function,
                                                                     shared), name=guard.get_name())


def _journaled(kind: str, name: str, function: Any, shared: RunShared) -> Any:
    safe = _UNSAFE.sub("_", name)[:64] or "guardrail"
    tool = f"guardrail:{safe}"

    async def call(context: Any, agent: Any, value: Any) -> GuardrailFunctionOutput:
        n = shared.guards.get((kind, safe), 0)
        shared.guards[(kind, safe)] = n + 1
        step_id = f"guard.{kind}.{n:02d}.{safe}"
        # What it judged: the input (or final output) it was given, by fingerprint only (the
        # whole conversation would be journaled again with every guardrail).
        arguments = {"agent": getattr(agent, "name", None), "judged": fingerprint({"value": jsonable(value)})}
        args_fp = fingerprint({"guardrail": tool, **arguments})
        log = shared.log
        result = log.get(step_id, "result")
        if result is None:

            async def body(attempt: int) -> Any:
                out = function(context, agent, value)
                if asyncio.iscoroutine(out) or isinstance(out, asyncio.Future):
                    out = await out
                return {"tripwire_triggered": bool(out.tripwire_triggered), "output_info": jsonable(out.output_info)}

            key = effect_key(shared.tenant, f"{shared.run_id}/{step_id}", tool, arguments, POLICY_VERSION)
            settled = await Effect(log=log, step_id=step_id, tool=tool, arguments=arguments, fingerprint=args_fp,
                                   key=key, body=body, idempotent=True, effect_free=True,
                                   policy_version=POLICY_VERSION, retry=shared.retry, sleep=asyncio.sleep).run()
            log.commit()  # tool.K6 inside its transaction, tool.K7 after
            payload = settled.payload
        else:
            payload = result.payload
        judged = payload.get("value")
        judged = judged if isinstance(judged, dict) else {}
        return GuardrailFunctionOutput(output_info=judged.get("output_info"),
                                       tripwire_triggered=bool(judged.get("tripwire_triggered")))

    return call
