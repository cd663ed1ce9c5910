"""The loop: next step -> replay it from the journal, or execute it -> record it.

For every step the runner asks the journal first (the index loaded at start). Replay rules, seed
000's table:

=================================  ============================================================
in the journal                     what replay does
=================================  ============================================================
intent and result                  skip the step, use the recorded result
neither                            execute it
intent, no result, non-idempotent  reconcile through the tool's lookup, or ``UncertainEffect``
intent, no result, idempotent      execute it again (same effect key)
=================================  ============================================================

A model call is repeatable: an intent without a result is re-sent with the same idempotency key,
and the re-send is journaled (``intent.2``) so the checkpoint counts it as possibly billed twice.

Writes are batched without weakening any rule: a step's result waits in ``pending`` and commits
in the same transaction as the *next* intent, which must be on disk before the next action
anyway. So each step costs one synced commit, and nothing leaves the process (a request, a tool
body) before everything it depends on is durable. Steps are yielded only after their commit.
"""

from __future__ import annotations

import inspect
import json
import traceback
from collections.abc import AsyncIterator
from typing import Any, NoReturn

from pydantic_core import to_jsonable_python

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import (
    ErrorClass,
    GatewayError,
    ReplayDivergence,
    RunClosed,
    ToolError,
    UncertainEffect,
    VersionMismatch,
)
from cuaderno.events import StepEvent, approval_step_id, model_step_id, tool_step_id
from cuaderno.fingerprint import chain, fingerprint, idempotency_key
from cuaderno.gateway.base import Message, ModelRequest, ModelResponse, ToolCall
from cuaderno.loop.agent import Agent, Session
from cuaderno.loop.steps import ApprovalStep, FinalStep, ModelStep, Step, ToolStep
from cuaderno.testing import crash
from cuaderno.tools.definition import ToolContext

__all__ = ["Runner", "effect_key", "tool_message"]


def effect_key(tenant: str, task_id: str, effect_type: str, arguments: dict[str, Any], policy_version: str) -> str:
    """``hash(tenant, task_id, effect_type, canonical_arguments, policy_version)``.

    Derived from the intent, never from the attempt: retries and resumes of one intent share it.
    """
    return "eff-" + fingerprint([tenant, task_id, effect_type, arguments, policy_version])[:40]


def tool_message(call_id: str, name: str, payload: dict[str, Any]) -> Message:
    """The tool message the model sees for a journaled tool result (same text on every replay)."""
    outcome = payload.get("outcome")
    if outcome == "ok":
        content = json.dumps(payload.get("value"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content, "is_error": False}
    if outcome == "denied":
        content = f"denied: {payload.get('reason') or 'not allowed'}. The tool did not run."
    else:
        err = payload.get("error") or {}
        content = f"error [{err.get('error_class', 'bug')}]: {err.get('message', '')}"
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content, "is_error": True}


class Runner:
    """Drives one run of one agent through one session."""

    def __init__(self, agent: Agent, task: str, session: Session) -> None:
        self.agent = agent
        self.task = task
        self.s = session
        self.run_id = session.run_id
        self.store = session.store
        self.journal: dict[tuple[str, str], StepEvent] = {}
        self.unvisited: dict[str, int] = {}
        self.pending: list[StepEvent] = []
        self.points: list[str] = []
        self.ready: list[tuple[Step, int]] = []
        self.flushes = 0
        self.epoch = 0
        self.messages: list[Message] = []
        self.config_fp = fingerprint(agent.config())
        self.chain = self.config_fp
        self.unhashed: list[Message] = []

    # -- opening ----------------------------------------------------------------------------------

    def _open(self) -> FinalStep | None:
        crash.point("recovery.R0")
        task_fp = fingerprint({"task": self.task})
        versions = self.agent.versions()
        cp = self.store.checkpoint(self.run_id)
        if cp is None:
            self.store.append([StepEvent(run_id=self.run_id, step_id="run", phase="start", kind="run",
                                         name=self.agent.name, fingerprint=task_fp,
                                         payload={"task": self.task, "versions": versions})])
            cp = Checkpoint(run_id=self.run_id, task_fingerprint=task_fp, versions=versions)
        else:
            closed = self._check_resumable(cp, task_fp, versions)
            if closed is not None:
                return closed
        crash.point("recovery.R2")
        # Take the run over *before* reading it: anything the previous owner committed is then
        # visible, and anything it tries to commit afterwards is refused.
        self.epoch = self.store.acquire(self.run_id, self.s.owner)
        crash.point("recovery.R3")
        for ev in self.store.load(self.run_id):
            self.journal[(ev.step_id, ev.phase)] = ev
            if ev.kind in ("model", "tool", "final"):
                self.unvisited.setdefault(ev.step_id, ev.seq)
        self._add_message({"role": "user", "content": self.task})
        return None

    def _check_resumable(self, cp: Checkpoint, task_fp: str, versions: dict[str, Any]) -> FinalStep | None:
        if cp.task_fingerprint != task_fp:
            raise ReplayDivergence(self.run_id, "run", f"task {cp.task_fingerprint}", f"task {task_fp}")
        if cp.status == "completed":
            outcome = cp.outcome or {}
            return FinalStep(step_id="final", output=str(outcome.get("output", "")), replayed=True, data=outcome)
        if cp.status in ("failed", "cancelled"):
            raise RunClosed(self.run_id, cp.status)
        if cp.status == "needs_human" and cp.uncertain:
            step_id, evidence = next(iter(cp.uncertain.items()))
            raise UncertainEffect(self.run_id, step_id, evidence)
        if cp.versions != versions and self.s.on_version_mismatch == "refuse":
            raise VersionMismatch(self.run_id, cp.versions, versions)
        return None

    # -- the loop ---------------------------------------------------------------------------------

    async def steps(self) -> AsyncIterator[Step]:
        """The async iterator behind :meth:`Agent.run`."""
        closed = self._open()
        if closed is not None:
            yield closed
            return
        for turn in range(self.agent.max_turns):
            response = await self._model_turn(turn)
            for s in self._drain():
                yield s
            if not response.tool_calls:
                self._finish(turn, response)
                for s in self._drain():
                    yield s
                return
            for index, call in enumerate(response.tool_calls):
                suspended = await self._tool_call(turn, index, call)
                for s in self._drain():
                    yield s
                if suspended:
                    return
        self._flush()
        for s in self._drain():
            yield s
        self.store.append([StepEvent(run_id=self.run_id, step_id="run", phase="end", kind="run",
                                     payload={"status": "failed", "reason": "max_turns",
                                              "limit": self.agent.max_turns})], epoch=self.epoch)
        from cuaderno.errors import BudgetExceeded

        raise BudgetExceeded(self.run_id, "max_turns", self.agent.max_turns)

    def _show(self, step: Step) -> None:
        # A step is shown only once its events are committed: if any are pending, it waits for
        # the next flush (the one that commits the next intent).
        self.ready.append((step, self.flushes + (1 if self.pending else 0)))

    def _drain(self) -> list[Step]:
        out = [step for step, needs in self.ready if needs <= self.flushes]
        self.ready = [(step, needs) for step, needs in self.ready if needs > self.flushes]
        return out

    # -- journal helpers --------------------------------------------------------------------------

    def _recorded(self, step_id: str, phase: str, kind: str, name: str | None, fp: str | None) -> StepEvent | None:
        ev = self.journal.get((step_id, phase))
        if ev is None:
            return None
        if ev.kind != kind or (name is not None and ev.name != name):
            raise ReplayDivergence(self.run_id, step_id, f"a {ev.kind} step {ev.name or ''}".strip(),
                                   f"a {kind} step {name or ''}".strip())
        if fp is not None and ev.fingerprint is not None and ev.fingerprint != fp:
            raise ReplayDivergence(self.run_id, step_id, f"{kind} request {ev.fingerprint[:12]}",
                                   f"{kind} request {fp[:12]}")
        self.unvisited.pop(step_id, None)
        return ev

    def _stage(self, event: StepEvent, *points: str) -> None:
        if self.unvisited:
            # About to write something new while recorded steps were never reached: the code
            # took another path than the journal (a step was removed or reordered).
            first = min(self.unvisited, key=self.unvisited.__getitem__)
            raise ReplayDivergence(self.run_id, first, f"step {first}", f"step {event.step_id} first")
        self.pending.append(event)
        self.points.extend(points)

    def _flush(self) -> None:
        if not self.pending:
            return
        crash.set_txn_points(*self.points)
        self.store.append(self.pending, epoch=self.epoch)
        self.flushes += 1
        if crash.armed():
            for name in self.points:  # K7: after the commit that holds a step's result
                if name.endswith(".K6"):
                    crash.point(name[:-1] + "7")
        self.pending, self.points = [], []

    def _event(self, step_id: str, phase: str, kind: str, **fields: Any) -> StepEvent:
        return StepEvent(run_id=self.run_id, step_id=step_id, phase=phase, kind=kind, **fields)

    def _add_message(self, message: Message) -> None:
        self.messages.append(message)
        self.unhashed.append(message)

    def _request_fingerprint(self) -> str:
        """The request fingerprint for the current conversation: the chain over every message."""
        for message in self.unhashed:
            self.chain = chain(self.chain, fingerprint(message))
        self.unhashed.clear()
        return self.chain

    # -- model turns ------------------------------------------------------------------------------

    async def _model_turn(self, turn: int) -> ModelResponse:
        step_id = model_step_id(turn)
        rec = self.journal.get((step_id, "result"))
        if rec is not None and rec.fingerprint and turn > 0 and not self.s.verify_replay:
            # Past turn 0 a recorded request is a pure function of the configuration and the task
            # (both checked at turn 0) and of journaled results (hash-chained), so the recorded
            # chain is adopted instead of re-hashing every message: resume stays O(rows), not
            # O(bytes). ``Session(verify_replay=True)`` re-derives and checks every turn.
            self.chain = rec.fingerprint
            self.unhashed.clear()
        fp = self._request_fingerprint()
        rec = self._recorded(step_id, "result", "model", None, fp)
        if rec is not None and rec.payload.get("response") is not None:
            response = ModelResponse.from_json(rec.payload["response"])
        else:
            self._recorded(step_id, "intent", "model", None, fp)
            response = await self._call_model(turn, step_id, fp)
        self._add_message(response.assistant_message())
        return response

    async def _call_model(self, turn: int, step_id: str, fp: str) -> ModelResponse:
        key = idempotency_key(self.run_id, step_id, fp)
        sends = sum(1 for (sid, ph) in self.journal if sid == step_id and ph.startswith("intent"))
        last_error = self.journal.get((step_id, f"error.{sends}"))
        sends += 1
        after = None if sends == 1 else "crash"
        if last_error is not None:
            # The last send ended in a journaled, classified failure: only an ambiguous one may
            # have been billed; a refused or unsent request was not.
            ambiguous = last_error.payload.get("error", {}).get("error_class") == ErrorClass.AMBIGUOUS
            after = "ambiguous" if ambiguous else "error"
        self._stage(self._intent(step_id, sends, key, turn, after), "model.K1")
        request = ModelRequest(instructions=self.agent.instructions, messages=tuple(self.messages),
                               tools=self.agent.tool_schemas, model=self.agent.model,
                               require_tool=self.agent.require_tool, max_output_tokens=self.agent.max_output_tokens,
                               temperature=self.agent.temperature)
        retries = resends = 0
        while True:
            crash.point("model.K0")
            self._flush()
            crash.point("model.K2")
            try:
                response = await self.s.gateway.complete(request, idempotency_key=key)
                break
            except GatewayError as err:
                wait = self._retry_wait(err, retries, resends)
                if wait is None:
                    self._stage(self._event(step_id, f"error.{sends}", "model", fingerprint=fp,
                                            payload={"error": err.to_json(), "key": key}))
                    self._flush()
                    raise
                if err.error_class is ErrorClass.AMBIGUOUS:
                    resends += 1
                    sends += 1
                    self._stage(self._intent(step_id, sends, key, turn, "ambiguous"), "model.K1")
                else:
                    retries += 1
                await self.s.sleep(wait)
        crash.point("model.K5")
        self._stage(self._event(step_id, "result", "model", fingerprint=fp,
                                payload={"response": response.to_json(), "key": key, "sends": sends,
                                         "counters": {"retries": retries} if retries else {}}),
                    "model.K6")
        self._show(ModelStep(step_id=step_id, turn=turn, response=response, idempotency_key=key,
                                    attempts=sends))
        return response

    def _intent(self, step_id: str, send: int, key: str, turn: int, after: str | None) -> StepEvent:
        payload: dict[str, Any] = {"key": key, "turn": turn}
        if after is not None:
            payload["after"] = after
        return self._event(step_id, "intent" if send == 1 else f"intent.{send}", "model", fingerprint=self.chain,
                           payload=payload)

    def _retry_wait(self, err: GatewayError, retries: int, resends: int) -> float | None:
        policy = self.s.retry
        if err.error_class is ErrorClass.TRANSIENT and retries < policy.max_retries:
            return policy.delay(retries + 1, err.retry_after, self.s.rng)
        if err.error_class is ErrorClass.AMBIGUOUS and resends < policy.max_resends:
            return policy.delay(resends + 1, err.retry_after, self.s.rng)
        return None

    def _finish(self, turn: int, response: ModelResponse) -> None:
        rec = self._recorded("final", "result", "final", None, None)
        if rec is None:
            self._stage(self._event("final", "result", "final", payload={"output": response.text, "turn": turn}),
                        "final.K1", "model.K6")
            crash.point("final.K0")
            self._flush()
            crash.point("final.K7")
        self._show(FinalStep(step_id="final", output=response.text))

    # -- tool calls -------------------------------------------------------------------------------

    async def _tool_call(self, turn: int, index: int, call: ToolCall) -> bool:
        """Replay or run one tool call. Returns ``True`` when the run is now waiting for a person."""
        step_id = tool_step_id(turn, index)
        # The call comes from a journaled response; past turn 0 its fingerprint is checked only
        # with verify_replay (see _model_turn), which keeps resume O(rows).
        trusted = turn > 0 and not self.s.verify_replay and (step_id, "result") in self.journal
        args_fp = None if trusted else fingerprint({"name": call.name, "arguments": call.arguments})
        rec = self._recorded(step_id, "result", "tool", call.name, args_fp)
        if rec is not None:
            self._add_message(tool_message(call.id, call.name, rec.payload))
            return False
        assert args_fp is not None
        tool = self.agent.tools.get(call.name)
        problem = None
        kwargs: dict[str, Any] = {}
        if tool is None:
            problem = ToolError(f"unknown tool {call.name!r}; available: {sorted(self.agent.tools)}",
                                error_class=ErrorClass.INVALID_INPUT, sent=False)
        elif call.arguments_error is not None:
            problem = ToolError(f"arguments are not a JSON object: {call.arguments_error}",
                                error_class=ErrorClass.INVALID_INPUT, sent=False)
        else:
            try:
                kwargs = tool.validate(call.arguments)
            except ToolError as exc:
                problem = exc
        if problem is not None or tool is None:
            assert problem is not None
            self._tool_result(step_id, call, args_fp, "error", None, decision=None, error=problem.to_json(),
                              counters={"repairs": 1})
            return False
        ekey = effect_key(self.s.tenant, self.run_id, tool.effect_type, call.arguments, self.agent.policy.version)
        intent = self._recorded(step_id, "intent", "tool", call.name, args_fp)
        if intent is not None:
            resolution = self._recorded(step_id, "resolution", "tool", call.name, None)
            if resolution is not None and resolution.decision == "not_happened":
                # A person established that the effect did not happen: send it, same key.
                return await self._execute(step_id, call, kwargs, args_fp, ekey, str(intent.decision), attempt=2,
                                           counters={"retries": 1})
            # Started before and never recorded how it ended: nobody knows if it took effect.
            return await self._reconcile(step_id, call, kwargs, args_fp, ekey, str(intent.decision), 1,
                                         {"intent_seq": intent.seq, "intent_at": intent.created_at})
        decision = self._decide(step_id, call, args_fp)
        if decision in ("allow", "approved"):
            return await self._execute(step_id, call, kwargs, args_fp, ekey, decision, attempt=1)
        return decision == "pending"

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
            self._tool_result(step_id, call, args_fp, "denied", None, decision="deny", reason=verdict.reason)
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
        tool = self.agent.tools[call.name]
        data = {"business_id": tool.business_id(call.arguments)} if tool.business_id else {}
        return ToolContext(run_id=self.run_id, step_id=step_id, tool=call.name, effect_key=ekey, attempt=attempt,
                           tenant=self.s.tenant, data=data)

    async def _execute(self, step_id: str, call: ToolCall, kwargs: dict[str, Any], args_fp: str, ekey: str,
                       decision: str, *, attempt: int, counters: dict[str, int] | None = None) -> bool:
        """Run the tool body once its intent is durable; classify how it ended."""
        tool = self.agent.tools[call.name]
        counters = dict(counters or {})
        if attempt == 1:
            self._stage(self._event(step_id, "intent", "tool", name=call.name, decision=decision, fingerprint=args_fp,
                                    payload={"effect_key": ekey, "policy_version": self.agent.policy.version,
                                             "idempotent": tool.idempotent}), "tool.K1")
        retries = 0
        while True:
            crash.point("tool.K0")
            self._flush()
            crash.point("tool.K2")
            try:
                value = await tool.invoke(kwargs, self._context(step_id, call, ekey, attempt))
                break
            except ToolError as err:
                crash.point("tool.K5")
                if err.error_class is ErrorClass.AMBIGUOUS:
                    # Sent, and the reply is lost: the same question as a crash in flight.
                    return await self._reconcile(step_id, call, kwargs, args_fp, ekey, decision, attempt,
                                                 {"last_error": err.to_json()}, counters)
                wait = None
                if err.error_class is ErrorClass.TRANSIENT and err.sent is False and retries < self.s.retry.max_retries:
                    wait = self.s.retry.delay(retries + 1, None, self.s.rng)
                if wait is None:
                    self._tool_result(step_id, call, args_fp, "error", None, decision=decision, error=err.to_json(),
                                      effect_key=ekey, counters=_plus(counters, "retries", retries))
                    return False
                retries += 1
                await self.s.sleep(wait)
            except Exception as exc:
                self._bug(step_id, call, args_fp, ekey, decision, exc)
        crash.point("tool.K5")
        self._tool_result(step_id, call, args_fp, "ok", value, decision=decision, effect_key=ekey,
                          counters=_plus(counters, "retries", retries))
        return False

    async def _reconcile(self, step_id: str, call: ToolCall, kwargs: dict[str, Any], args_fp: str, ekey: str,
                         decision: str, attempt: int, evidence: dict[str, Any],
                         counters: dict[str, int] | None = None) -> bool:
        """An effect may or may not have happened: ask before acting, never guess.

        Idempotent tools (the receiver deduplicates by ``effect_key``, or repeating is harmless)
        run again with the same key. Others ask the tool's lookup: found -> its receipt becomes
        the result; absence proven -> re-send with the same key; no lookup, or no proof either
        way -> the run stops ``needs_human`` with the evidence (:class:`UncertainEffect`).
        """
        tool = self.agent.tools[call.name]
        counters = dict(counters or {})
        if attempt > self.s.retry.max_resends:
            self._uncertain(step_id, call, ekey, {**evidence, "reason": "re-send bound reached"})
        if tool.idempotent:
            return await self._execute(step_id, call, kwargs, args_fp, ekey, decision, attempt=attempt + 1,
                                       counters=_plus(counters, "retries", 1))
        if tool.lookup is None:
            self._uncertain(step_id, call, ekey, {**evidence, "reason": "no lookup for this tool"})
        assert tool.lookup is not None
        crash.point("recovery.R1")
        try:
            found = tool.lookup(self._context(step_id, call, ekey, attempt + 1), call.arguments)
            if inspect.isawaitable(found):
                found = await found
        except Exception as exc:
            self._uncertain(step_id, call, ekey, {**evidence, "reason": "lookup failed", "lookup_error": repr(exc)})
        if found is None:  # absence proven: the only case where sending again is safe
            return await self._execute(step_id, call, kwargs, args_fp, ekey, decision, attempt=attempt + 1,
                                       counters=_plus(counters, "retries", 1))
        self._tool_result(step_id, call, args_fp, "ok", to_jsonable_python(found), decision=decision,
                          effect_key=ekey, counters=_plus(counters, "reconciled", 1))
        return False

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
                     effect_key: str | None = None, counters: dict[str, int] | None = None) -> None:
        payload: dict[str, Any] = {"outcome": outcome}
        if outcome == "ok":
            payload["value"] = value
        if error is not None:
            payload["error"] = error
        if reason is not None:
            payload["reason"] = reason
        if effect_key is not None:
            payload["effect_key"] = effect_key
        if counters:
            payload["counters"] = counters
        self._stage(self._event(step_id, "result", "tool", name=call.name, decision=decision, fingerprint=args_fp,
                                payload=payload), "tool.K6")
        self._add_message(tool_message(call.id, call.name, payload))
        self._show(ToolStep(step_id=step_id, tool=call.name, arguments=call.arguments,
                                   decision=decision or "allow", outcome=outcome, result=value, error=error,
                                   effect_key=effect_key))

    def _uncertain(self, step_id: str, call: ToolCall, ekey: str, evidence: dict[str, Any]) -> NoReturn:
        evidence = {"tool": call.name, "arguments": call.arguments, "effect_key": ekey, "last_receipt": None,
                    **evidence}
        self._stage(self._event(step_id, "uncertain", "tool", name=call.name,
                                fingerprint=fingerprint({"name": call.name, "arguments": call.arguments}),
                                payload=evidence))
        self._flush()
        raise UncertainEffect(self.run_id, step_id, evidence)


def _plus(counters: dict[str, int], name: str, n: int) -> dict[str, int]:
    if n:
        counters = {**counters, name: counters.get(name, 0) + n}
    return counters
