"""The model-call protocol: one model step, journaled so that no inference is paid twice
unknowingly.

A step is: ``intent`` (with the provider idempotency key) committed → the request sent → the
response journaled as the ``result``. A resumed step finds its result and pays nothing. A send
whose fate is unknown (the process died after the intent, or the reply was lost: ``ambiguous``)
is sent again with the **same key**, after a new intent (``intent.2``, ``intent.3``...) that says
why (``after``: ``crash``, ``ambiguous``, ``error``): each is counted as possibly billed twice. A
classified failure that ends the step is journaled as ``error.N`` (N: the send it ended), and a
request that provably never left the process takes back the send its intent counted.

What replay needs from each journaled field:

- intent ``key``: the key every later send of the step carries (the provider deduplicates on it);
  ``turn``: the loop's turn; ``after``: why an earlier send's fate is unknown (the projection
  counts re-sends from it); anything the caller adds (``extra``: the ladder's rung, Temporal's
  message references) is the caller's to read back.
- result ``response``: what the conversation continues with (never asked for again); ``key`` and
  ``sends``: the key it was answered under and how many sends it took; ``verdict``: whether the
  response joins the conversation (an empty or refused generation is journaled, counted and asked
  again); ``counters``: what the step spent beyond its first send; ``output``: the validated
  structured answer; ``framework`` (``name``, ``payload``): a caller's own response, as its
  framework dumps it (:class:`FrameworkPayload`), handed back unchanged on replay
  (:meth:`ModelCall.framework_payload`): ``response`` is then cuaderno's reading of it, for what
  reads every run alike (``cuaderno show``, verdicts, usage and cost).

The runner (:mod:`cuaderno.loop`), the Temporal model activity and any other caller write model
steps only through :class:`ModelCall`.

A provider's shared rate limit (:class:`Gate`, :mod:`cuaderno.flow.ratelimit`) is passed
*before* a send's intent is staged: a request that must wait for its turn has written nothing,
used no key and counts as no send, and one refused for waiting too long leaves the journal as it
was. A retry under the same intent, or before an ambiguous re-send's intent, takes its turn
again (no bound then: the intent is already written, and waiting is what a retry does).
Between the intent's commit and the send the gate looks again (:meth:`Gate.ready`): a pause that
began meanwhile holds the request there. A hold that ends without a send (refused past
``max_wait``, cancelled, the limiter's table failing) journals ``error.N`` taking back the send
its intent counted, so the resume is not counted as possibly billed twice; a crash during the
hold leaves a bare intent, which a resume cannot tell from a crash after the send (``crash``,
counted as possibly billed twice, re-sent with the same key). Any exit between the turn and the
send releases the turn (:meth:`Gate.unsent`): a probe's hold on the other workers ends at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from cuaderno import faults
from cuaderno.durable.log import StepLog, numbered
from cuaderno.errors import ErrorClass, GatewayError, ReplayDivergence, ResponseTooLarge, UsageError
from cuaderno.events import StepEvent, encode_payload, new_event
from cuaderno.gateway.base import ModelResponse
from cuaderno.gateway.empty import Outcome, classify_response
from cuaderno.gateway.structured import check_output
from cuaderno.journal.base import payload_limit
from cuaderno.plainjson import not_plain, shown

if TYPE_CHECKING:
    from cuaderno.events.payloads import ModelResult

__all__ = ["FrameworkPayload", "Gate", "ModelCall", "Retrying", "Sent", "accepted", "plain_calls"]


class Retrying(Protocol):
    """How often and how long a step tries again (:class:`cuaderno.RetryPolicy`)."""

    @property
    def max_retries(self) -> int: ...

    @property
    def max_resends(self) -> int: ...

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float | None: ...


class Gate(Protocol):
    """A model request's turn under a rate limit shared with other workers
    (:class:`cuaderno.flow.ratelimit.RateGate`)."""

    async def admit(self, *, bounded: bool = True) -> None:
        """Wait for the request's turn. ``bounded``: refuse a wait past the limit's ``max_wait``
        (:class:`~cuaderno.errors.RateLimitWaitTooLong`) instead of waiting."""
        ...

    async def ready(self, *, bounded: bool = True) -> None:
        """Between the intent's commit and the send: hold the request if a pause (or another
        probe) began since its turn was taken, until it may go (``bounded`` as :meth:`admit`)."""
        ...

    def unsent(self) -> None:
        """The turn taken will not be sent (the send raised or was cancelled before it left):
        a probe's hold on the other requests ends at once."""
        ...

    def sending(self) -> AbstractContextManager[None]:
        """Around one send: what the provider's answer says about the limit is shared."""
        ...

    def answered(self, response: ModelResponse) -> None:
        """The send was answered: its usage sets the counted tokens right."""
        ...


@dataclass(frozen=True, slots=True)
class Sent:
    """A send that was answered: the response, the sends the step took (its last intent's
    number) and the retries of requests that provably did not reach the provider."""

    response: ModelResponse
    sends: int
    retries: int = 0


@dataclass(frozen=True, slots=True)
class FrameworkPayload:
    """A framework's own response, journaled with a model step's result and handed back as it
    is on replay (the framework goes on with its own object, not a conversion of cuaderno's).

    ``name`` says whose dump it is (``pydantic-ai``, ``openai-agents``): a replay that reads the
    step as another framework's is a divergence. ``payload`` must be plain JSON (what the
    journal holds: strings, finite numbers, lists, objects with string keys).
    """

    name: str
    payload: Any


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


def accepted(payload: Mapping[str, Any]) -> bool:
    """Whether a model result payload's response joins the conversation (not rejected as empty
    or refused). Results journaled before verdicts existed have none, and are accepted."""
    verdict = payload.get("verdict")
    return verdict is None or verdict.get("outcome") == Outcome.OK


class ModelCall:
    """One model step of one run (see the module docstring).

    Args:
        log: the run's journal.
        step_id: the step (``tNNNN.model``).
        key: the provider idempotency key: every send of the step carries it.
        turn: the loop's turn, journaled on each intent.
        fingerprint: the request's fingerprint, journaled on the intents, errors and result (a
            replay that would send another request is a divergence); ``None`` when the caller
            checks the request another way (Temporal: the workflow's history).

        keep_key: a step already started keeps the key its first intent carried, whatever
            ``key`` this process derived (as :class:`~cuaderno.durable.Effect` keeps its effect
            key): the provider may have seen that key, and a send under another one is billed as
            a new request. For a caller whose request at a step never changes (a framework
            integration: another request there is a divergence). The runner derives its key
            from the request itself (its body, the ladder's rung) and leaves this off: a run
            migrated to another configuration sends another body, which must not carry the key
            of the old one (the provider would answer it with the old body's response).
    """

    __slots__ = ("fingerprint", "key", "log", "step_id", "turn")

    def __init__(self, log: StepLog, step_id: str, *, key: str, turn: int, fingerprint: str | None = None,
                 keep_key: bool = False) -> None:
        self.log = log
        self.step_id = step_id
        self.key = key
        self.turn = turn
        self.fingerprint = fingerprint
        if keep_key:
            first = log.get(step_id, "intent")
            recorded = first.payload.get("key") if first is not None else None
            if isinstance(recorded, str) and recorded:
                self.key = recorded

    # -- reading ------------------------------------------------------------------------------

    def answered(self) -> StepEvent | None:
        """The step's journaled result, when it holds a response (nothing is sent again)."""
        rec = self.log.get(self.step_id, "result")
        return rec if rec is not None and rec.payload.get("response") is not None else None

    def framework_payload(self, name: str) -> Any:
        """The framework payload journaled with the step's result (see :class:`FrameworkPayload`),
        or ``None`` when the step has no result or its result holds none (a result the runner
        journaled, or one journaled before payloads existed: the caller decides what that means).

        Raises:
            ReplayDivergence: the result holds another framework's payload.
        """
        rec = self.answered()
        held = rec.payload.get("framework") if rec is not None else None
        if not isinstance(held, dict):
            return None
        if held.get("name") != name:
            raise ReplayDivergence(self.log.run_id, self.step_id, f"a response of {held.get('name')!r}",
                                   f"a response of {name!r}")
        return held.get("payload")

    def sends(self) -> int:
        """How many sends the journal holds intents for."""
        return len(numbered(self.log, self.step_id, "intent"))

    def next_send(self) -> tuple[int, str | None]:
        """The number of this process's first send of the step, and why an earlier send's fate is
        unknown (``None`` for a first send): ``crash`` (its process died after the intent),
        ``ambiguous`` (its last failure was), ``error`` (its last failure was classified and
        provably not billed: a refused or unsent request)."""
        sends = self.sends()
        if sends == 0:
            return 1, None
        last_error = self.log.get(self.step_id, f"error.{sends}")
        if last_error is None:
            return sends + 1, "crash"
        ambiguous = last_error.payload.get("error", {}).get("error_class") == ErrorClass.AMBIGUOUS
        return sends + 1, "ambiguous" if ambiguous else "error"

    # -- writing ------------------------------------------------------------------------------

    def intend(self, send: int, *, after: str | None = None, extra: Mapping[str, Any] | None = None) -> None:
        """Stage the intent of send ``send`` (``intent``, then ``intent.N``): it must commit before
        the request leaves (:meth:`send` commits it)."""
        payload: dict[str, object] = {"key": self.key, "turn": self.turn}
        if after is not None:
            payload["after"] = after
        if extra:
            payload.update(extra)
        self.log.stage(new_event(run_id=self.log.run_id, step_id=self.step_id,
                                 phase="intent" if send == 1 else f"intent.{send}", kind="model",
                                 fingerprint=self.fingerprint, payload=payload), "model.K1")

    def failed(self, send: int, error: GatewayError, counters: Mapping[str, int]) -> None:
        """Journal the classified failure that ended send ``send`` (``error.N``), with what the
        step spent before it failed, and commit it."""
        self.log.stage(StepEvent(run_id=self.log.run_id, step_id=self.step_id, phase=f"error.{send}", kind="model",
                                 fingerprint=self.fingerprint,
                                 payload={"error": error.to_json(), "key": self.key, "counters": dict(counters)}))
        self.log.commit()

    async def send(self, request: Callable[[], Awaitable[ModelResponse]], *, retry: Retrying,
                   sleep: Callable[[float], Awaitable[None]], rng: random.Random,
                   charge: Callable[[dict[str, int]], None] = lambda counters: None,
                   extra: Mapping[str, Any] | None = None, gate: Gate | None = None) -> Sent:
        """Send the step's request once its intent is durable, trying again as ``retry`` allows.

        ``request`` makes one send (with :attr:`key`). A transient failure that provably did not
        reach the provider is retried under the same intent; an ambiguous one is sent again after
        a new intent; any other, or one past the bounds, is journaled (:meth:`failed`) and raised.
        ``charge`` is told what a failed step spent before it is journaled; ``extra`` goes on this
        process's first intent (the ladder's rung); ``gate``: the provider's shared rate limit,
        passed before the intent (see the module docstring).

        Raises:
            RateLimitWaitTooLong: the gate's turn is further than its ``max_wait``; nothing was
                staged or sent.
        """
        sends, after = self.next_send()
        if gate is None:
            return await self._send(request, sends, after, retry, sleep, rng, charge, extra, None)
        await gate.admit()
        try:
            return await self._send(request, sends, after, retry, sleep, rng, charge, extra, gate)
        except BaseException:
            gate.unsent()  # a probe's turn lost before its send (a no-op once the send began)
            raise

    async def _send(self, request: Callable[[], Awaitable[ModelResponse]], sends: int, after: str | None,
                    retry: Retrying, sleep: Callable[[float], Awaitable[None]], rng: random.Random,
                    charge: Callable[[dict[str, int]], None], extra: Mapping[str, Any] | None,
                    gate: Gate | None) -> Sent:
        self.intend(sends, after=after, extra=extra)
        retries = resends = 0
        left = False  # did any attempt of this send leave the process (or may it have)?
        while True:
            faults.point("model.K0")
            await self.log.commit_before_acting()
            faults.point("model.K2")
            if gate is not None:
                try:
                    # The turn may have been overtaken while the intent was committed (a pause
                    # another worker learned of): held here, after the intent, before the send.
                    await gate.ready(bounded=retries + resends == 0)
                except (Exception, asyncio.CancelledError) as exc:
                    self._unsent(sends, exc, retries, left, charge)
                    raise
            try:
                if gate is None:  # no context manager to enter: the common case, per step
                    response = plain_calls(await request())
                else:
                    with gate.sending():
                        response = plain_calls(await request())
                break
            except GatewayError as err:
                left = left or err.sent is not False
                wait = _retry_wait(retry, err, retries, resends, rng)
                if wait is None:
                    counters = {"retries": retries} if retries else {}
                    charge(counters)
                    if not left:
                        # The intent counted a send, and nothing left the process (the SDK refused
                        # the request before any byte was written): the failure takes it back, so
                        # model_sends counts only requests a provider may have seen.
                        counters = {**counters, "model_sends": -1}
                    self.failed(sends, err, counters)
                    raise
                await sleep(wait)
                if gate is not None:
                    await gate.admit(bounded=False)
                if err.error_class is ErrorClass.AMBIGUOUS:
                    resends += 1
                    sends += 1
                    self.intend(sends, after="ambiguous")
                else:
                    retries += 1
        if gate is not None:
            gate.answered(response)
        faults.point("model.K5")
        return Sent(response, sends, retries)

    def _unsent(self, send: int, exc: BaseException, retries: int, left: bool,
                charge: Callable[[dict[str, int]], None]) -> None:
        """Journal that send ``send`` was held by the rate limit after its intent and never left
        (refused for waiting past ``max_wait``, cancelled, or the limiter's table failed): an
        ``error.N`` that takes back the send its intent counted (unless an earlier attempt of it
        left), so a resume sends again after ``error``, not counted as possibly billed twice.
        Best effort: if it cannot be journaled, a resume reads the bare intent as a crash."""
        counters = {"retries": retries} if retries else {}
        err = GatewayError(f"held by the rate limit after the intent, not sent: {type(exc).__name__}: {exc}"[:500],
                           error_class=ErrorClass.TRANSIENT, sent=left)
        try:
            charge(counters)
            self.failed(send, err, counters if left else {**counters, "model_sends": -1})
        except Exception:  # the caller raises the hold's own error
            pass

    def finish(self, sent: Sent, *, require_tool: bool = False, output_type: Any = None,
               extra: Mapping[str, Any] | None = None, framework: FrameworkPayload | None = None) -> ModelResult:
        """Stage the step's result: the response with its verdict (empty or refused generations
        rejected; a structured answer validated against ``output_type``) and counters; returns
        its payload. The caller commits it with its next commit (the runner: with the next
        intent, or the run's end). ``framework``: the caller's own response, journaled with it
        (:meth:`framework_payload` gives it back).

        Raises:
            UsageError: ``framework`` is not a named, plain-JSON payload; nothing is staged (the
                step stays sent and unanswered: a resume sends it again with its key, counted).
            ResponseTooLarge: the result would be over the journal's per-payload limit; the
                send is journaled as failed (``error.N``, committed) instead of the result.
        """
        held = None if framework is None else _framework(framework)
        response = sent.response
        verdict = classify_response(response, require_tool=require_tool)
        output = None
        if verdict.ok and not response.tool_calls and output_type is not None:
            verdict, output = check_output(output_type, response)
        counters = {"retries": sent.retries} if sent.retries else {}
        if verdict.rejected:
            counters["rejected_responses"] = 1
        payload: dict[str, object] = {"response": response.to_json(), "key": self.key, "sends": sent.sends,
                                      "verdict": verdict.to_json(), "counters": counters, **(extra or {})}
        if output is not None:
            payload["output"] = output  # the validated value: what the final record and replay use
        if held is not None:
            payload["framework"] = held
        self._refuse_too_large(sent, payload, counters, held)
        self.log.stage(new_event(run_id=self.log.run_id, step_id=self.step_id, phase="result", kind="model",
                                 fingerprint=self.fingerprint, payload=payload), "model.K6")
        result: ModelResult = payload  # type: ignore[assignment]  # built above with the keys it declares
        return result


    def _refuse_too_large(self, sent: Sent, payload: dict[str, object], counters: dict[str, int],
                          held: FrameworkJSON | None) -> None:
        """Journal the send as failed and raise :class:`ResponseTooLarge` when ``payload`` is over
        the journal's limit: an append refused later would stop the run mid-step, with the answer
        neither journaled nor reported as a failure (and a resume would meet it again)."""
        limit = payload_limit(getattr(self.log, "store", None))
        # A bound first, so that an ordinary answer is not encoded twice (the append encodes it):
        # a character takes at most 6 bytes of JSON (an escape), and the other fields are small.
        if _rough_chars(sent.response, held) * 6 + 65_536 < limit:
            return
        size = len(encode_payload(payload))
        if size <= limit:
            return
        err = ResponseTooLarge(self.log.run_id, self.step_id, size, limit)
        self.failed(sent.sends, err, counters)
        raise err


def _rough_chars(response: ModelResponse, held: FrameworkJSON | None) -> int:
    """At least the characters the result's JSON holds beyond its small fields: the text twice
    (a validated output is parsed from it), the reasoning, refusal and every call's arguments."""
    n = 2 * len(response.text) + len(response.reasoning or "") + len(response.refusal or "")
    for call in response.tool_calls:
        n += len(call.raw_arguments or "") + len(str(call.arguments)) + len(call.name)
    if held is not None:
        n += len(str(held))
    return n


class FrameworkJSON(TypedDict):
    """The journaled form of a :class:`FrameworkPayload` (the result's ``framework``)."""

    name: str
    payload: object
    """Plain JSON, checked by :func:`_framework` before anything is staged."""


def _framework(framework: FrameworkPayload) -> FrameworkJSON:
    """The journaled form of ``framework``, checked before anything is staged."""
    if not isinstance(framework, FrameworkPayload) or not isinstance(framework.name, str) or not framework.name:
        raise UsageError(f"a framework payload is a FrameworkPayload with a non-empty name, got {framework!r}"[:300])
    problem = not_plain(framework.payload)
    if problem is not None:
        raise UsageError(f"the {framework.name} framework payload is not plain JSON: it holds {problem}")
    return {"name": framework.name, "payload": framework.payload}


def _retry_wait(retry: Retrying, err: GatewayError, retries: int, resends: int, rng: random.Random) -> float | None:
    if err.error_class is ErrorClass.TRANSIENT and retries < retry.max_retries:
        return retry.delay(retries + 1, err.retry_after, rng)
    if err.error_class is ErrorClass.AMBIGUOUS and resends < retry.max_resends:
        return retry.delay(resends + 1, err.retry_after, rng)
    return None
