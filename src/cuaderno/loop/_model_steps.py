"""Model turns: replay a recorded response, or send the request once its intent is durable."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import cast

from cuaderno import faults
from cuaderno.durable.model_call import ModelCall, accepted
from cuaderno.events import model_step_id
from cuaderno.events.payloads import FinalResult, ModelResult, view
from cuaderno.fingerprint import idempotency_key
from cuaderno.flow.ratelimit import rate_gate
from cuaderno.gateway.base import ModelRequest, ModelResponse, ToolCall, assistant_message
from cuaderno.gateway.ladder import Ladder, climb, current_route
from cuaderno.gateway.structured import feedback_messages
from cuaderno.loop._log import StepsOver
from cuaderno.loop._state import Turn, Unrecorded
from cuaderno.loop.steps import FinalStep, ModelStep

__all__ = ["ModelSteps"]


class ModelSteps(StepsOver):
    """The model half of the loop, over one run's state and log. Writes the state's
    ``output_data`` and, while replaying, its ``chain``, ``rebased`` and ``unhashed``."""

    __slots__ = ()

    async def turn(self, turn: int) -> Turn | None:
        """Replay or make turn ``turn``'s model call. ``None`` means the response was rejected
        (empty or refused): it is journaled and counted, and the turn is asked again."""
        replayed = self.replay(turn)
        if not isinstance(replayed, Unrecorded):
            return replayed
        st = self.state
        step_id, fp = replayed
        # A call in flight when the run was migrated was sent with the old configuration's body;
        # it is sent again with the new one (another key), counted as possibly billed twice.
        first = st.journal.get((step_id, "intent"))
        self._recorded(step_id, "intent", "model", None,
                       None if first is not None and first.seq < st.migrate_seq else fp)
        response, payload = await self._call(turn, step_id, fp)
        if not accepted(payload):
            for message in feedback_messages(payload):  # an invalid structured answer: told why
                self._add_message(message)
            return None  # otherwise not part of the conversation: the same request is asked again
        journaled = payload["response"]
        assert journaled is not None, "a result staged from a response holds it"
        self._add_message(assistant_message(journaled))
        st.output_data = payload.get("output")
        return Turn(response.text, response.tool_calls)

    def replay(self, turn: int) -> Turn | None | Unrecorded:
        """Turn ``turn``'s model call as the journal holds it, or :class:`Unrecorded` (with the
        step id and request fingerprint the call must be made with) when it has no response.

        Synchronous: replaying reads only the journal already in memory, and adds the message.
        """
        st = self.state
        step_id = model_step_id(turn)
        rec = st.journal.get((step_id, "result"))
        if rec is not None and rec.fingerprint and (turn > 0 or st.migrated) and not st.s.verify_replay:
            # Past turn 0 a recorded request is a pure function of the configuration and the task
            # (both checked at turn 0) and of journaled results (hash-chained), so the recorded
            # chain is adopted instead of re-hashing every message: resume stays O(rows), not
            # O(bytes). ``Session(verify_replay=True)`` re-derives and checks every turn.
            st.chain = rec.fingerprint
            st.unhashed.clear()
            st.rebased = st.rebased or (st.rebase_turn is not None and turn >= st.rebase_turn)
        elif st.migrated and not st.rebased and (turn == st.rebase_turn or st.rebase_turn is None):
            # The first request after a migration has the new configuration in its body, so its
            # fingerprint (and provider key) says so, the same way in every process.
            st.rebased = True
            st.unhashed.append({"migrated_to": st.config_fp})
        fp = self.log.request_fingerprint()
        rec = self._recorded(step_id, "result", "model", None, fp)
        result = None if rec is None else view(rec, ModelResult)
        data = None if result is None else result["response"]
        if result is None or data is None:
            return Unrecorded(step_id, fp)
        if not accepted(result):
            for message in feedback_messages(result):
                self._add_message(message)
            return None
        # The gateway's helpers read the response's JSON as it is (the same object, not a copy).
        self._add_message(assistant_message(data))
        st.output_data = result.get("output")
        # Only what the loop reads of the response is rebuilt (the whole ModelResponse is three
        # times the work, and a resume replays every turn).
        return Turn(data.get("text") or "", tuple(ToolCall.from_json(c) for c in data.get("tool_calls") or ()))

    async def _call(self, turn: int, step_id: str, fp: str) -> tuple[ModelResponse, ModelResult]:
        """Send the request once its intent is durable (:class:`~cuaderno.durable.ModelCall`);
        return the response and its staged result payload."""
        st, log = self.state, self.log
        agent, s = st.agent, st.s
        request = ModelRequest(instructions=agent.instructions, messages=tuple(log.conversation()),
                               tools=agent.tool_schemas, model=agent.model,
                               require_tool=agent.require_tool, max_output_tokens=agent.max_output_tokens,
                               temperature=agent.temperature)
        # The empty-generation ladder's plan: its rung, if any. Without a ladder, and with no route
        # set around the loop, there is none to make: the request goes as it is, under the step's
        # own key, with nothing added to its intent or result and no route to set (what a plan of
        # the original request would do, without its allocations and its coroutine per step).
        plan = (climb(log, s.gateway, turn, request)
                if isinstance(getattr(s.gateway, "ladder", None), Ladder) or current_route() is not None else None)
        if plan is not None:
            request = plan.request
        run_id, model = st.run_id, st.model
        call = ModelCall(log, step_id, key=idempotency_key(run_id, step_id, fp if plan is None else plan.keyed(fp)),
                         turn=turn, fingerprint=fp)
        # The provider's shared rate limit, if the gateway declares one: its turn is taken before
        # the intent (a gateway without one, as the workflow's under Temporal, gives None).
        gate = rate_gate(st.store, s.gateway, request, sleep=s.runtime.sleep)
        # The original request's intent records nothing of the plan: the journal's intents are then
        # not counted twice per step (send() counts them too).
        extra = None if plan is None or plan.rung is None else plan.intent_extra(first=call.sends() == 0)

        def once() -> Awaitable[ModelResponse]:
            sending = model.call(request, run_id=run_id, step_id=step_id, idempotency_key=call.key)
            return sending if plan is None else plan.routed(sending)

        sent = await call.send(once, retry=s.retry, sleep=s.runtime.sleep, rng=s.runtime.random,
                               charge=log.charge, extra=extra, gate=gate)
        payload = call.finish(sent, require_tool=request.require_tool, output_type=agent.output_type,
                              extra=None if plan is None else plan.on_result())
        if payload["counters"]:
            log.charge(payload["counters"])
        if sent.response.escalations:  # the projection counts them from the response
            log.charge({"escalations": len(sent.response.escalations)})
        self._show(ModelStep(step_id=step_id, turn=turn, response=sent.response, idempotency_key=call.key,
                             attempts=sent.sends))
        return sent.response, payload

    def finish(self, turn: int, response: Turn) -> None:
        """Record (or replay) the run's final answer: ``response`` had no tool calls."""
        st, log = self.state, self.log
        rec = self._recorded("final", "result", "final", None, None)
        record = rec.payload if rec is not None else {"output": response.text, "turn": turn}  # a FinalResult
        if rec is None and st.output_data is not None:
            record["data"] = st.output_data  # the structured answer, as validated when it came
        if rec is None:
            log.stage(log.event("final", "result", "final", payload=record), "final.K1", "model.K6")
            faults.point("final.K0")
            log.commit()
            faults.point("final.K7")
        self._show(FinalStep(step_id="final", output=response.text, data=cast(FinalResult, dict(record))))
