"""The effect protocol: one side effect, journaled so that it never runs twice unknowingly.

A step is: ``intent`` (with the effect key) committed → the body run → the ``result`` journaled.
Where the journal holds an intent and no result, nobody knows whether the effect happened, and
the protocol asks before acting, never guesses:

- a tool that is idempotent (the receiver deduplicates by the effect key, or repeating is
  harmless) runs again with the same key;
- otherwise its lookup is asked: found → the receipt becomes the result; absence proven → sent
  again with the same key; no lookup, a lookup that fails, an earlier holder that may still be
  running the step (R23), or a bound reached → the step is journaled ``uncertain`` with the
  evidence and the run stops ``needs_human`` (:class:`~cuaderno.errors.UncertainEffect`);
- a person's ``resolve(happened=False)`` with nothing sent since lets it be sent again.

Every send is its own intent (``intent``, ``intent.2``...): each goes through the journal's
transaction checks, so a writer that was fenced out or a run cancelled since is refused before a
body runs again, never only at the result. A compensation is an effect like any other.

What replay needs from each journaled field:

- intent ``effect_key``: the key every later send, lookup and result of the step uses (a resume
  under another policy version derives another, which the receiver does not know);
  ``idempotent``: whether an unknown outcome is sent again without a lookup; ``policy_version``:
  the rules that allowed it; ``attempt``/``after`` (re-sends): which send and why it was made.
- result ``outcome`` (``ok``, ``error``, ``denied``) with ``value``, ``error`` or ``reason``: what
  the model is told, the same text on every replay; ``counters``: what the step spent beyond its
  first attempt; ``compensation``: what a cancellation undoes, decided when the effect happened.
- ``uncertain`` (``uncertain.N``: each try that stayed uncertain): the evidence a person reads.

The runner's tool steps and compensations, the episode parent's apply and the Temporal tool
activity write effect steps only through this module.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn

from cuaderno import faults
from cuaderno.durable.log import StepLog, numbered
from cuaderno.durable.model_call import Retrying
from cuaderno.errors import ErrorClass, PayloadTooLarge, ToolError, UncertainEffect
from cuaderno.events import RESTORE_STEP, StepEvent, encode_payload, new_event, not_happened_since_sent
from cuaderno.fingerprint import fingerprint
from cuaderno.journal.base import payload_limit

__all__ = ["BodyBug", "Effect", "Settled", "effect_key", "intent_event", "resolved_result", "restore_uncertain", "result_payload", "stage_result",
           "too_large_instead",
           "stage_uncertain"]

_AFTER_ERROR = {ErrorClass.INVALID_INPUT.value: "repairs", ErrorClass.CONFLICT.value: "replans",
                ErrorClass.PERMANENT.value: "reflects", ErrorClass.TRANSIENT.value: "reflects"}
"""What the model is asked to do next after a tool error of each class: repair its input,
replan on fresh state, or reflect on a refusal. Ambiguous errors are reconciled, bugs stop."""


def effect_key(tenant: str, task_id: str, effect_type: str, arguments: Mapping[str, Any], policy_version: str) -> str:
    """``hash(tenant, task_id, effect_type, canonical_arguments, policy_version)``.

    Derived from the intent, never from the attempt: retries and resumes of one intent share it.
    """
    return "eff-" + fingerprint([tenant, task_id, effect_type, arguments, policy_version])[:40]


def plus(counters: Mapping[str, int], name: str, n: int) -> dict[str, int]:
    """``counters`` with ``n`` more of ``name`` (unchanged when ``n`` is 0)."""
    out = dict(counters)
    if n:
        out[name] = out.get(name, 0) + n
    return out


def result_payload(outcome: str, value: Any = None, *, error: Mapping[str, Any] | None = None,
                   reason: str | None = None, effect_key: str | None = None,
                   counters: Mapping[str, int] | None = None, compensation: Mapping[str, Any] | None = None,
                   policy_version: str | None = None, tells_the_model: bool = True) -> dict[str, Any]:
    """The payload of an effect step's result. An outcome the model is told about (a denial, a
    classified error) counts as the second attempt it asks for (seed 001 §2): a repair, a replan
    or a reflection; a compensation's result tells no model (``tells_the_model=False``)."""
    kind = None if outcome == "ok" else (
        "reflects" if outcome == "denied" else _AFTER_ERROR.get(str((error or {}).get("error_class"))))
    counters = dict(counters) if counters else {}
    if outcome != "ok" and kind is not None and tells_the_model:
        counters = plus(counters, kind, 1)
    payload: dict[str, Any] = {"outcome": outcome}
    if outcome == "ok":
        payload["value"] = value
    if error is not None:
        payload["error"] = dict(error)
    if reason is not None:
        payload["reason"] = reason
    if policy_version is not None:  # a denial names the rules that decided it, as an intent does
        payload["policy_version"] = policy_version
    if effect_key is not None:
        payload["effect_key"] = effect_key
    if counters:
        payload["counters"] = counters
    if compensation:
        payload["compensation"] = dict(compensation)
    return payload


def too_large_instead(payload: dict[str, Any], store: object, run_id: str, step_id: str, *,
                      tells_the_model: bool = True) -> dict[str, Any]:
    """``payload``, or, when it is larger than the journal's per-payload limit
    (:func:`cuaderno.journal.base.payload_limit`), a small error record in its place: outcome
    ``error``, error ``PayloadTooLarge`` with the size and the limit, the effect key and the
    compensation kept (the effect happened: a cancellation must still undo it). The model is told
    (a permanent error: sending the same call again would return the same result), and the step is
    settled, so no resume or worker runs it again to meet the same refusal (pydantic-ai#7110).
    Replay reads the record as it is: the value that was too large was never journaled."""
    return _fitted(payload, store, run_id, step_id, tells_the_model=tells_the_model)[0]


_RAW_KEPT_BELOW = 1 << 20
"""Bytes under which a tool result's encoded payload is staged with its event (see :func:`_fitted`)."""


def _fitted(payload: dict[str, Any], store: object, run_id: str, step_id: str, *,
            tells_the_model: bool = True) -> tuple[dict[str, Any], bytes | None]:
    """:func:`too_large_instead`, and the payload's JSON bytes when it is kept and under
    :data:`_RAW_KEPT_BELOW` (``None`` for the error record or a large result): measuring it encodes it, and an event staged with those bytes is not encoded
    again when it is appended (:meth:`~cuaderno.events.StepEvent.encoded_payload`)."""
    limit = payload_limit(store)
    raw = encode_payload(payload)
    size = len(raw)
    if size <= limit:
        # Kept only while small: the bytes live until the append, beside the tool message the
        # model is told (the same value encoded again), so a large result's would add one copy
        # to the step's peak memory (the stated bound, docs/guide/retention-and-backups.md); its
        # append encodes it again, a cost in proportion to a size that is rare.
        return payload, raw if size < _RAW_KEPT_BELOW else None
    error = {"error_class": ErrorClass.PERMANENT.value, "sent": True, "type": "PayloadTooLarge", "size": size,
             "limit": limit, "message": str(PayloadTooLarge(run_id, step_id, "result", size, limit)).replace(
                 "nothing was written", "the result was not stored; the call itself was made")}
    return result_payload("error", error=error, effect_key=payload.get("effect_key"), counters=payload.get("counters"),
                          compensation=payload.get("compensation"), tells_the_model=tells_the_model), None


def restore_uncertain(run_id: str, evidence: Mapping[str, Any]) -> StepEvent:
    """The ``uncertain`` record a restore gives a run that may have gone on after the backup
    (:func:`cuaderno.operations.restore`): a tool step ``restore`` nobody can know the outcome of,
    so the run is ``needs_human``: no worker claims it, a resume raises ``UncertainEffect``. It
    names no tool, so no resume settles it by a lookup; a person ends the run (cancel) or forks it."""
    return StepEvent(run_id=run_id, step_id=RESTORE_STEP, phase="uncertain", kind="tool", payload=dict(evidence))


def stage_result(log: StepLog, step_id: str, tool: str, payload: Mapping[str, Any], *,
                 decision: str | None = None, fingerprint: str | None = None,
                 points: tuple[str, ...] = ("tool.K6",)) -> StepEvent:
    """Stage an effect step's result (see :func:`result_payload`): also the one record of a call
    that never ran (an unknown tool, arguments refused, a denial, a compensation with nothing to
    undo). ``points``: the crash points of the commit it rides on (the runner's sweep)."""
    ev = StepEvent(run_id=log.run_id, step_id=step_id, phase="result", kind="tool", name=tool, decision=decision,
                   fingerprint=fingerprint, payload=dict(payload))
    log.stage(ev, *points)
    return ev


def resolved_result(run_id: str, step_id: str, *, tool: str | None, fingerprint: str | None, value: Any,
                    record: Mapping[str, Any], effect_key: str | None) -> StepEvent:
    """The result of an uncertain step a person settled as happened (:func:`cuaderno.resolve`):
    the value they give is the step's result, and the escalation is counted. (``did not happen``
    is a ``resolution`` event, after which the protocol sends again with the same key.)"""
    return StepEvent(run_id=run_id, step_id=step_id, phase="result", kind="tool", name=tool, decision="resolved",
                     fingerprint=fingerprint, payload={"outcome": "ok", "value": value, "resolved": dict(record),
                                                       "effect_key": effect_key, "counters": {"escalations": 1}})


def intent_event(log: StepLog, step_id: str, tool: str, send: int, payload: Mapping[str, Any], *,
                 decision: str | None = None, fingerprint: str | None = None) -> StepEvent:
    """The intent of send ``send`` of an effect step (``intent``, then ``intent.N``)."""
    return StepEvent(run_id=log.run_id, step_id=step_id, phase="intent" if send == 1 else f"intent.{send}",
                     kind="tool", name=tool, decision=decision, fingerprint=fingerprint, payload=dict(payload))


def stage_uncertain(log: StepLog, step_id: str, tool: str, arguments: Mapping[str, Any], effect_key: str,
                    evidence: Mapping[str, Any]) -> NoReturn:
    """Journal that nobody knows whether the step's effect happened, with the evidence, commit,
    and stop the run (:class:`~cuaderno.errors.UncertainEffect`). A later resume may try again (a
    lookup that was unreachable may answer now): each try that stays uncertain is its own event,
    so the evidence of every attempt is kept."""
    evidence = {"tool": tool, "arguments": dict(arguments), "effect_key": effect_key, "last_receipt": None,
                **evidence}
    tries = len(numbered(log, step_id, "uncertain"))
    log.stage(StepEvent(run_id=log.run_id, step_id=step_id, phase="uncertain" if tries == 0 else f"uncertain.{tries + 1}",
                        kind="tool", name=tool, fingerprint=fingerprint({"name": tool, "arguments": dict(arguments)}),
                        payload=evidence))
    log.commit()
    raise UncertainEffect(log.run_id, step_id, evidence)


@dataclass(frozen=True, slots=True)
class Settled:
    """How an effect step ended: its staged result's payload (``outcome``, ``value`` or ``error``,
    ``counters``...). The caller tells the model and shows the step from it."""

    payload: dict[str, Any]

    @property
    def value(self) -> Any:
        return self.payload.get("value")

    @property
    def error(self) -> dict[str, Any] | None:
        error = self.payload.get("error")
        return error if isinstance(error, dict) else None


class BodyBug(Exception):
    """The body raised something unclassified (``unclassified="bug"``): its result (``error``,
    class ``bug``) is staged as :attr:`settled`; the caller ends the run failed and re-raises
    :attr:`cause`."""

    def __init__(self, cause: Exception, settled: Settled) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.settled = settled


@dataclass(kw_only=True, slots=True)
class Effect:
    """One effect step of one run (see the module docstring).

    Attributes:
        log: the run's journal.
        step_id: the step.
        tool: the effect's name (a tool's; ``apply`` for an episode's).
        arguments: what the body is called with (in the uncertainty's evidence).
        fingerprint: the arguments' fingerprint on every intent and result (``None``: unchecked).
        key: the effect key of a step never sent; a started step keeps the key its first intent
            holds (:meth:`effect_key`).
        body: runs the effect once (its argument: the attempt, 1 for the first send); raises
            :class:`~cuaderno.errors.ToolError` for a classified failure.
        lookup: asks the receiver whether the effect with this key happened (its argument: the
            attempt); returns the receipt or ``None`` when absence is proven. ``None``: no lookup.
        idempotent: the receiver deduplicates by the key (an unknown outcome is sent again).
        effect_free: the body only reads (an error after a re-send settles the step).
        decision: the policy decision journaled on the intents and result.
        policy_version: journaled on the intents (``None``: not recorded).
        retry: the bounds on retries of unsent transient failures and on re-sends.
        sleep, rng: the runtime's timer and random source (retry jitter).
        compensation: what undoes a value that happened (journaled with the result).
        tells_the_model: whether a failure counts as a second attempt the model is asked for.
        unclassified: what an exception that is not a ToolError means: ``bug`` (a declared tool
            classifies its failures: the run fails) or ``uncertain`` (a plain callback, which may
            have written half: nobody knows).
    """

    log: StepLog
    step_id: str
    tool: str
    arguments: Mapping[str, Any]
    fingerprint: str | None
    key: str
    body: Callable[[int], Awaitable[Any]]
    lookup: Callable[[int], Awaitable[Any]] | None = None
    idempotent: bool = False
    effect_free: bool = False
    decision: str | None = None
    policy_version: str | None = None
    retry: Retrying
    sleep: Callable[[float], Awaitable[None]]
    rng: random.Random = field(default_factory=random.Random)
    compensation: Callable[[Any], Mapping[str, Any] | None] = lambda value: None
    tells_the_model: bool = True
    unclassified: Literal["bug", "uncertain"] = "bug"
    _sends: int = field(default=0, init=False, repr=False)
    """The intents journaled for the step so far (set by ``__post_init__``, then counted)."""

    def __post_init__(self) -> None:
        first = self.log.get(self.step_id, "intent")
        if first is None:  # the common case: a step never sent (no intents to count)
            self._sends = 0
            return
        recorded = first.payload.get("effect_key")
        # A started step keeps the key it was first sent with, whatever this process would derive
        # now (a resume under another policy version): a lookup must ask about that key, and a
        # re-send must carry it, or the receiver sees a new effect and does it twice.
        if isinstance(recorded, str) and recorded:
            self.key = recorded
        self._sends = len(numbered(self.log, self.step_id, "intent"))

    @property
    def started(self) -> bool:
        """Whether an intent of the step is journaled (its body may have run)."""
        return self.log.get(self.step_id, "intent") is not None

    async def run(self) -> Settled:
        """Run the step to its result: a step never started runs its body; a started one is
        settled first (see the module docstring). Returns the staged result."""
        if not self.started:
            return await self._execute(attempt=1)
        if not_happened_since_sent(_Index(self.log), self.step_id):
            # A person established that the effect did not happen, and nothing was sent since:
            # send it, same key. (A send after the resolution is as unknown as any.)
            return await self._execute(attempt=2, counters={"retries": 1}, after="not_happened")
        last = numbered(self.log, self.step_id, "intent")[-1]
        return await self._reconcile(1, {"intent_seq": last.seq, "intent_at": last.created_at})

    # -- the body ---------------------------------------------------------------------------------

    def _intend(self, attempt: int, after: str | None) -> None:
        """Stage the intent that must commit before the body runs, for every run of it."""
        self._sends += 1
        payload: dict[str, object] = {"effect_key": self.key, "idempotent": self.idempotent}
        if self.policy_version is not None:
            payload["policy_version"] = self.policy_version
        if self._sends > 1:
            payload["attempt"] = attempt
            payload["after"] = after
        sends = self._sends
        self.log.stage(new_event(run_id=self.log.run_id, step_id=self.step_id,
                                 phase="intent" if sends == 1 else f"intent.{sends}", kind="tool", name=self.tool,
                                 decision=self.decision, fingerprint=self.fingerprint, payload=payload),
                       *(("tool.K1",) if sends == 1 else ()))

    async def _execute(self, *, attempt: int, counters: Mapping[str, int] | None = None,
                       after: str | None = None) -> Settled:
        """Run the body once its intent is durable; classify how it ended. ``after`` says why a
        body that may already have run is run again (``absent``: a lookup proved the effect
        missing; ``unknown``: an idempotent tool whose outcome is unknown; ``not_happened``: a
        person settled it); it is journaled on the re-send's intent."""
        counters = dict(counters) if counters else {}
        self._intend(attempt, after)
        retries = 0
        while True:
            faults.point("tool.K0")
            await self.log.commit_before_acting()
            faults.point("tool.K2")
            self.log.confirm_hold()
            try:
                value = await self.body(attempt)
                break
            except ToolError as err:
                faults.point("tool.K5")
                if err.error_class is ErrorClass.AMBIGUOUS:
                    # Sent, and the reply is lost: the same question as a crash in flight.
                    return await self._reconcile(attempt, {"last_error": err.to_json()}, counters)
                wait = None
                if err.error_class is ErrorClass.TRANSIENT and err.sent is False and retries < self.retry.max_retries:
                    wait = self.retry.delay(retries + 1, None, self.rng)
                if wait is None:
                    if attempt > 1 and after not in ("absent", "not_happened") and not self.effect_free:
                        # A re-send after an unknown outcome failed: that says nothing about the
                        # first send, which may have taken effect. Recording an error would be a
                        # guess. (After a proven absence, or a person's "did not happen", the
                        # first send is known not to have happened: the error is the outcome. So
                        # is it for a tool that only reads: there was no effect to wonder about.)
                        self._uncertain({"reason": "re-send after an unknown outcome failed",
                                         "last_error": err.to_json()})
                    return self._result("error", error=err.to_json(), counters=plus(counters, "retries", retries))
                retries += 1
                await self.sleep(wait)
                self._intend(attempt, "retry")
            except Exception as exc:
                if self.unclassified == "uncertain":
                    # Not classified: whether the effect happened is not known (it may have written half).
                    self._uncertain({"reason": f"{self.tool} raised", "error": repr(exc)[:500]})
                error = {"error_class": ErrorClass.BUG.value, "message": f"{type(exc).__name__}: {exc}",
                         "type": type(exc).__name__, "sent": None,
                         "traceback": traceback.format_exception(exc)[-6:]}
                raise BodyBug(exc, self._result("error", error=error)) from exc
        faults.point("tool.K5")
        # The compensation to schedule if the run is cancelled is decided now and journaled with
        # the result, so a cancellation can list it from the journal alone.
        return self._result("ok", value, counters=plus(counters, "retries", retries) if retries else counters,
                            compensation=self.compensation(value))

    # -- an unknown outcome -----------------------------------------------------------------------

    async def _reconcile(self, attempt: int, evidence: Mapping[str, Any],
                         counters: Mapping[str, int] | None = None) -> Settled:
        """An effect may or may not have happened: ask before acting, never guess."""
        counters = dict(counters or {})
        # The bound limits sending again, not finding out: a lookup that finds the receipt settles
        # the step whatever the bound (before, with max_resends=0 it was never asked).
        bound_reached = attempt > self.retry.max_resends
        if self.idempotent:
            if bound_reached:
                self._uncertain({**evidence, "reason": "re-send bound reached"})
            return await self._execute(attempt=attempt + 1, counters=plus(counters, "retries", 1), after="unknown")
        if self.lookup is None:
            said = numbered(self.log, self.step_id, "uncertain")
            if said and said[-1].seq > numbered(self.log, self.step_id, "intent")[-1].seq:
                # Already said since the last send, and nothing new can settle it: say it again,
                # write nothing (a resume that cannot help must not grow the journal).
                raise UncertainEffect(self.log.run_id, self.step_id, said[-1].payload)
            self._uncertain({**evidence, "reason": "no lookup for this tool"})
        faults.point("recovery.R1")
        try:
            found = await self.lookup(attempt + 1)
        except Exception as exc:
            self._uncertain({**evidence, "reason": "lookup failed", "lookup_error": repr(exc)[:500]})
        if found is None and "intent_seq" in evidence:
            # An intent this pass found in the journal: the holder that wrote it may be alive and
            # about to make the call (its lock was ended under it), and then "not found" is no
            # proof. Only a holder that let go or is provably gone leaves a proof (R23).
            earlier = self.log.earlier_holder(self.step_id)
            if earlier is not None:
                self._uncertain({**evidence, "reason": "the holder that sent it may still be running it",
                                 "lookup": "found no effect", "earlier_holder": earlier})
        if found is None:  # absence proven: the only case where sending again is safe
            if bound_reached:
                self._uncertain({**evidence, "reason": "re-send bound reached", "lookup": "found no effect"})
            return await self._execute(attempt=attempt + 1, counters=plus(counters, "retries", 1), after="absent")
        # Found: the effect happened, so a cancellation must be able to undo it like any other.
        return self._result("ok", found, counters=plus(counters, "reconciled", 1),
                            compensation=self.compensation(found))

    # -- records ----------------------------------------------------------------------------------

    def _result(self, outcome: str, value: Any = None, *, error: Mapping[str, Any] | None = None,
                counters: Mapping[str, int] | None = None,
                compensation: Mapping[str, Any] | None = None) -> Settled:
        payload = result_payload(outcome, value, error=error, effect_key=self.key, counters=counters,
                                 compensation=compensation, tells_the_model=self.tells_the_model)
        payload, raw = _fitted(payload, getattr(self.log, "store", None), self.log.run_id, self.step_id,
                               tells_the_model=self.tells_the_model)
        # The payload was built here for this event: staged as it is (stage_result copies a
        # caller's), with the bytes measuring it gave (the append does not encode it again; nothing
        # changes it meanwhile: the caller only reads it, to tell the model and show the step).
        self.log.stage(new_event(run_id=self.log.run_id, step_id=self.step_id, phase="result", kind="tool",
                                 name=self.tool, decision=self.decision, fingerprint=self.fingerprint,
                                 payload=payload, raw=raw), "tool.K6")
        return Settled(payload)

    def _uncertain(self, evidence: Mapping[str, Any]) -> NoReturn:
        stage_uncertain(self.log, self.step_id, self.tool, self.arguments, self.key, evidence)


class _Index:
    """A log read as the ``(step_id, phase)`` mapping :func:`cuaderno.events.not_happened_since_sent` probes."""

    __slots__ = ("log",)

    def __init__(self, log: StepLog) -> None:
        self.log = log

    def get(self, key: tuple[str, str]) -> StepEvent | None:
        return self.log.get(*key)
