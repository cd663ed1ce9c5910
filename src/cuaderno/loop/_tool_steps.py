"""Tool calls: policy, approval, write-ahead intent, execution, reconciliation."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any

from cuaderno import faults
from cuaderno.durable.approval import Approval
from cuaderno.durable.effect import BodyBug, Effect, Settled, result_payload, stage_result
from cuaderno.errors import ErrorClass, ReplayDivergence, ToolError
from cuaderno.events import approval_step_id, tool_step_id
from cuaderno.events.payloads import ApprovalDecision, ToolResult, view
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import ToolCall
from cuaderno.loop._log import StepsOver
from cuaderno.loop._state import effect_key, journalable_call, tool_message
from cuaderno.loop.executor import ToolInfo
from cuaderno.loop.steps import ApprovalStep, ToolStep
from cuaderno.plainjson import journalable
from cuaderno.tools.definition import ToolContext

__all__ = ["ToolSteps"]

_journalable = journalable_call  # the name the loop used before (kept importable)


class ToolSteps(StepsOver):
    """The tool half of the loop, over one run's state and log (it writes no state field itself:
    its results go through the log). A cancelled run's compensations subclass it
    (:mod:`cuaderno.loop.cleanup`) with their own keys."""

    _tells_the_model = True
    """Whether each result becomes a tool message the model answers (a repair, a replan, a
    reflection: counted against the budgets). A compensation's does not."""

    async def call(self, turn: int, index: int, call: ToolCall) -> bool:
        """Replay or run one tool call. Returns ``True`` when the run is now waiting for a person."""
        unrecorded = self.replay(turn, index, call)
        if unrecorded is None:
            return False
        return await self.step(*unrecorded)

    async def step(self, step_id: str, call: ToolCall, args_fp: str) -> bool:
        """Run a tool step the journal holds no result for: check the call, decide it, write its
        intent, run it, reconcile an unknown outcome, record how it ended. The one state machine
        for every tool step, the model's calls and a cancelled run's compensations
        (:mod:`cuaderno.loop.cleanup`) alike: same journaling, crash points, bounds, telemetry.
        Returns ``True`` when the run is now waiting for a person."""
        info = self.state.tools.info(call.name)
        problem = None
        if info is None:
            problem = ToolError(f"unknown tool {call.name!r}; available: {self.state.tools.names()}",
                                error_class=ErrorClass.INVALID_INPUT, sent=False)
        elif call.arguments_error is not None:
            problem = ToolError(f"the arguments cannot be used: {call.arguments_error}",
                                error_class=ErrorClass.INVALID_INPUT, sent=False)
        else:
            try:
                self.state.tools.check(call.name, call.arguments)
            except ToolError as exc:
                problem = exc
        if problem is not None or info is None:
            assert problem is not None
            if (step_id, "intent") in self.state.journal:
                # It was started under a configuration that accepted it (the tool existed, the
                # arguments fit its schema): recording an error now would hide an effect that
                # may have happened.
                raise ReplayDivergence(self.state.run_id, step_id, f"tool {call.name!r} started with these arguments",
                                       f"a call this agent refuses ({problem})")
            self._tool_result(step_id, call, args_fp, "error", decision=None, error=problem.to_json())
            return False
        intent = self._recorded(step_id, "intent", "tool", call.name, args_fp)
        if intent is None:
            decision = self._decide(step_id, call, args_fp)
            if decision not in ("allow", "approved"):
                return decision == "pending"
        else:
            decision = str(intent.decision)  # started: settled under the decision it was sent with
        effect = self._effect(step_id, call, args_fp, info, decision)
        try:
            settled = await effect.run()
        except BodyBug as bug:
            self._settled(step_id, call, bug.settled, decision=decision)
            self.log.stage(self.log.event("run", "end", "run", payload={"status": "failed", "reason": "bug",
                                                                 "step": step_id, "error": bug.settled.error}))
            self.log.commit()
            raise bug.cause from None
        self._settled(step_id, call, settled, decision=decision)
        return False

    def _effect(self, step_id: str, call: ToolCall, args_fp: str, info: ToolInfo, decision: str) -> Effect:
        """The effect protocol's step for a call of one of the agent's tools."""
        it = _Call(self, step_id, call)
        effect = Effect(log=self.log, step_id=step_id, tool=call.name, arguments=call.arguments, fingerprint=args_fp,
                        key=self._fresh_key(step_id, call, info), body=it.body,
                        lookup=it.lookup if info.has_lookup else None, idempotent=info.idempotent,
                        effect_free=info.effect_free, decision=decision, policy_version=self.state.agent.policy.version,
                        retry=self.state.s.retry, sleep=self.state.s.runtime.sleep, rng=self.state.s.runtime.random,
                        compensation=it.compensation, tells_the_model=self._tells_the_model)
        it.key = effect.key  # as the Effect settled it (a step sent before keeps its first key)
        return effect

    def _fresh_key(self, step_id: str, call: ToolCall, info: ToolInfo) -> str:
        """The effect key of a call never sent: derived from the intent (see :func:`effect_key`)."""
        st = self.state
        return effect_key(st.s.tenant, st.run_id, info.effect_type, call.arguments, st.agent.policy.version)

    def replay(self, turn: int, index: int, call: ToolCall) -> tuple[str, ToolCall, str] | None:
        """Replay a tool call whose result the journal holds (``None``), or return what running
        it needs: its step id, the call under a journalable name, and its arguments' fingerprint.

        Synchronous: replaying reads only the journal already in memory, and adds the message.
        """
        step_id = tool_step_id(turn, index)
        call = journalable_call(call)
        # The call comes from a journaled response; past turn 0 its fingerprint is checked only
        # with verify_replay (see _replay_model_turn), which keeps resume O(rows).
        trusted = turn > 0 and not self.state.s.verify_replay and (step_id, "result") in self.state.journal
        args_fp = None if trusted else fingerprint({"name": call.name, "arguments": call.arguments})
        rec = self._recorded(step_id, "result", "tool", call.name, args_fp)
        if rec is not None:
            self._add_message(tool_message(call.id, call.name, view(rec, ToolResult)))
            return None
        assert args_fp is not None
        return step_id, call, args_fp

    def _decide(self, step_id: str, call: ToolCall, args_fp: str) -> str:
        """The decision for a call not yet executed: allow, approved, pending, or a journaled denial."""
        appr_id = approval_step_id(step_id)
        journal = self.state.journal
        # Checked (and visited) only where recorded: most calls were never asked about, and this
        # runs per tool step.
        request = (self._recorded(appr_id, "request", "approval", call.name, args_fp)
                   if (appr_id, "request") in journal else None)
        if (step_id, "decision") in journal:
            self._recorded(step_id, "decision", "tool", call.name, args_fp)
        if request is not None:
            decided = self._recorded(appr_id, "decision", "approval", None, args_fp)
            if decided is None:
                self._show(self._approval_step(appr_id, step_id, call, args_fp, "pending"))
                return "pending"
            if decided.decision == "approved":
                return "approved"
            self._tool_result(step_id, call, args_fp, "denied", decision="rejected",
                              reason=str(view(decided, ApprovalDecision).get("reason") or "rejected by a person"))
            return "rejected"
        policy = self.state.agent.policy
        verdict = policy.decide(call.name, call.arguments)
        if verdict.decision == "deny":
            self._tool_result(step_id, call, args_fp, "denied", decision="deny", reason=verdict.reason,
                              policy_version=policy.version)
            return "deny"
        if verdict.decision == "require_approval":
            self.log.stage(self.log.event(step_id, "decision", "tool", name=call.name, decision="require_approval",
                                          fingerprint=args_fp, payload={"policy_version": policy.version,
                                                                        "reason": verdict.reason}))
            # The request in the protocol's shape (what an integration writes too); it names the
            # transaction's crash point, approval.K1, which holds the decision and the request.
            Approval(self.log, step_id, call.name, call.arguments, args_fp).request(
                verdict.reason, extra={"policy_version": policy.version})
            faults.point("approval.K0")
            self.log.commit()
            faults.point("approval.K7")
            self._show(ToolStep(step_id=step_id, tool=call.name, arguments=call.arguments,
                                       decision="require_approval", outcome="pending"))
            self._show(self._approval_step(appr_id, step_id, call, args_fp, "pending"))
            return "pending"
        return "allow"

    def _approval_step(self, appr_id: str, step_id: str, call: ToolCall, args_fp: str, status: str) -> ApprovalStep:
        return ApprovalStep(step_id=appr_id, tool_step_id=step_id, tool=call.name, arguments=call.arguments,
                            fingerprint=args_fp, status=status)

    def _context(self, step_id: str, call: ToolCall, ekey: str, attempt: int) -> ToolContext:
        data = self.state.tools.context_data(call.name, call.arguments)
        return ToolContext(run_id=self.state.run_id, step_id=step_id, tool=call.name, effect_key=ekey, attempt=attempt,
                           tenant=self.state.s.tenant, data=data, call_id=call.id)

    def _tool_result(self, step_id: str, call: ToolCall, args_fp: str, outcome: str, *, decision: str | None,
                     error: Mapping[str, object] | None = None, reason: str | None = None,
                     policy_version: str | None = None) -> None:
        """The result of a call that never ran (an unknown tool, arguments refused, a denial)."""
        payload = result_payload(outcome, error=error, reason=reason, policy_version=policy_version,
                                 tells_the_model=self._tells_the_model)
        stage_result(self.log, step_id, call.name, payload, decision=decision, fingerprint=args_fp)
        self._settled(step_id, call, Settled(payload), decision=decision)

    def _settled(self, step_id: str, call: ToolCall, settled: Settled, *, decision: str | None) -> None:
        """Count, tell the model and show a step whose result the protocol staged."""
        # Staged by the protocol as a ToolResult (an annotation, not typing.cast: no call per step).
        payload: ToolResult = settled.payload  # type: ignore[assignment]
        if payload.get("counters"):
            self.log.charge(payload["counters"])
        self._add_message(tool_message(call.id, call.name, payload))
        self._show(ToolStep(step_id=step_id, tool=call.name, arguments=call.arguments, decision=decision or "allow",
                            outcome=str(payload["outcome"]), result=settled.value, error=settled.error,
                            effect_key=payload.get("effect_key")))


class _Call:
    """What an effect's body, lookup and compensation need of one tool call, and nothing that
    refers back to the :class:`Effect` (its key is copied in once the Effect has settled it).

    Closures over the Effect made a reference cycle per tool call (Effect -> body -> cell ->
    Effect): about six objects a step that only the cyclic GC could free, which nearly doubled
    the loop's gen-0 collections. Without the cycle a step's objects go when it ends."""

    __slots__ = ("call", "key", "step_id", "steps")

    def __init__(self, steps: ToolSteps, step_id: str, call: ToolCall) -> None:
        self.steps, self.step_id, self.call, self.key = steps, step_id, call, ""

    def context(self, attempt: int) -> ToolContext:
        return self.steps._context(self.step_id, self.call, self.key, attempt)

    def body(self, attempt: int) -> Awaitable[Any]:
        # The invocation itself, not a coroutine that only awaits it: one await level less in
        # every tool step (the Effect awaits what this returns).
        call = self.call
        return self.steps.state.tools.invoke(call.name, call.arguments, self.context(attempt))

    async def lookup(self, attempt: int) -> Any:
        call, state = self.call, self.steps.state
        found = await state.tools.lookup(call.name, call.arguments, self.context(attempt))
        # a receipt it can hold
        return journalable(found, run_id=state.run_id, step_id=self.step_id, tool=call.name)

    def compensation(self, value: Any) -> Mapping[str, Any] | None:
        return self.steps.state.tools.compensation(self.call.name, self.call.arguments, value)
