"""Model turns: replay a recorded response, or send the request once its intent is durable."""

from __future__ import annotations

import dataclasses
from typing import Any

from cuaderno._json import not_plain, shown
from cuaderno.errors import ErrorClass, GatewayError
from cuaderno.events import StepEvent, model_step_id
from cuaderno.fingerprint import idempotency_key
from cuaderno.gateway.base import ModelRequest, ModelResponse, ToolCall, assistant_message
from cuaderno.gateway.empty import Outcome, classify_response
from cuaderno.gateway.ladder import climb
from cuaderno.loop._state import RunState, Turn, Unrecorded
from cuaderno.loop.output import check_output, feedback_messages
from cuaderno.loop.steps import FinalStep, ModelStep
from cuaderno.testing import crash

__all__ = ["ModelSteps"]


def plain_calls(response: ModelResponse) -> ModelResponse:
    """The response with every tool call whose arguments are not plain JSON (NaN, nesting too
    deep: a custom gateway may pass them on) turned into a call the model must repair. Done before
    the response is journaled: it was paid for, and must be journaled whatever it holds."""
    if all(c.arguments_error is not None or not_plain(c.arguments) is None for c in response.tool_calls):
        return response
    calls = []
    for c in response.tool_calls:
        problem = None if c.arguments_error is not None else not_plain(c.arguments)
        if problem is not None:
            c = dataclasses.replace(c, arguments={}, arguments_error=f"arguments hold {problem}",
                                    raw_arguments=c.raw_arguments or shown(c.arguments))
        calls.append(c)
    return dataclasses.replace(response, tool_calls=tuple(calls))


def accepted(payload: dict[str, Any]) -> bool:
    """Whether a model result payload's response joins the conversation (not rejected as empty
    or refused). Results journaled before verdicts existed have none, and are accepted."""
    verdict = payload.get("verdict")
    return verdict is None or verdict.get("outcome") == Outcome.OK


class ModelSteps(RunState):
    """The model half of the loop."""

    output_data: Any = None
    """The validated structured answer of the last accepted response (``output_type`` only)."""

    async def _model_turn(self, turn: int) -> Turn | None:
        """Replay or make turn ``turn``'s model call. ``None`` means the response was rejected
        (empty or refused): it is journaled and counted, and the turn is asked again."""
        replayed = self._replay_model_turn(turn)
        if not isinstance(replayed, Unrecorded):
            return replayed
        step_id, fp = replayed
        # A call in flight when the run was migrated was sent with the old configuration's body;
        # it is sent again with the new one (another key), counted as possibly billed twice.
        first = self.journal.get((step_id, "intent"))
        self._recorded(step_id, "intent", "model", None,
                       None if first is not None and first.seq < self.migrate_seq else fp)
        response, payload = await self._call_model(turn, step_id, fp)
        if not accepted(payload):
            for message in feedback_messages(payload):  # an invalid structured answer: told why
                self._add_message(message)
            return None  # otherwise not part of the conversation: the same request is asked again
        self._add_message(assistant_message(payload["response"]))
        self.output_data = payload.get("output")
        return Turn(response.text, response.tool_calls)

    def _replay_model_turn(self, turn: int) -> Turn | None | Unrecorded:
        """Turn ``turn``'s model call as the journal holds it, or :class:`Unrecorded` (with the
        step id and request fingerprint the call must be made with) when it has no response.

        Synchronous: replaying reads only the journal already in memory, and adds the message.
        """
        step_id = model_step_id(turn)
        rec = self.journal.get((step_id, "result"))
        if rec is not None and rec.fingerprint and (turn > 0 or self.migrated) and not self.s.verify_replay:
            # Past turn 0 a recorded request is a pure function of the configuration and the task
            # (both checked at turn 0) and of journaled results (hash-chained), so the recorded
            # chain is adopted instead of re-hashing every message: resume stays O(rows), not
            # O(bytes). ``Session(verify_replay=True)`` re-derives and checks every turn.
            self.chain = rec.fingerprint
            self.unhashed.clear()
            self.rebased = self.rebased or (self.rebase_turn is not None and turn >= self.rebase_turn)
        elif self.migrated and not self.rebased and (turn == self.rebase_turn or self.rebase_turn is None):
            # The first request after a migration has the new configuration in its body, so its
            # fingerprint (and provider key) says so, the same way in every process.
            self.rebased = True
            self.unhashed.append({"migrated_to": self.config_fp})
        fp = self._request_fingerprint()
        rec = self._recorded(step_id, "result", "model", None, fp)
        if rec is None or rec.payload.get("response") is None:
            return Unrecorded(step_id, fp)
        if not accepted(rec.payload):
            for message in feedback_messages(rec.payload):
                self._add_message(message)
            return None
        data: dict[str, Any] = rec.payload["response"]
        self._add_message(assistant_message(data))
        self.output_data = rec.payload.get("output")
        # Only what the loop reads of the response is rebuilt (the whole ModelResponse is three
        # times the work, and a resume replays every turn).
        return Turn(data.get("text") or "", tuple(ToolCall.from_json(c) for c in data.get("tool_calls") or ()))

    async def _call_model(self, turn: int, step_id: str, fp: str) -> tuple[ModelResponse, dict[str, Any]]:
        """Send the request once its intent is durable; return the response and its staged result
        payload."""
        request = ModelRequest(instructions=self.agent.instructions, messages=tuple(self._conversation()),
                               tools=self.agent.tool_schemas, model=self.agent.model,
                               require_tool=self.agent.require_tool, max_output_tokens=self.agent.max_output_tokens,
                               temperature=self.agent.temperature)
        plan = climb(self, self.s.gateway, turn, request)  # the empty-generation ladder's rung, if any
        request = plan.request
        key = idempotency_key(self.run_id, step_id, plan.keyed(fp))
        sends = self._recorded_count(step_id, "intent")
        last_error = self.journal.get((step_id, f"error.{sends}"))
        sends += 1
        after = None if sends == 1 else "crash"
        if last_error is not None:
            # The last send ended in a journaled, classified failure: only an ambiguous one may
            # have been billed; a refused or unsent request was not.
            ambiguous = last_error.payload.get("error", {}).get("error_class") == ErrorClass.AMBIGUOUS
            after = "ambiguous" if ambiguous else "error"
        self._stage(plan.noted(self._intent(step_id, sends, key, turn, after), first=sends == 1), "model.K1")
        retries = resends = 0
        left = False  # did any attempt of this send leave the process (or may it have)?
        while True:
            crash.point("model.K0")
            await self._flush_durable()
            crash.point("model.K2")
            try:
                response = plain_calls(await plan.routed(self.model.call(request, run_id=self.run_id,
                                                                         step_id=step_id, idempotency_key=key)))
                break
            except GatewayError as err:
                left = left or err.sent is not False
                wait = self._retry_wait(err, retries, resends)
                if wait is None:
                    # Journal the failure as known evidence, with what the step spent before it
                    # failed (retries, rejected lower-tier calls), so the accounting stays whole.
                    counters = {"retries": retries} if retries else {}
                    self.charge(counters)
                    if not left:
                        # The intent counted a send, and nothing left the process (the SDK refused
                        # the request before any byte was written): the failure takes it back, so
                        # model_sends counts only requests a provider may have seen.
                        counters = {**counters, "model_sends": -1}
                    self._stage(self._event(step_id, f"error.{sends}", "model", fingerprint=fp,
                                            payload={"error": err.to_json(), "key": key, "counters": counters}))
                    self._flush()
                    raise
                if err.error_class is ErrorClass.AMBIGUOUS:
                    resends += 1
                    sends += 1
                    self._stage(self._intent(step_id, sends, key, turn, "ambiguous"), "model.K1")
                else:
                    retries += 1
                await self.s.runtime.sleep(wait)
        crash.point("model.K5")
        verdict = classify_response(response, require_tool=request.require_tool)
        output = None
        if verdict.ok and not response.tool_calls and self.agent.output_type is not None:
            verdict, output = check_output(self.agent.output_type, response)
        counters = {"retries": retries} if retries else {}
        if verdict.rejected:
            counters["rejected_responses"] = 1
        self.charge(counters)
        self.charge({"escalations": len(response.escalations)})  # the projection counts them from the response
        payload = {"response": response.to_json(), "key": key, "sends": sends, "verdict": verdict.to_json(),
                   "counters": counters, **plan.on_result()}
        if output is not None:
            payload["output"] = output  # the validated value: what the final record and replay use
        self._stage(self._event(step_id, "result", "model", fingerprint=fp, payload=payload), "model.K6")
        self._show(ModelStep(step_id=step_id, turn=turn, response=response, idempotency_key=key, attempts=sends))
        return response, payload

    def _intent(self, step_id: str, send: int, key: str, turn: int, after: str | None) -> StepEvent:
        payload: dict[str, Any] = {"key": key, "turn": turn}
        if after is not None:
            payload["after"] = after
        return self._event(step_id, "intent" if send == 1 else f"intent.{send}", "model", fingerprint=self.chain,
                           payload=payload)

    def _retry_wait(self, err: GatewayError, retries: int, resends: int) -> float | None:
        policy = self.s.retry
        if err.error_class is ErrorClass.TRANSIENT and retries < policy.max_retries:
            return policy.delay(retries + 1, err.retry_after, self.s.runtime.random)
        if err.error_class is ErrorClass.AMBIGUOUS and resends < policy.max_resends:
            return policy.delay(resends + 1, err.retry_after, self.s.runtime.random)
        return None

    def _finish(self, turn: int, response: Turn) -> None:
        rec = self._recorded("final", "result", "final", None, None)
        record = rec.payload if rec is not None else {"output": response.text, "turn": turn}
        if rec is None and self.output_data is not None:
            record["data"] = self.output_data  # the structured answer, as validated when it came
        if rec is None:
            self._stage(self._event("final", "result", "final", payload=record), "final.K1", "model.K6")
            crash.point("final.K0")
            self._flush()
            crash.point("final.K7")
        self._show(FinalStep(step_id="final", output=response.text, data=dict(record)))

    # -- tool calls -------------------------------------------------------------------------------
