"""Tool calls: policy, approval, write-ahead intent, execution, reconciliation."""

from __future__ import annotations

import dataclasses
import hashlib
import traceback
from typing import Any, NoReturn

from cuaderno._json import journalable
from cuaderno.errors import ErrorClass, ReplayDivergence, ToolError, UncertainEffect
from cuaderno.events import approval_step_id, not_happened_since_sent, tool_step_id
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import ToolCall
from cuaderno.loop._state import RunState, effect_key, plus, recorded_effect_key, tool_message
from cuaderno.loop.executor import ToolInfo
from cuaderno.loop.steps import ApprovalStep, ToolStep
from cuaderno.testing import crash
from cuaderno.tools.definition import ToolContext

__all__ = ["ToolSteps"]

def _journalable(call: ToolCall) -> ToolCall:
    """The call with a name the journal can hold. The model may write anything as a tool name
    (a megabyte, a NUL, a lone surrogate); such a call never runs, and is journaled under a
    stable stand-in (the raw name stays in the journaled response)."""
    name = call.name
    ok = 0 < len(name) <= 256 and "\x00" not in name
    if ok and not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            ok = False
    if ok:
        return call
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return dataclasses.replace(call, name=f"invalid-name-{digest}")


_AFTER_ERROR = {ErrorClass.INVALID_INPUT.value: "repairs", ErrorClass.CONFLICT.value: "replans",
                ErrorClass.PERMANENT.value: "reflects", ErrorClass.TRANSIENT.value: "reflects"}
"""What the model is asked to do next after a tool error of each class: repair its input,
replan on fresh state, or reflect on a refusal. Ambiguous errors are reconciled, bugs stop."""


class ToolSteps(RunState):
    """The tool half of the loop."""

    _tells_the_model = True
    """Whether each result becomes a tool message the model answers (a repair, a replan, a
    reflection: counted against the budgets). A compensation's does not."""

    async def _tool_call(self, turn: int, index: int, call: ToolCall) -> bool:
        """Replay or run one tool call. Returns ``True`` when the run is now waiting for a person."""
        unrecorded = self._replay_tool_call(turn, index, call)
        if unrecorded is None:
            return False
        return await self._tool_step(*unrecorded)

    async def _tool_step(self, step_id: str, call: ToolCall, args_fp: str) -> bool:
        """Run a tool step the journal holds no result for: check the call, decide it, write its
        intent, run it, reconcile an unknown outcome, record how it ended. The one state machine
        for every tool step, the model's calls and a cancelled run's compensations
        (:mod:`cuaderno.loop.cleanup`) alike: same journaling, crash points, bounds, telemetry.
        Returns ``True`` when the run is now waiting for a person."""
        info = self.tools.info(call.name)
        problem = None
        if info is None:
            problem = ToolError(f"unknown tool {call.name!r}; available: {self.tools.names()}",
                                error_class=ErrorClass.INVALID_INPUT, sent=False)
        elif call.arguments_error is not None:
            problem = ToolError(f"the arguments cannot be used: {call.arguments_error}",
                                error_class=ErrorClass.INVALID_INPUT, sent=False)
        else:
            try:
                self.tools.check(call.name, call.arguments)
            except ToolError as exc:
                problem = exc
        if problem is not None or info is None:
            assert problem is not None
            if (step_id, "intent") in self.journal:
                # It was started under a configuration that accepted it (the tool existed, the
                # arguments fit its schema): recording an error now would hide an effect that
                # may have happened.
                raise ReplayDivergence(self.run_id, step_id, f"tool {call.name!r} started with these arguments",
                                       f"a call this agent refuses ({problem})")
            self._tool_result(step_id, call, args_fp, "error", None, decision=None, error=problem.to_json())
            return False
        intent = self._recorded(step_id, "intent", "tool", call.name, args_fp)
        # A started step keeps the key it was first sent with, whatever this process would derive
        # now (a resume under another policy version): a lookup must ask about that key, and a
        # re-send must carry it, or the receiver sees a new effect and does it twice.
        ekey = (recorded_effect_key(intent) if intent is not None else None) or self._fresh_key(step_id, call, info)
        if intent is not None:
            last = self._latest(step_id, "intent") or intent
            if not_happened_since_sent(self.journal, step_id):
                # A person established that the effect did not happen, and nothing was sent
                # since: send it, same key. (A send after the resolution is as unknown as any.)
                return await self._execute(step_id, call, args_fp, ekey, str(intent.decision), attempt=2,
                                           counters={"retries": 1}, after="not_happened")
            # Started before and never recorded how it ended: nobody knows if it took effect.
            return await self._reconcile(step_id, call, args_fp, ekey, str(intent.decision), 1,
                                         {"intent_seq": last.seq, "intent_at": last.created_at})
        decision = self._decide(step_id, call, args_fp)
        if decision in ("allow", "approved"):
            return await self._execute(step_id, call, args_fp, ekey, decision, attempt=1)
        return decision == "pending"

    def _fresh_key(self, step_id: str, call: ToolCall, info: ToolInfo) -> str:
        """The effect key of a call never sent: derived from the intent (see :func:`effect_key`)."""
        return effect_key(self.s.tenant, self.run_id, info.effect_type, call.arguments, self.agent.policy.version)

    def _replay_tool_call(self, turn: int, index: int, call: ToolCall) -> tuple[str, ToolCall, str] | None:
        """Replay a tool call whose result the journal holds (``None``), or return what running
        it needs: its step id, the call under a journalable name, and its arguments' fingerprint.

        Synchronous: replaying reads only the journal already in memory, and adds the message.
        """
        step_id = tool_step_id(turn, index)
        call = _journalable(call)
        # The call comes from a journaled response; past turn 0 its fingerprint is checked only
        # with verify_replay (see _replay_model_turn), which keeps resume O(rows).
        trusted = turn > 0 and not self.s.verify_replay and (step_id, "result") in self.journal
        args_fp = None if trusted else fingerprint({"name": call.name, "arguments": call.arguments})
        rec = self._recorded(step_id, "result", "tool", call.name, args_fp)
        if rec is not None:
            self._add_message(tool_message(call.id, call.name, rec.payload))
            return None
        assert args_fp is not None
        return step_id, call, args_fp

    def _decide(self, step_id: str, call: ToolCall, args_fp: str) -> str:
        """The decision for a call not yet executed: allow, approved, pending, or a journaled denial."""
        appr_id = approval_step_id(step_id)
        request = self._recorded(appr_id, "request", "approval", call.name, args_fp)
        self._recorded(step_id, "decision", "tool", call.name, args_fp)
        if request is not None:
            decided = self._recorded(appr_id, "decision", "approval", None, args_fp)
            if decided is None:
                self._show(self._approval_step(appr_id, step_id, call, args_fp, "pending"))
                return "pending"
            if decided.decision == "approved":
                return "approved"
            self._tool_result(step_id, call, args_fp, "denied", None, decision="rejected",
                              reason=str(decided.payload.get("reason") or "rejected by a person"))
            return "rejected"
        policy = self.agent.policy
        verdict = policy.decide(call.name, call.arguments)
        if verdict.decision == "deny":
            self._tool_result(step_id, call, args_fp, "denied", None, decision="deny", reason=verdict.reason,
                              policy_version=policy.version)
            return "deny"
        if verdict.decision == "require_approval":
            shown = {"tool_step": step_id, "arguments": call.arguments, "reason": verdict.reason,
                     "policy_version": policy.version}
            self._stage(self._event(step_id, "decision", "tool", name=call.name, decision="require_approval",
                                    fingerprint=args_fp, payload={"policy_version": policy.version,
                                                                  "reason": verdict.reason}), "approval.K1")
            self._stage(self._event(appr_id, "request", "approval", name=call.name, decision="require_approval",
                                    fingerprint=args_fp, payload=shown))
            crash.point("approval.K0")
            self._flush()
            crash.point("approval.K7")
            self._show(ToolStep(step_id=step_id, tool=call.name, arguments=call.arguments,
                                       decision="require_approval", outcome="pending"))
            self._show(self._approval_step(appr_id, step_id, call, args_fp, "pending"))
            return "pending"
        return "allow"

    def _approval_step(self, appr_id: str, step_id: str, call: ToolCall, args_fp: str, status: str) -> ApprovalStep:
        return ApprovalStep(step_id=appr_id, tool_step_id=step_id, tool=call.name, arguments=call.arguments,
                            fingerprint=args_fp, status=status)

    def _context(self, step_id: str, call: ToolCall, ekey: str, attempt: int) -> ToolContext:
        data = self.tools.context_data(call.name, call.arguments)
        return ToolContext(run_id=self.run_id, step_id=step_id, tool=call.name, effect_key=ekey, attempt=attempt,
                           tenant=self.s.tenant, data=data, call_id=call.id)

    async def _execute(self, step_id: str, call: ToolCall, args_fp: str, ekey: str,
                       decision: str, *, attempt: int, counters: dict[str, int] | None = None,
                       after: str | None = None) -> bool:
        """Run the tool body once its intent is durable; classify how it ended.

        ``after`` says why a body that may already have run is run again (``absent``: a lookup
        proved the effect missing; ``unknown``: an idempotent tool whose outcome is unknown;
        ``not_happened``: a person settled it). It is journaled on the re-send's intent.
        """
        counters = dict(counters or {})
        self._tool_intent(step_id, call, decision, args_fp, ekey, attempt, after)
        retries = 0
        while True:
            crash.point("tool.K0")
            await self._flush_durable()
            crash.point("tool.K2")
            self._confirm_hold()
            try:
                value = await self.tools.invoke(call.name, call.arguments, self._context(step_id, call, ekey, attempt))
                break
            except ToolError as err:
                crash.point("tool.K5")
                if err.error_class is ErrorClass.AMBIGUOUS:
                    # Sent, and the reply is lost: the same question as a crash in flight.
                    return await self._reconcile(step_id, call, args_fp, ekey, decision, attempt,
                                                 {"last_error": err.to_json()}, counters)
                wait = None
                if err.error_class is ErrorClass.TRANSIENT and err.sent is False and retries < self.s.retry.max_retries:
                    wait = self.s.retry.delay(retries + 1, None, self.s.runtime.random)
                if wait is None:
                    info = self.tools.info(call.name)
                    if attempt > 1 and after not in ("absent", "not_happened") and not (info and info.effect_free):
                        # A re-send after an unknown outcome failed: that says nothing about the
                        # first send, which may have taken effect. Recording an error would be a
                        # guess. (After a proven absence, or a person's "did not happen", the
                        # first send is known not to have happened: the error is the outcome. So is
                        # it for a tool that only reads: there was no effect to wonder about.)
                        self._uncertain(step_id, call, ekey, {"reason": "re-send after an unknown outcome failed",
                                                              "last_error": err.to_json()})
                    self._tool_result(step_id, call, args_fp, "error", None, decision=decision, error=err.to_json(),
                                      effect_key=ekey, counters=plus(counters, "retries", retries))
                    return False
                retries += 1
                await self.s.runtime.sleep(wait)
                self._tool_intent(step_id, call, decision, args_fp, ekey, attempt, "retry")
            except Exception as exc:
                self._bug(step_id, call, args_fp, ekey, decision, exc)
        crash.point("tool.K5")
        # The compensation to schedule if the run is cancelled is decided now and journaled with
        # the result, so a cancellation can list it from the journal alone.
        self._tool_result(step_id, call, args_fp, "ok", value, decision=decision, effect_key=ekey,
                          counters=plus(counters, "retries", retries),
                          compensation=self.tools.compensation(call.name, call.arguments, value))
        return False

    def _tool_intent(self, step_id: str, call: ToolCall, decision: str, args_fp: str, ekey: str,
                     attempt: int, after: str | None) -> None:
        """Stage the intent that must commit before the tool body runs, for every run of it.

        The first is ``intent``; a re-send or retry of the same step is ``intent.2``,
        ``intent.3``... Each goes through the same transaction checks as the first, so a process
        that was taken over (fencing) or a run cancelled since (no new work admitted) is refused
        *before* the body runs again, never only at the result write after it ran.
        """
        n = self.tool_sends.get(step_id)
        if n is None:
            n = self._recorded_count(step_id, "intent")
        n += 1
        self.tool_sends[step_id] = n
        info = self.tools.info(call.name)
        assert info is not None  # only a call of a tool this agent has gets an intent
        payload: dict[str, Any] = {"effect_key": ekey, "policy_version": self.agent.policy.version,
                                   "idempotent": info.idempotent}
        if n == 1:
            self._stage(self._event(step_id, "intent", "tool", name=call.name, decision=decision,
                                    fingerprint=args_fp, payload=payload), "tool.K1")
            return
        payload["attempt"] = attempt
        payload["after"] = after
        self._stage(self._event(step_id, f"intent.{n}", "tool", name=call.name, decision=decision,
                                fingerprint=args_fp, payload=payload))

    async def _reconcile(self, step_id: str, call: ToolCall, args_fp: str, ekey: str,
                         decision: str, attempt: int, evidence: dict[str, Any],
                         counters: dict[str, int] | None = None) -> bool:
        """An effect may or may not have happened: ask before acting, never guess.

        Idempotent tools (the receiver deduplicates by ``effect_key``, or repeating is harmless)
        run again with the same key. Others ask the tool's lookup: found -> its receipt becomes
        the result; absence proven -> re-send with the same key; no lookup, or no proof either
        way -> the run stops ``needs_human`` with the evidence (:class:`UncertainEffect`).
        """
        info = self.tools.info(call.name)
        assert info is not None  # only a call of a tool this agent has gets an intent
        counters = dict(counters or {})
        # The bound limits sending again, not finding out: a lookup that finds the receipt settles
        # the step whatever the bound (before, with max_resends=0 it was never asked).
        bound_reached = attempt > self.s.retry.max_resends
        if info.idempotent:
            if bound_reached:
                self._uncertain(step_id, call, ekey, {**evidence, "reason": "re-send bound reached"})
            return await self._execute(step_id, call, args_fp, ekey, decision, attempt=attempt + 1,
                                       counters=plus(counters, "retries", 1), after="unknown")
        if not info.has_lookup:
            self._uncertain(step_id, call, ekey, {**evidence, "reason": "no lookup for this tool"})
        crash.point("recovery.R1")
        try:
            found = await self.tools.lookup(call.name, call.arguments, self._context(step_id, call, ekey, attempt + 1))
            found = journalable(found, run_id=self.run_id, step_id=step_id, tool=call.name)  # a receipt it can hold
        except Exception as exc:
            self._uncertain(step_id, call, ekey, {**evidence, "reason": "lookup failed", "lookup_error": repr(exc)})
        if found is None and "intent_seq" in evidence:
            # An intent this pass found in the journal: the holder that wrote it may be alive and
            # about to make the call (its lock was ended under it), and then "not found" is no
            # proof. Only a holder that let go or is provably gone leaves a proof (R23).
            earlier = self._earlier_holder(step_id)
            if earlier is not None:
                self._uncertain(step_id, call, ekey, {**evidence, "reason": "the holder that sent it may still be "
                                                      "running it", "lookup": "found no effect",
                                                      "earlier_holder": earlier})
        if found is None:  # absence proven: the only case where sending again is safe
            if bound_reached:
                self._uncertain(step_id, call, ekey, {**evidence, "reason": "re-send bound reached",
                                                      "lookup": "found no effect"})
            return await self._execute(step_id, call, args_fp, ekey, decision, attempt=attempt + 1,
                                       counters=plus(counters, "retries", 1), after="absent")
        value = found
        # Found: the effect happened, so a cancellation must be able to undo it like any other.
        self._tool_result(step_id, call, args_fp, "ok", value, decision=decision, effect_key=ekey,
                          counters=plus(counters, "reconciled", 1),
                          compensation=self.tools.compensation(call.name, call.arguments, value))
        return False

    def _confirm_hold(self) -> None:
        """Refuse to start a body once this worker may have lost the run: a store that can lose
        a holder's lock while it lives (PostgreSQL, its lock session ended by the server) says so
        here with :class:`~cuaderno.errors.FencedOut`. SQLite's kernel lock cannot be lost by a
        living process, and such stores have no ``confirm_hold``."""
        confirm = getattr(self.store, "confirm_hold", None)
        if confirm is not None:
            confirm(self.run_id, self.epoch)

    def _earlier_holder(self, step_id: str) -> dict[str, Any] | None:
        """An earlier holder of the run that the store says may still be executing this step
        (whose first intent it may have written: a PostgreSQL holder whose lock session the
        server ended, see ``PostgresCheckpointer.earlier_holder``); ``None`` for a store whose
        takeover proves the holder let go or died (SQLite's kernel lock, memory)."""
        ask = getattr(self.store, "earlier_holder", None)
        first = self.journal.get((step_id, "intent"))
        if ask is None or first is None:
            return None
        found = ask(self.run_id, first.seq)
        return found if isinstance(found, dict) else None

    def _bug(self, step_id: str, call: ToolCall, args_fp: str, ekey: str, decision: str, exc: Exception) -> NoReturn:
        """An unclassified exception is a bug: journal the evidence, end the run failed, re-raise."""
        error = {"error_class": ErrorClass.BUG.value, "message": f"{type(exc).__name__}: {exc}",
                 "type": type(exc).__name__, "sent": None,
                 "traceback": traceback.format_exception(exc)[-6:]}
        self._tool_result(step_id, call, args_fp, "error", None, decision=decision, error=error, effect_key=ekey)
        self._stage(self._event("run", "end", "run", payload={"status": "failed", "reason": "bug", "step": step_id,
                                                              "error": error}))
        self._flush()
        raise exc

    def _tool_result(self, step_id: str, call: ToolCall, args_fp: str, outcome: str, value: Any, *,
                     decision: str | None, error: dict[str, Any] | None = None, reason: str | None = None,
                     effect_key: str | None = None, counters: dict[str, int] | None = None,
                     compensation: dict[str, Any] | None = None, policy_version: str | None = None) -> None:
        # Each outcome the model is told about is a second attempt of a named kind (seed 001 §2).
        kind = "reflects" if outcome == "denied" else _AFTER_ERROR.get(str((error or {}).get("error_class")))
        if outcome != "ok" and kind is not None and self._tells_the_model:
            counters = plus(dict(counters or {}), kind, 1)
        if counters:
            self.charge(counters)
        payload: dict[str, Any] = {"outcome": outcome}
        if outcome == "ok":
            payload["value"] = value
        if error is not None:
            payload["error"] = error
        if reason is not None:
            payload["reason"] = reason
        if policy_version is not None:  # a denial names the rules that decided it, as an intent does
            payload["policy_version"] = policy_version
        if effect_key is not None:
            payload["effect_key"] = effect_key
        if counters:
            payload["counters"] = counters
        if compensation:
            payload["compensation"] = compensation
        self._stage(self._event(step_id, "result", "tool", name=call.name, decision=decision, fingerprint=args_fp,
                                payload=payload), "tool.K6")
        self._add_message(tool_message(call.id, call.name, payload))
        self._show(ToolStep(step_id=step_id, tool=call.name, arguments=call.arguments,
                                   decision=decision or "allow", outcome=outcome, result=value, error=error,
                                   effect_key=effect_key))

    def _uncertain(self, step_id: str, call: ToolCall, ekey: str, evidence: dict[str, Any]) -> NoReturn:
        evidence = {"tool": call.name, "arguments": call.arguments, "effect_key": ekey, "last_receipt": None,
                    **evidence}
        # A later resume may try again (a lookup that was unreachable may answer now): each try
        # that stays uncertain is its own event, so the evidence of every attempt is kept.
        tries = self._recorded_count(step_id, "uncertain")
        phase = "uncertain" if tries == 0 else f"uncertain.{tries + 1}"
        self._stage(self._event(step_id, phase, "tool", name=call.name,
                                fingerprint=fingerprint({"name": call.name, "arguments": call.arguments}),
                                payload=evidence))
        self._flush()
        raise UncertainEffect(self.run_id, step_id, evidence)

