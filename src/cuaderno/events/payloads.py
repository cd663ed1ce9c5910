"""The payload of every ``(kind, phase)``, as a type: its JSON form, read-only.

Each type is a ``TypedDict`` whose keys are all ``ReadOnly``: the value a reader gets is the
payload as decoded from the journal (:attr:`StepEvent.payload`), typed key by key, and the type
checker refuses any write to it. Why a view of the JSON and not a copy into an object: the
checkpoint's projection folds every event of a run on every resume and on every append
(:func:`cuaderno.checkpoint.project`), and an object built per event costs more than the fold
itself (a ``__slots__`` object with three fields, built from the dict: +130 to +190 ns an event,
against 0.88 us for the whole fold; a frozen dataclass more). A view costs nothing, and the
journal's bytes cannot change, since nothing is converted: the JSON form *is* the value.

The docstring of each type says what replay and the projection need from each field. Keys not
declared here (written by a newer cuaderno, or by a caller through ``extra``) are kept, not
dropped: a reader only reads what it declares.

:data:`PAYLOADS` names the type of every ``(kind, phase family)`` of :mod:`cuaderno.events.names`;
:func:`check` holds a decoded payload to its type (the keys it requires, the JSON type of every key
it declares) where the input is not our own (an imported history, a journal from elsewhere) and
raises :class:`PayloadMalformed` naming the run, the step and the key. :func:`view` is the typed
read of an event's payload, for the paths that trust the chain-checked journal they read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, Required, TypedDict, TypeVar, cast

from cuaderno.errors import JournalCorrupt
from cuaderno.events import shown_payload
from cuaderno.events.names import Kind, Phase, family

if TYPE_CHECKING:
    from typing_extensions import ReadOnly

    from cuaderno.events import StepEvent

__all__ = [
    "PAYLOADS",
    "ApprovalDecision",
    "ApprovalRequest",
    "CallRecord",
    "CancelRequest",
    "CancelState",
    "Charged",
    "ConversationMessage",
    "Counters",
    "Escalation",
    "FinalResult",
    "InFlight",
    "ModelError",
    "ModelIntent",
    "ModelResult",
    "Outcome",
    "PassDecision",
    "PassIntent",
    "PassResult",
    "PayloadMalformed",
    "PendingApproval",
    "Response",
    "RunCounters",
    "RunEnd",
    "RunMigrate",
    "RunPass",
    "RunStart",
    "SnapshotBase",
    "ToolCallJSON",
    "ToolDecision",
    "ToolIntent",
    "ToolResolution",
    "ToolResult",
    "ToolUncertain",
    "UncertainEvidence",
    "UsageJSON",
    "check",
    "shown_as",
    "type_of",
    "view",
]

Counters = Mapping[str, int]
"""Counters a step charged, by name (:data:`cuaderno.checkpoint.COUNTERS`); added to the run's."""


# -- parts ---------------------------------------------------------------------------------------


class UsageJSON(TypedDict, total=False):
    """Tokens one call used (``Usage.to_json``); the projection adds each to the run's counter."""

    input_tokens: ReadOnly[int]
    output_tokens: ReadOnly[int]
    cached_tokens: ReadOnly[int]
    reasoning_tokens: ReadOnly[int]


class ToolCallJSON(TypedDict, total=False):
    """One tool call the model asked for (``ToolCall.to_json``). Replay rebuilds the call from it
    and the tool step at its index (``tNNNN.toolMM``) runs it."""

    id: Required[ReadOnly[str]]
    name: Required[ReadOnly[str]]
    arguments: ReadOnly[Mapping[str, Any]]
    arguments_error: ReadOnly[str]
    """Set when the model's arguments were not JSON: the call is refused, the model told why."""
    raw_arguments: ReadOnly[str | None]


class CallRecord(TypedDict, total=False):
    """What the journal keeps of every model call's answer, accepted (:class:`Response`) or
    rejected (:class:`Escalation`): the same fields of ``ModelResponse``, under the same names."""

    usage: ReadOnly[UsageJSON]
    cost: ReadOnly[float | None]
    """What the call cost; ``None``: unpriced (counted in ``unpriced_calls``), never taken as free.
    Summed into the run's ``cost_usd``."""
    finish_reason: ReadOnly[str | None]
    body_sha256: ReadOnly[str | None]
    model: ReadOnly[str | None]
    provider_request_id: ReadOnly[str | None]


class Escalation(CallRecord, total=False):
    """A lower-tier call made and rejected inside one model step: sent, billed, counted
    (``gateway.tiered.escalation_evidence``). Only ``usage`` and ``cost`` enter the counters; the
    rest is evidence, shown, never compared on replay."""

    from_tier: ReadOnly[str]
    to_tier: ReadOnly[str]
    reason: ReadOnly[str]
    """A ``gateway.empty.Reason`` value: why the answer was rejected."""
    outcome: ReadOnly[str]
    detail: ReadOnly[str]


class Response(CallRecord, total=False):
    """A model's answer (``ModelResponse.to_json``): replay hands it back instead of calling again."""

    text: ReadOnly[str]
    tool_calls: ReadOnly[Sequence[ToolCallJSON]]
    """In order: the tool steps of the turn, by index."""
    reasoning: ReadOnly[str | None]
    refusal: ReadOnly[str | None]
    tier: ReadOnly[str | None]
    escalations: ReadOnly[Sequence[Escalation]]
    response_id: ReadOnly[str]


class InFlight(TypedDict, total=False):
    """An effect started and never recorded when its run ended: an open question a person settles."""

    step_id: Required[ReadOnly[str]]
    tool: ReadOnly[str | None]
    effect_key: ReadOnly[str | None]
    evidence: ReadOnly[Mapping[str, Any]]
    """The step's ``uncertain`` payload, or its intent's: what a person decides from."""


class Charged(TypedDict, total=False):
    """A payload that charges counters: the projection adds its ``counters`` to the run's, whatever
    its row (a model step's intent, error or result, a tool's result, ``run``/``counters``)."""

    counters: ReadOnly[Counters]


# -- run -----------------------------------------------------------------------------------------


class RunStart(TypedDict, total=False):
    """``run``/``start``: the run began. A reopening is checked against it (task by the row's
    fingerprint, versions, tenant)."""

    task: ReadOnly[str | None]
    versions: ReadOnly[Mapping[str, Any]]
    """Schema, loop, policy and capability versions: a resume under others needs a migration."""
    tenant: ReadOnly[str | None]
    """Part of every effect key; ``None`` (or absent, in old journals) for no tenant."""
    conversation: ReadOnly[bool]
    """The head of a conversation (:mod:`cuaderno.loop.conversation`), not a run of the loop."""
    engine: ReadOnly[str]
    """``temporal``: started by a Temporal activity."""
    forked_from: ReadOnly[Any]
    """A fork's origin (``cuaderno fork``: ``run_id``, the point it was cut at), for people; no
    replay reads it."""


class RunEnd(TypedDict, total=False):
    """``run``/``end``: the run ended without a final answer. The projection takes the whole
    payload as the run's outcome."""

    status: ReadOnly[str]
    """``failed``, ``cancelled`` or ``completed`` (a closed conversation); absent reads as ``failed``."""
    reason: ReadOnly[str | None]
    budget: ReadOnly[str | None]
    limit: ReadOnly[int | None]
    uncertain: ReadOnly[Sequence[InFlight]]
    """Effects in flight when it ended: listed as uncertain until a person settles them."""
    completed: ReadOnly[Sequence[Mapping[str, Any]]]
    not_started: ReadOnly[Sequence[str]]
    cleanup: ReadOnly[Sequence[Mapping[str, Any]]]
    by: ReadOnly[str | None]
    spent: ReadOnly[int | None]
    """How much of ``budget`` was spent when it ran out."""
    messages: ReadOnly[int]
    """A closed conversation: how many messages it recorded."""


RunMigrate = TypedDict("RunMigrate", {
    "from": "ReadOnly[Mapping[str, Any]]",
    "to": "Required[ReadOnly[Mapping[str, Any]]]",
    "name": "ReadOnly[str | None]",
    "record": "ReadOnly[Any]",
}, total=False)
"""``run``/``migrate.N``: the run moved from the versions ``from`` to ``to`` (which the projection
takes as the run's versions from then on) by the migration ``name``; ``record`` is what it returned."""


class RunCounters(Charged, total=False):
    """``run``/``counters``: counters charged outside any step (added to the run's)."""


class RunPass(TypedDict, total=False):
    """``run``/``pass.N``: a trace marker. Replay reads none of it; a later pass links to the span."""

    trace_id: Required[ReadOnly[str]]
    span_id: Required[ReadOnly[str]]


# -- model ---------------------------------------------------------------------------------------


class ModelIntent(Charged, total=False):
    """``model``/``intent`` (``intent.N``: a re-send): a request is about to leave; committed first."""

    key: Required[ReadOnly[str]]
    """The idempotency key every send of the step carries (the same on a re-send)."""
    turn: ReadOnly[int]
    """The model turn: a snapshot names the turn it resumes at from it."""
    after: ReadOnly[str | None]
    """Why a re-send: ``crash`` or ``ambiguous`` may bill twice (``possibly_billed_twice``)."""
    new: ReadOnly[Sequence[str | Mapping[str, Any]]]
    """Temporal: the messages this turn adds (a bare step id stands for its journaled response or
    tool result; a message may reference one)."""


class ModelError(Charged, total=False):
    """``model``/``error.N``: the classified failure that ended send ``N``, and what it spent."""

    error: Required[ReadOnly[Mapping[str, Any]]]
    """``GatewayError.to_json``: ``error_class`` (an ``ambiguous`` one is re-sent after a new
    intent), ``escalations`` (lower-tier calls made and rejected: counted)."""
    key: ReadOnly[str]


class ModelResult(Charged, total=False):
    """``model``/``result``: the step's answer, paid once; replay hands it back."""

    response: Required[ReadOnly[Response | None]]
    """``None``: a classified failure journaled as evidence (its counters still count)."""
    key: ReadOnly[str]
    sends: ReadOnly[int]
    verdict: ReadOnly[Mapping[str, Any]]
    """Whether the answer was accepted (an empty or refused one is sent back, with feedback)."""
    output: ReadOnly[Any]
    """A structured answer, validated against the agent's ``output_type``: what replay returns."""


# -- tool ----------------------------------------------------------------------------------------


class ToolDecision(TypedDict, total=False):
    """``tool``/``decision``: the policy asked for a person's approval (the row's decision)."""

    policy_version: ReadOnly[str | None]
    reason: ReadOnly[str | None]


class ToolIntent(TypedDict, total=False):
    """``tool``/``intent`` (``intent.N``: run again): the body is about to run; committed first."""

    effect_key: ReadOnly[str | None]
    """The effect's identity, the same for every run of the body: what a lookup asks about."""
    idempotent: ReadOnly[bool]
    policy_version: ReadOnly[str | None]
    attempt: ReadOnly[int]
    after: ReadOnly[str | None]
    """Why it runs again: ``absent`` (a lookup found nothing), ``unknown``, ``not_happened``."""


class ToolResult(Charged, total=False):
    """``tool``/``result``: how the step ended; replay tells the model from it, never runs it again."""

    outcome: Required[ReadOnly[str]]
    """``ok``, ``denied``, ``error``, ``rejected``, ``nothing_to_do``...: what the projection counts."""
    value: ReadOnly[Any]
    """What the body returned (``ok``): the model is told it, a compensation derived from it."""
    error: ReadOnly[Mapping[str, Any]]
    reason: ReadOnly[str | None]
    policy_version: ReadOnly[str | None]
    effect_key: ReadOnly[str | None]
    compensation: ReadOnly[Mapping[str, Any]]
    """How to undo it, should the run be cancelled."""
    resolved: ReadOnly[Mapping[str, Any]]
    """Set when a person settled an uncertain effect as happened: who, and their note."""


class ToolUncertain(TypedDict, total=False):
    """``tool``/``uncertain`` (``uncertain.N``: each try that stayed so): nobody knows whether the
    effect happened. The projection lists it; a person decides from it."""

    tool: ReadOnly[str | None]
    arguments: ReadOnly[Mapping[str, Any]]
    effect_key: ReadOnly[str | None]
    reason: ReadOnly[str | None]
    last_receipt: ReadOnly[Any]


class ToolResolution(TypedDict, total=False):
    """``tool``/``resolution`` (``resolution.N``): a person said the effect did not happen; the
    protocol sends again with the same key (:func:`cuaderno.events.not_happened_since_sent`)."""

    by: ReadOnly[str | None]
    note: ReadOnly[str | None]
    effect_key: ReadOnly[str | None]


# -- approval, final, cancel -----------------------------------------------------------------------


class ApprovalRequest(TypedDict, total=False):
    """``approval``/``request``: a person is asked. The projection lists it as pending (with the
    row's tool and fingerprint, which a decision must match)."""

    tool_step: ReadOnly[str]
    arguments: ReadOnly[Mapping[str, Any]]
    reason: ReadOnly[str | None]
    policy_version: ReadOnly[str | None]


class ApprovalDecision(TypedDict, total=False):
    """``approval``/``decision``: a person decided (the row's decision: ``approved``/``rejected``)."""

    approver: ReadOnly[str | None]
    reason: ReadOnly[str | None]
    tool_step: ReadOnly[str | None]


class FinalResult(TypedDict, total=False):
    """``final``/``result``: the run's answer; the run is ``completed`` and answers from it."""

    output: ReadOnly[Any]
    """The answer as text, or the validated structured value."""
    data: ReadOnly[Any]
    """An ``output_type``'s accepted value as JSON: a replay rebuilds the answer from it, never
    by parsing ``output`` again."""
    turn: ReadOnly[int]


class CancelRequest(TypedDict, total=False):
    """``cancel``/``request``: from then on no new work is admitted."""

    reason: ReadOnly[str | None]
    by: ReadOnly[str | None]


# -- snapshot, episode, conversation ---------------------------------------------------------------


class SnapshotBase(TypedDict, total=False):
    """``snapshot``/``base.N``: a resume point (:mod:`cuaderno.loop._snapshots` says what each field
    is for)."""

    format: Required[ReadOnly[int]]
    turn: Required[ReadOnly[int]]
    chain: Required[ReadOnly[str | None]]
    first: Required[ReadOnly[str | None]]
    base: Required[ReadOnly[Mapping[str, Any]]]


class PassIntent(TypedDict, total=False):
    """``episode``/``intent``: a child pass is about to run, as the run ``child_run_id``."""

    child_run_id: Required[ReadOnly[str]]


class PassResult(TypedDict, total=False):
    """``episode``/``result``: how a child pass ended (``proposal``, ``rejected``, ``ended``) and
    what it spent; a resumed parent decides from it, never runs the pass again."""

    outcome: Required[ReadOnly[str]]
    child_run_id: ReadOnly[str]
    proposal: ReadOnly[Any]
    """The validated proposal (``proposal``): a resumed parent applies it, never asks again."""
    errors: ReadOnly[Any]
    """Why the answer was rejected (``rejected``): the next pass's feedback."""
    answer: ReadOnly[str]
    reason: ReadOnly[str | None]
    budget: ReadOnly[str | None]
    """The child's budget that ran out (``ended``): the episode's own then ends exhausted."""
    child_status: ReadOnly[str | None]
    child_outcome: ReadOnly[Mapping[str, Any] | None]
    turns: ReadOnly[int]
    child_rejected: ReadOnly[int]
    cost_usd: ReadOnly[float]
    unpriced_calls: ReadOnly[int]
    possibly_billed_twice: ReadOnly[int]
    tool_errors: ReadOnly[int]
    """What the pass spent: summed into the episode's totals."""


class PassDecision(TypedDict, total=False):
    """``episode``/``decision``: the verdict on a pass (the row's decision), never taken again."""

    reason: ReadOnly[str]


class ConversationMessage(TypedDict, total=False):
    """``conversation``/``message``: a user message; another text at its position is a divergence."""

    text: Required[ReadOnly[str]]
    run_id: Required[ReadOnly[str]]
    """The run that answers it."""


# -- what the projection keeps of them (:class:`cuaderno.checkpoint.Checkpoint`) -----------------


class PendingApproval(ApprovalRequest, total=False):
    """An approval the projection lists as pending: its request's payload, whole, with the
    request row's tool and fingerprint, which a decision must match (``cuaderno approve``)."""

    tool: ReadOnly[str | None]
    fingerprint: ReadOnly[str | None]
    erased: ReadOnly[bool]
    """The run was erased: only that an approval was pending is kept."""


class UncertainEvidence(ToolUncertain, total=False):
    """What a person decides an uncertain effect from: the ``uncertain`` payload, whole, or, for
    an effect in flight when its run ended, the :class:`InFlight` evidence with its tool and key."""

    erased: ReadOnly[bool]
    """The run was erased: only that an effect was uncertain is kept."""


class Outcome(RunEnd, FinalResult, total=False):
    """How a run ended: its ``final`` result's payload (completed) or its ``run``/``end`` payload
    (failed, cancelled, a closed conversation), whole; after an erasure, only ``erased``."""

    erased: ReadOnly[Mapping[str, Any]]
    """When, why, the status the run had and who approved what (:mod:`cuaderno.journal`'s erase)."""
    episode_status: ReadOnly[Literal["applied", "discarded", "exhausted", "failed"]]
    """An episode's parent run (its ``final`` or its ``end``): how the episode ended; a closed
    parent answers from it, with ``proposal`` (the last valid one, as JSON) and ``receipt``."""
    proposal: ReadOnly[Any]
    receipt: ReadOnly[Any]


class CancelState(CancelRequest, total=False):
    """A cancellation asked for: the ``cancel``/``request`` payload, whole."""

    erased: ReadOnly[bool]


PAYLOADS: Final[Mapping[tuple[str, str], type]] = {
    (Kind.RUN, Phase.START): RunStart,
    (Kind.RUN, Phase.END): RunEnd,
    (Kind.RUN, Phase.MIGRATE): RunMigrate,
    (Kind.RUN, Phase.COUNTERS): RunCounters,
    (Kind.RUN, Phase.PASS): RunPass,
    (Kind.MODEL, Phase.INTENT): ModelIntent,
    (Kind.MODEL, Phase.ERROR): ModelError,
    (Kind.MODEL, Phase.RESULT): ModelResult,
    (Kind.TOOL, Phase.DECISION): ToolDecision,
    (Kind.TOOL, Phase.INTENT): ToolIntent,
    (Kind.TOOL, Phase.RESULT): ToolResult,
    (Kind.TOOL, Phase.UNCERTAIN): ToolUncertain,
    (Kind.TOOL, Phase.RESOLUTION): ToolResolution,
    (Kind.APPROVAL, Phase.REQUEST): ApprovalRequest,
    (Kind.APPROVAL, Phase.DECISION): ApprovalDecision,
    (Kind.FINAL, Phase.RESULT): FinalResult,
    (Kind.CANCEL, Phase.REQUEST): CancelRequest,
    (Kind.SNAPSHOT, Phase.BASE): SnapshotBase,
    (Kind.EPISODE, Phase.INTENT): PassIntent,
    (Kind.EPISODE, Phase.RESULT): PassResult,
    (Kind.EPISODE, Phase.DECISION): PassDecision,
    (Kind.CONVERSATION, Phase.MESSAGE): ConversationMessage,
}
"""The payload type of every ``(kind, phase family)`` a run writes."""


def type_of(kind: str, phase: str) -> type | None:
    """The payload type of a row (``phase`` numbered or not); ``None`` for a pair no run writes."""
    return PAYLOADS.get((kind, family(phase)))


P = TypeVar("P")


def view(ev: StepEvent, as_type: Callable[..., P]) -> P:
    """``ev``'s payload, typed as ``as_type`` (one of :data:`PAYLOADS`), without a copy or a check:
    for a journal that was read chain-checked. Example: ``view(ev, ModelResult)["response"]``."""
    return cast(P, ev.payload)


def shown_as(ev: StepEvent, as_type: Callable[..., P]) -> P:
    """:func:`view` of the payload as shown to people (:func:`cuaderno.events.shown_payload`: an
    erased event's reads as ``{"erased": true}``): for the renderers (``show``, the page)."""
    return cast(P, shown_payload(ev))


# -- checking ------------------------------------------------------------------------------------


class PayloadMalformed(JournalCorrupt):
    """A payload is not of its ``(kind, phase)``'s type: a key it requires is missing, or a key it
    declares holds another JSON type. Raised by :func:`check`, naming the run, step and key."""


Check = Callable[[object], bool]

_ATOMS: Final[Mapping[str, Check]] = {
    "str": lambda v: type(v) is str,
    "int": lambda v: type(v) is int,
    "float": lambda v: type(v) is float or type(v) is int,  # JSON does not tell 1.0 from 1
    "bool": lambda v: type(v) is bool,
    "None": lambda v: v is None,
    "Any": lambda v: True,
    "Counters": lambda v: type(v) is dict and all(type(n) is int for n in v.values()),
}
_WRAPPER = re.compile(r"^(?:Required|NotRequired|ReadOnly)\[(.*)\]$")


def _split_union(text: str) -> list[str]:
    """``a | b[c | d]`` → ``["a", "b[c | d]"]``: a union's members at the top level."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if ch == "|" and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return out


def _checker(text: str) -> Check:
    """A check for a declared type, from its annotation's text: the JSON shape, one level deep
    (a mapping is an object, a sequence an array, a nested type an object)."""
    while (m := _WRAPPER.match(text)) is not None:
        text = m.group(1)
    members = _split_union(text)
    if len(members) > 1:
        checks = [_checker(m) for m in members]
        return lambda v: any(c(v) for c in checks)
    if text in _ATOMS:
        return _ATOMS[text]
    if text.startswith("Sequence["):
        return lambda v: type(v) is list
    return lambda v: type(v) is dict  # Mapping[...] or one of the types above


def _spec(t: type) -> tuple[frozenset[str], Mapping[str, Check]]:
    hints: Mapping[str, Any] = t.__annotations__
    texts = {k: (h.__forward_arg__ if hasattr(h, "__forward_arg__") else str(h)) for k, h in hints.items()}
    required = frozenset(k for k, s in texts.items() if s.startswith("Required["))
    return required, {k: _checker(s) for k, s in texts.items()}


_SPECS: Final = {t: _spec(t) for t in PAYLOADS.values()}


def check(ev: StepEvent) -> None:
    """Hold ``ev``'s payload to the type of its ``(kind, phase)``: every key the type requires is
    there, and every key it declares holds its JSON type (one level deep). Keys it does not declare
    are left alone; so is a pair no run writes (a store keeps any kind: that is not this check's).

    Raises:
        PayloadMalformed: naming the run, the step, the phase and the key.
    """
    t = type_of(ev.kind, ev.phase)
    if t is None:
        return
    required, checks = _SPECS[t]
    payload = ev.payload
    for key in required - payload.keys():
        raise PayloadMalformed(f"run {ev.run_id!r} step {ev.step_id!r} ({ev.kind}/{ev.phase}): its payload has no "
                               f"{key!r}, which a {t.__name__} requires")
    for key, ok in checks.items():
        if key in payload and not ok(payload[key]):
            raise PayloadMalformed(f"run {ev.run_id!r} step {ev.step_id!r} ({ev.kind}/{ev.phase}): its payload has "
                                   f"{key!r} = {payload[key]!r:.60}, which a {t.__name__} does not allow")
