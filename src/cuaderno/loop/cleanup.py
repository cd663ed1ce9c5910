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

from cuaderno.cancellation import derived_cleanup
from cuaderno.errors import (
    CuadernoError,
    ErrorClass,
    ReplayDivergence,
    RunNotFound,
    ToolError,
    UncertainEffect,
    UsageError,
)
from cuaderno.events import StepEvent, cleanup_step_id, not_happened_since_sent, numbered
from cuaderno.journal.base import Checkpointer
from cuaderno.loop._state import effect_key, recorded_effect_key
from cuaderno.loop.agent import Agent
from cuaderno.loop.ownership import DEFAULT_OWNERSHIP, Ownership
from cuaderno.loop.runtime import DEFAULT_RUNTIME, Runtime
from cuaderno.tools.definition import Tool, ToolContext

__all__ = ["compensate"]


async def compensate(agent: Agent, store: Checkpointer, run_id: str, *, tenant: str | None = None,
                     runtime: Runtime = DEFAULT_RUNTIME,
                     ownership: Ownership = DEFAULT_OWNERSHIP) -> list[dict[str, Any]]:
    """Run the cleanup a cancelled run scheduled; return each compensation's journaled result.

    Args:
        tenant: the run's tenant (part of each compensation's effect key). By default the one
            the run started under; another one is refused.
        runtime, ownership: as a :class:`~cuaderno.loop.agent.Session`'s (default: the process's).

    Raises:
        RunNotFound: no such run.
        CuadernoError: the run is not cancelled (only a cancellation schedules cleanup).
        ReplayDivergence: ``tenant`` is not the run's.
        UncertainEffect: a compensation was sent and nobody can tell whether it happened (no
            lookup, or the lookup failed). The run stays cancelled; :func:`cuaderno.resolve`
            settles the step and ``compensate`` goes on.
        RunBusy: another live process (or loop of this process) is compensating the run.
    """
    cp = store.checkpoint(run_id)
    if cp is None:
        raise RunNotFound(run_id)
    if cp.status != "cancelled":
        raise CuadernoError(f"run {run_id!r} is {cp.status}, not cancelled: it has no cleanup to run")
    if tenant is not None and cp.tenant is not None and tenant != cp.tenant:
        raise ReplayDivergence(run_id, "run", f"tenant {cp.tenant!r}", f"tenant {tenant!r}")
    tenant = tenant or cp.tenant or "default"
    where, me = ownership.key(store, run_id), _Compensator()
    ownership.start(where, me, force=False)  # a loop of this process compensating it right now keeps it
    try:
        # So does a live process; a dead one is taken over.
        epoch = ownership.acquire(store, run_id, "compensate", force=False)
        try:
            ownership.took(where, me)
            # Read after the takeover: whatever the previous holder committed is visible.
            events = store.load(run_id)
            journal = {(e.step_id, e.phase): e for e in events}
            entries = [*((cp.outcome or {}).get("cleanup") or []), *_confirmed_since(events)]
            for entry in entries:
                _check(agent, entry)  # before anything is written: the wrong agent changes nothing
            results = []
            for index, entry in enumerate(entries):
                step_id = cleanup_step_id(index)
                done = journal.get((step_id, "result"))
                if done is None:
                    done = await _One(agent, store, epoch, run_id, tenant, step_id, journal, runtime).run(entry)
                results.append(done.payload)
            return results
        finally:
            ownership.release(store, run_id, epoch)
    finally:
        ownership.stop(where, me)


def _confirmed_since(events: list[StepEvent]) -> list[dict[str, Any]]:
    """Cleanup for effects a person confirmed (``resolve(happened=True)``) after the cancellation
    record was written: they were listed as uncertain then. Appended after the record's own
    entries, in journal order, so the step ids of those never move."""
    end = max((e.seq for e in events if e.kind == "run" and e.phase == "end"), default=None)
    if end is None:
        return []
    by_key = {(e.step_id, e.phase): e for e in events}
    return [derived_cleanup(ev, events, by_key) for ev in events
            if ev.seq > end and ev.kind == "tool" and ev.phase == "result" and ev.decision == "resolved"
            and not ev.step_id.startswith("cleanup") and ev.payload.get("outcome") == "ok"]


def _check(agent: Agent, entry: dict[str, Any]) -> None:
    """Refuse (writing nothing) an agent that cannot run this compensation: the next call, with
    the right agent, must still be able to."""
    name, arguments = _what(agent, entry)
    if name is None:
        return  # nothing to undo
    if name not in agent.tools:
        raise UsageError(f"the compensation for {entry.get('for_step')!r} needs tool {name!r}, which this agent "
                         "does not have; nothing was written (run compensate with the run's agent)")
    if not isinstance(arguments, dict):
        raise UsageError(f"the compensation for {entry.get('for_step')!r} has no usable arguments "
                         f"({entry.get('error') or 'its Compensation could not work them out'}); nothing was written")
    if agent.policy.decide(name, arguments).decision == "require_approval":
        raise UsageError(f"the policy asks a person to approve {name!r}, and a compensation runs only when "
                         "allowed or denied by the policy; nothing was written (run compensate with a policy "
                         "that decides it)")


class _Compensator:
    """Holds a cancelled run while its compensations run; it has no pending results."""

    def hand_over(self) -> None:
        pass


_MAX_SENDS = 3
"""Sends of one compensation in one ``compensate`` call (a lost reply, then a proven absence)."""
_MAX_RETRIES = 3
"""Retries of a compensation refused before it was sent (a 429), with a doubling wait."""


class _One:
    """One compensation: run it, or reconcile it and maybe send it again, with the same replay
    rules as any tool step (write-ahead intent, the key it was first sent with, lookup before
    any re-send, uncertain when nobody can know)."""

    def __init__(self, agent: Agent, store: Checkpointer, epoch: int, run_id: str, tenant: str, step_id: str,
                 journal: dict[tuple[str, str], StepEvent], runtime: Runtime) -> None:
        self.agent, self.store, self.epoch, self.run_id, self.runtime = agent, store, epoch, run_id, runtime
        self.tenant, self.step_id, self.journal = tenant, step_id, journal
        self.name = ""

    def write(self, phase: str, decision: str | None, payload: dict[str, Any]) -> StepEvent:
        ev = self.store.append([StepEvent(run_id=self.run_id, step_id=self.step_id, phase=phase, kind="tool",
                                          name=self.name, decision=decision, payload=payload)], epoch=self.epoch)[0]
        self.journal[(self.step_id, phase)] = ev
        return ev

    def result(self, outcome: str, decision: str | None, **payload: Any) -> StepEvent:
        return self.write("result", decision, {"outcome": outcome, **payload})

    async def run(self, entry: dict[str, Any]) -> StepEvent:
        name, arguments = _what(self.agent, entry)
        if name is None:
            # Settled by a person, and its tool declares no compensation: nothing to undo.
            self.name = str((entry.get("derive_from") or {}).get("tool"))
            return self.result("nothing_to_do", None, reason="the tool declares no compensation")
        self.name = name
        tool = self.agent.tools[name]  # _check refused, before anything was written, what cannot run
        assert isinstance(arguments, dict)
        intents = numbered(self.journal, self.step_id, "intent")
        # A compensation already sent keeps the key it was sent with (the policy version may differ now).
        ekey = (recorded_effect_key(intents[0]) if intents else None) or effect_key(
            self.tenant, self.run_id, f"compensation:{tool.effect_type}",
            {"for": entry.get("for_step"), "arguments": arguments}, self.agent.policy.version)
        ctx = ToolContext(run_id=self.run_id, step_id=self.step_id, tool=self.name, effect_key=ekey,
                          tenant=self.tenant)
        after: str | None = None
        if intents:
            reconciled = await self._reconcile(tool, ctx, arguments, intents)
            if isinstance(reconciled, StepEvent):
                return reconciled
            after = reconciled
        else:
            verdict = self.agent.policy.decide(self.name, arguments)
            if verdict.decision == "deny":  # a compensation needs its own permission
                return self.result("denied", verdict.decision, reason=verdict.reason)
        retries = 0
        for _ in range(_MAX_SENDS + _MAX_RETRIES):
            payload: dict[str, Any] = {"effect_key": ekey, "for_step": entry.get("for_step")}
            if after is not None:
                payload["after"] = after
            sent = len(numbered(self.journal, self.step_id, "intent"))
            self.write("intent" if sent == 0 else f"intent.{sent + 1}", "allow", payload)
            try:
                value = await tool.invoke(tool.validate(arguments), ctx)
            except ToolError as err:
                if err.error_class is ErrorClass.TRANSIENT and err.sent is False and retries < _MAX_RETRIES:
                    retries += 1  # refused before anything was sent: wait, send again (same key)
                    await self.runtime.sleep(0.1 * 2 ** retries)
                    after = "retry"
                    continue
                if err.error_class is not ErrorClass.AMBIGUOUS and after not in ("unknown",):
                    return self.result("error", "allow", error=err.to_json(), effect_key=ekey,
                                       counters=self._resends())
                # Sent, and nobody knows how it ended (a lost reply; or a re-send after an
                # unknown outcome that failed, which says nothing about the first send).
                found = await self._ask(tool, ctx, arguments, f"{err.error_class.value}: {err}")
                if isinstance(found, StepEvent):
                    return found
                after = "unknown" if tool.idempotent else "absent"
                continue
            return self.result("ok", "allow", value=value, effect_key=ekey, counters=self._resends())
        self._uncertain(arguments, ekey, "re-send bound reached")

    async def _reconcile(self, tool: Tool, ctx: ToolContext, arguments: dict[str, Any],
                         intents: list[StepEvent]) -> str | StepEvent:
        """Sent before, never recorded how it ended. Returns why it is sent again, or its result."""
        if not_happened_since_sent(self.journal, self.step_id):
            return "not_happened"
        if tool.idempotent:
            return "unknown"
        found = await self._ask(tool, ctx, arguments, "sent before, never recorded how it ended",
                                first=not self._uncertain_since_sent(intents))
        return found if isinstance(found, StepEvent) else "absent"

    async def _ask(self, tool: Tool, ctx: ToolContext, arguments: dict[str, Any], why: str, *,
                   first: bool = True) -> StepEvent | None:
        """Ask the receiver through the tool's lookup: the result if found, ``None`` if absence
        is proven. An idempotent tool needs no answer (``None``: send it again, same key)."""
        if tool.idempotent:
            return None
        if tool.lookup is None:
            if not first:  # found uncertain already, and nothing can answer: say so, write nothing
                raise UncertainEffect(self.run_id, self.step_id, dict(self._latest_uncertain()))
            self._uncertain(arguments, ctx.effect_key, f"{why}; no lookup for this tool")
        try:
            found = await _lookup(tool, ctx, arguments)
        except Exception as exc:
            self._uncertain(arguments, ctx.effect_key, f"{why}; lookup failed: {exc!r}")
        if found is None:
            return None
        return self.result("ok", "allow", value=found, effect_key=ctx.effect_key, counters={"reconciled": 1})

    def _resends(self) -> dict[str, int]:
        """Every send after the first (a retry, a re-send after a lost reply or a proven
        absence), counted as the loop counts its own: ``retries``."""
        extra = len(numbered(self.journal, self.step_id, "intent")) - 1
        return {"retries": extra} if extra > 0 else {}

    def _uncertain_since_sent(self, intents: list[StepEvent]) -> bool:
        """Whether it was found uncertain since it was last sent (without a lookup, asking again
        can only say the same)."""
        tries = numbered(self.journal, self.step_id, "uncertain")
        return bool(tries) and tries[-1].seq > intents[-1].seq

    def _latest_uncertain(self) -> dict[str, Any]:
        tries = numbered(self.journal, self.step_id, "uncertain")
        return tries[-1].payload if tries else {}

    def _uncertain(self, arguments: dict[str, Any], ekey: str, reason: str) -> NoReturn:
        """Nobody knows whether the compensation happened: journal the evidence (each try its own
        event) and stop. The run stays cancelled; ``resolve`` settles the step, then
        ``compensate`` goes on."""
        tries = len(numbered(self.journal, self.step_id, "uncertain"))
        evidence = {"tool": self.name, "arguments": arguments, "effect_key": ekey, "reason": reason}
        self.write("uncertain" if tries == 0 else f"uncertain.{tries + 1}", None, evidence)
        raise UncertainEffect(self.run_id, self.step_id, evidence)


def _what(agent: Agent, entry: dict[str, Any]) -> tuple[str | None, Any]:
    """The compensation's tool and arguments. An entry for an effect a person settled carries
    what the original call was (``derive_from``): its compensation is worked out here, from the
    agent's declaration (``None``: the tool declares none)."""
    origin = entry.get("derive_from")
    if not isinstance(origin, dict):
        return entry.get("tool"), entry.get("arguments")
    tool = agent.tools.get(str(origin.get("tool")))
    if tool is None:
        return str(origin.get("tool")), None
    if tool.compensation is None:
        return None, None
    try:
        arguments = to_jsonable_python(tool.compensation.arguments(origin.get("arguments") or {}, origin.get("value")))
    except Exception:
        return tool.compensation.tool, None
    return tool.compensation.tool, arguments


async def _lookup(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
    """The receipt the tool's lookup finds (``None``: absence proven)."""
    assert tool.lookup is not None
    found = tool.lookup(ctx, arguments)
    if inspect.isawaitable(found):
        found = await found
    return None if found is None else to_jsonable_python(found)
