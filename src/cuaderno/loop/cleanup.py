"""Running the compensations a cancelled run scheduled.

Each compensation is its own action: step ``cleanupNN`` in the cancelled run's journal, its own
effect key (``compensation:<effect type>`` of the original step), its own policy decision, the
same write-ahead intent and the same replay rules as any tool step. Running ``compensate`` twice,
or again after a crash, does each compensation at most once (or stops on an uncertain one).
"""

from __future__ import annotations

import inspect
from typing import Any

from pydantic_core import to_jsonable_python

from cuaderno.errors import CuadernoError, RunNotFound, ToolError, UncertainEffect
from cuaderno.events import StepEvent
from cuaderno.journal.base import Checkpointer
from cuaderno.loop._state import effect_key
from cuaderno.loop.agent import Agent
from cuaderno.tools.definition import Tool, ToolContext

__all__ = ["compensate"]


async def compensate(agent: Agent, store: Checkpointer, run_id: str, *, tenant: str = "default") -> list[dict[str, Any]]:
    """Run the cleanup a cancelled run scheduled; return each compensation's journaled result.

    Raises:
        RunNotFound: no such run.
        CuadernoError: the run is not cancelled (only a cancellation schedules cleanup).
        UncertainEffect: a compensation started before and has no result, and its tool has no
            lookup that can settle it.
    """
    cp = store.checkpoint(run_id)
    if cp is None:
        raise RunNotFound(run_id)
    if cp.status != "cancelled":
        raise CuadernoError(f"run {run_id!r} is {cp.status}, not cancelled: it has no cleanup to run")
    journal = {(e.step_id, e.phase): e for e in store.load(run_id)}
    results = []
    for index, entry in enumerate((cp.outcome or {}).get("cleanup") or []):
        step_id = f"cleanup{index:02d}"
        done = journal.get((step_id, "result"))
        if done is None:
            done = await _one(agent, store, run_id, tenant, step_id, entry, journal.get((step_id, "intent")))
        results.append(done.payload)
    return results


async def _one(agent: Agent, store: Checkpointer, run_id: str, tenant: str, step_id: str, entry: dict[str, Any],
               intent: StepEvent | None) -> StepEvent:
    name, arguments = str(entry.get("tool")), entry.get("arguments")
    tool = agent.tools.get(name)

    def result(outcome: str, decision: str | None, **payload: Any) -> StepEvent:
        return store.append([StepEvent(run_id=run_id, step_id=step_id, phase="result", kind="tool", name=name,
                                       decision=decision, payload={"outcome": outcome, **payload})])[0]

    if tool is None or not isinstance(arguments, dict):
        error = ToolError(f"compensation {name!r} cannot run: unknown tool or no arguments ({entry.get('error')})")
        return result("error", None, error=error.to_json())
    ekey = effect_key(tenant, run_id, f"compensation:{tool.effect_type}",
                      {"for": entry.get("for_step"), "arguments": arguments}, agent.policy.version)
    ctx = ToolContext(run_id=run_id, step_id=step_id, tool=name, effect_key=ekey, tenant=tenant)
    if intent is not None and not tool.idempotent:
        found = await _lookup(tool, ctx, arguments)
        if found is None:
            evidence = {"tool": name, "arguments": arguments, "effect_key": ekey, "reason": "compensation in flight"}
            store.append([StepEvent(run_id=run_id, step_id=step_id, phase="uncertain", kind="tool", name=name,
                                    payload=evidence)])
            raise UncertainEffect(run_id, step_id, evidence)
        return result("ok", "allow", value=found, effect_key=ekey, counters={"reconciled": 1})
    if intent is None:
        verdict = agent.policy.decide(name, arguments)
        if verdict.decision != "allow":  # a compensation needs its own permission
            return result("denied", verdict.decision, reason=verdict.reason)
        store.append([StepEvent(run_id=run_id, step_id=step_id, phase="intent", kind="tool", name=name,
                                decision="allow", payload={"effect_key": ekey, "for_step": entry.get("for_step")})])
    try:
        value = await tool.invoke(tool.validate(arguments), ctx)
    except ToolError as err:
        return result("error", "allow", error=err.to_json(), effect_key=ekey)
    return result("ok", "allow", value=value, effect_key=ekey)


async def _lookup(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
    if tool.lookup is None:
        return None
    try:
        found = tool.lookup(ctx, arguments)
        if inspect.isawaitable(found):
            found = await found
    except Exception:
        return None
    return None if found is None else to_jsonable_python(found)
