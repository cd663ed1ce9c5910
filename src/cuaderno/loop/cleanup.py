"""Running the compensations a cancelled run scheduled.

Each compensation is its own action: step ``cleanupNN`` in the cancelled run's journal, its own
effect key (``compensation:<effect type>`` of the original step), its own policy decision. It
runs through the loop's own tool-step state machine (:meth:`ToolSteps._tool_step
<cuaderno.loop._tool_steps.ToolSteps._tool_step>`): the same write-ahead intent, crash points,
retry bounds, backoff (from the session's runtime), reconciliation, telemetry and replay rules
as any tool step. Running ``compensate`` twice, or again after a crash, does each compensation
at most once (or stops on an uncertain one).

Running the compensations is running the run: ``compensate`` takes it over first (fencing epoch,
:class:`~cuaderno.errors.RunBusy` while another live process or loop compensates it), so two
callers can never both find a compensation not started and both run its body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

from cuaderno.cancellation import confirmed_since
from cuaderno.durable.effect import result_payload, stage_result
from cuaderno.errors import (
    CuadernoError,
    ErrorClass,
    GatewayError,
    ReplayDivergence,
    RunNotFound,
    UncertainEffect,
    UsageError,
)
from cuaderno.events import StepEvent, cleanup_step_id, not_happened_since_sent, numbered
from cuaderno.events.payloads import ToolResult, view
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import ModelRequest, ModelResponse, ToolCall
from cuaderno.journal.base import Checkpointer
from cuaderno.loop._log import RunLog
from cuaderno.loop._state import effect_key, new_state
from cuaderno.loop._tool_steps import ToolSteps
from cuaderno.loop.agent import Agent, RetryPolicy, Session
from cuaderno.loop.executor import AgentTools, ToolExecutor, ToolInfo, TracedTools
from cuaderno.loop.ownership import Ownership, ProcessOwnership
from cuaderno.loop.runtime import DEFAULT_RUNTIME, Runtime

__all__ = ["compensate"]


async def compensate(agent: Agent, store: Checkpointer, run_id: str, *, tenant: str | None = None,
                     runtime: Runtime = DEFAULT_RUNTIME, ownership: Ownership | None = None,
                     tools: ToolExecutor | None = None, retry: RetryPolicy | None = None) -> list[ToolResult]:
    """Run the cleanup a cancelled run scheduled; return each compensation's journaled result.

    Args:
        tenant: the run's tenant (part of each compensation's effect key). By default the one
            the run started under; another one is refused.
        runtime, ownership, tools, retry: as a :class:`~cuaderno.loop.agent.Session`'s (default:
            the process's; the agent's tools, traced; the loop's retry bounds).

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
    tools = tools or TracedTools(AgentTools(agent.tools))
    ownership = ownership or ProcessOwnership(runtime)
    session = Session(run_id, _NO_MODEL, store, tenant=tenant or cp.tenant or "default", retry=retry,
                      runtime=runtime, ownership=ownership, tools=tools)
    where, me = ownership.key(store, run_id), _Compensator()
    ownership.start(where, me, force=False)  # a loop of this process compensating it right now keeps it
    try:
        # So does a live process; a dead one is taken over.
        epoch = ownership.acquire(store, run_id, "compensate", force=False)
        try:
            ownership.took(where, me)
            # Read after the takeover: whatever the previous holder committed is visible.
            events = store.load(run_id)
            entries = [*((cp.outcome or {}).get("cleanup") or []), *confirmed_since(events)]
            for entry in entries:
                _check(agent, tools, entry)  # before anything is written: the wrong agent changes nothing
            steps = _Cleanup(agent, session, epoch, events)
            return [await steps.run(cleanup_step_id(index), entry) for index, entry in enumerate(entries)]
        finally:
            ownership.release(store, run_id, epoch)
    finally:
        ownership.stop(where, me)


def _check(agent: Agent, tools: ToolExecutor, entry: Mapping[str, Any]) -> None:
    """Refuse (writing nothing) an agent that cannot run this compensation: the next call, with
    the right agent, must still be able to."""
    name, arguments = _what(tools, entry)
    if name is None:
        return  # nothing to undo
    if tools.info(name) is None:
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


class _NoModel:
    """A cancelled run's cleanup calls no model."""

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        raise GatewayError("compensate() calls no model", error_class=ErrorClass.BUG, sent=False)


_NO_MODEL = _NoModel()


class _Cleanup(ToolSteps):
    """A cancelled run's compensations, each a tool step of the loop's own state machine."""

    _tells_the_model = False  # nobody answers a compensation's result: no repair or reflection is counted

    def __init__(self, agent: Agent, session: Session, epoch: int, events: list[StepEvent]) -> None:
        state = new_state(agent, "", session)
        state.epoch = epoch
        for ev in events:
            state.journal[(ev.step_id, ev.phase)] = ev
        super().__init__(state, RunLog(state))
        self.for_step: dict[str, object] = {}

    async def run(self, step_id: str, entry: Mapping[str, Any]) -> ToolResult:
        """Run (or replay, or reconcile) one compensation; return its journaled result."""
        done = self.state.journal.get((step_id, "result"))
        if done is not None:
            return view(done, ToolResult)
        name, arguments = _what(self.state.tools, entry)
        if name is None:
            # Settled by a person, and its tool declares no compensation: nothing to undo.
            origin = str((entry.get("derive_from") or {}).get("tool"))
            event = stage_result(self.log, step_id, origin, result_payload("nothing_to_do",
                                                                      reason="the tool declares no compensation"),
                                 points=())
            self.log.commit()
            return view(event, ToolResult)
        assert isinstance(arguments, dict)  # _check refused, before anything was written, what cannot run
        self._unsettleable(step_id, name)
        self.for_step[step_id] = entry.get("for_step")
        call = ToolCall(id=step_id, name=name, arguments=arguments)
        await self.step(step_id, call, fingerprint({"name": name, "arguments": arguments}))
        # Every way a tool step ends without raising stages its result last (it would ride on the
        # next intent's commit in the loop): commit it now.
        result = next(ev for ev in self.state.pending if (ev.step_id, ev.phase) == (step_id, "result"))
        self.log.commit()
        self.state.journal[(step_id, "result")] = result
        return view(result, ToolResult)

    def _fresh_key(self, step_id: str, call: ToolCall, info: ToolInfo) -> str:
        """A compensation's own identity: never the key of the effect it undoes."""
        return effect_key(self.state.s.tenant, self.state.run_id, f"compensation:{info.effect_type}",
                          {"for": self.for_step.get(step_id), "arguments": call.arguments},
                          self.state.agent.policy.version)

    def _unsettleable(self, step_id: str, name: str) -> None:
        """Found uncertain since it was last sent, and nothing can tell (no lookup, not
        idempotent, no person's answer): say so again, writing nothing (a cron retrying
        ``compensate`` must not grow the journal)."""
        intents = numbered(self.state.journal, step_id, "intent")
        tries = numbered(self.state.journal, step_id, "uncertain")
        info = self.state.tools.info(name)
        if (intents and tries and tries[-1].seq > intents[-1].seq and info is not None and not info.idempotent
                and not info.has_lookup and not not_happened_since_sent(self.state.journal, step_id)):
            raise UncertainEffect(self.state.run_id, step_id, dict(tries[-1].payload))

    def _bug(self, step_id: str, call: ToolCall, args_fp: str, ekey: str, decision: str, exc: Exception) -> NoReturn:
        """An unclassified exception in a compensation's body ends no run (the run is closed
        already): the step stays sent and unrecorded, and the next ``compensate`` reconciles it."""
        raise exc


def _what(tools: ToolExecutor, entry: Mapping[str, Any]) -> tuple[str | None, Any]:
    """The compensation's tool and arguments. An entry for an effect a person settled carries
    what the original call was (``derive_from``): its compensation is worked out here, from the
    agent's declaration (``None``: the tool declares none)."""
    origin = entry.get("derive_from")
    if not isinstance(origin, dict):
        return entry.get("tool"), entry.get("arguments")
    name = str(origin.get("tool"))
    if tools.info(name) is None:
        return name, None
    declared = tools.compensation(name, origin.get("arguments") or {}, origin.get("value"))
    if declared is None:
        return None, None
    return declared["tool"], declared["arguments"]
