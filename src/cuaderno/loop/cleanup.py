"""Running the compensations a cancelled run scheduled.

Each compensation is its own action: step ``cleanupNN`` in the cancelled run's journal, its own
effect key (``compensation:<effect type>`` of the original step), its own policy decision, the
same write-ahead intent and the same replay rules as any tool step. Running ``compensate`` twice,
or again after a crash, does each compensation at most once (or stops on an uncertain one).

Running the compensations is running the run: ``compensate`` takes it over first (fencing epoch,
:class:`~cuaderno.errors.RunBusy` while another live process or loop compensates it), so two
callers can never both find a compensation not started and both run its body.
"""

from __future__ import annotations

import inspect
from typing import Any, NoReturn

from pydantic_core import to_jsonable_python

from cuaderno import _holds
from cuaderno.errors import CuadernoError, RunNotFound, ToolError, UncertainEffect
from cuaderno.events import StepEvent, cleanup_step_id
from cuaderno.journal.base import Checkpointer
from cuaderno.loop._state import effect_key, recorded_effect_key
from cuaderno.loop.agent import Agent
from cuaderno.tools.definition import Tool, ToolContext

__all__ = ["compensate"]


async def compensate(agent: Agent, store: Checkpointer, run_id: str, *, tenant: str = "default") -> list[dict[str, Any]]:
    """Run the cleanup a cancelled run scheduled; return each compensation's journaled result.

    Raises:
        RunNotFound: no such run.
        CuadernoError: the run is not cancelled (only a cancellation schedules cleanup).
        UncertainEffect: a compensation started before and has no result, and nothing can
            settle it (no lookup, or the lookup failed). The run stays cancelled;
            :func:`cuaderno.resolve` settles the step and ``compensate`` goes on.
        RunBusy: another live process (or loop of this process) is compensating the run.
    """
    cp = store.checkpoint(run_id)
    if cp is None:
        raise RunNotFound(run_id)
    if cp.status != "cancelled":
        raise CuadernoError(f"run {run_id!r} is {cp.status}, not cancelled: it has no cleanup to run")
    where, me = _holds.key(store, run_id), _Compensator()
    _holds.start(where, me, force=False)  # a loop of this process compensating it right now keeps it
    try:
        epoch = store.acquire(run_id, "compensate")  # so does a live process; a dead one is taken over
        try:
            _holds.took(where, me)
            # Read after the takeover: whatever the previous holder committed is visible.
            journal = {(e.step_id, e.phase): e for e in store.load(run_id)}
            results = []
            for index, entry in enumerate((cp.outcome or {}).get("cleanup") or []):
                step_id = cleanup_step_id(index)
                done = journal.get((step_id, "result"))
                if done is None:
                    done = await _one(agent, store, epoch, run_id, tenant, step_id, entry, journal)
                results.append(done.payload)
            return results
        finally:
            store.release(run_id, epoch)
    finally:
        _holds.stop(where, me)


class _Compensator:
    """Holds a cancelled run while its compensations run; it has no pending results."""

    def hand_over(self) -> None:
        pass


async def _one(agent: Agent, store: Checkpointer, epoch: int, run_id: str, tenant: str, step_id: str,
               entry: dict[str, Any], journal: dict[tuple[str, str], StepEvent]) -> StepEvent:
    """Run (or reconcile, then maybe re-send) one compensation; returns its journaled result."""
    name, arguments = str(entry.get("tool")), entry.get("arguments")
    tool = agent.tools.get(name)

    def write(phase: str, decision: str | None, payload: dict[str, Any]) -> StepEvent:
        return store.append([StepEvent(run_id=run_id, step_id=step_id, phase=phase, kind="tool", name=name,
                                       decision=decision, payload=payload)], epoch=epoch)[0]

    def result(outcome: str, decision: str | None, **payload: Any) -> StepEvent:
        return write("result", decision, {"outcome": outcome, **payload})

    if tool is None or not isinstance(arguments, dict):
        error = ToolError(f"compensation {name!r} cannot run: unknown tool or no arguments ({entry.get('error')})")
        return result("error", None, error=error.to_json())
    intents = _numbered(journal, step_id, "intent")
    # A compensation already sent keeps the key it was sent with (the policy version may differ now).
    ekey = (recorded_effect_key(intents[0]) if intents else None) or effect_key(
        tenant, run_id, f"compensation:{tool.effect_type}", {"for": entry.get("for_step"), "arguments": arguments},
        agent.policy.version)
    ctx = ToolContext(run_id=run_id, step_id=step_id, tool=name, effect_key=ekey, tenant=tenant)
    after: str | None = None
    if intents:
        # Sent before, never recorded how it ended: the same rules as any tool step.
        resolutions = _numbered(journal, step_id, "resolution")
        if resolutions and resolutions[-1].decision == "not_happened" and resolutions[-1].seq > intents[-1].seq:
            after = "not_happened"  # a person established it did not happen, and nothing was sent since
        elif tool.idempotent:
            after = "unknown"
        else:
            try:
                found = await _lookup(tool, ctx, arguments)
            except Exception as exc:
                _uncertain(write, journal, step_id, name, arguments, ekey, f"lookup failed: {exc!r}")
            if found is not None:
                return result("ok", "allow", value=found, effect_key=ekey, counters={"reconciled": 1})
            after = "absent"  # absence proven: the only case where sending again is safe
    else:
        verdict = agent.policy.decide(name, arguments)
        if verdict.decision != "allow":  # a compensation needs its own permission
            return result("denied", verdict.decision, reason=verdict.reason)
    payload: dict[str, Any] = {"effect_key": ekey, "for_step": entry.get("for_step")}
    if after is not None:
        payload["after"] = after
    write("intent" if not intents else f"intent.{len(intents) + 1}", "allow", payload)
    try:
        value = await tool.invoke(tool.validate(arguments), ctx)
    except ToolError as err:
        return result("error", "allow", error=err.to_json(), effect_key=ekey)
    return result("ok", "allow", value=value, effect_key=ekey)


def _numbered(journal: dict[tuple[str, str], StepEvent], step_id: str, phase: str) -> list[StepEvent]:
    """A step's ``phase``, ``phase.2``, ``phase.3``... events, in order."""
    out: list[StepEvent] = []
    while (ev := journal.get((step_id, phase if not out else f"{phase}.{len(out) + 1}"))) is not None:
        out.append(ev)
    return out


def _uncertain(write: Any, journal: dict[tuple[str, str], StepEvent], step_id: str, name: str,
               arguments: dict[str, Any], ekey: str, reason: str) -> NoReturn:
    """Nobody knows whether the compensation happened: journal the evidence (each try its own
    event) and stop. The run stays cancelled; ``resolve`` settles the step, then ``compensate``
    goes on."""
    tries = len(_numbered(journal, step_id, "uncertain"))
    evidence = {"tool": name, "arguments": arguments, "effect_key": ekey, "reason": reason}
    ev = write("uncertain" if tries == 0 else f"uncertain.{tries + 1}", None, evidence)
    raise UncertainEffect(ev.run_id, step_id, evidence)


async def _lookup(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
    """The receipt the tool's lookup finds (``None``: absence proven). Raises when there is no
    lookup or it failed: then nobody knows."""
    if tool.lookup is None:
        raise LookupError("no lookup for this tool")
    found = tool.lookup(ctx, arguments)
    if inspect.isawaitable(found):
        found = await found
    return None if found is None else to_jsonable_python(found)
