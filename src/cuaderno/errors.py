"""Every error cuaderno raises, in one place.

The tree::

    CuadernoError
    ├── UsageError                 a developer mistake (bad tool declaration, bad config)
    │   └── ToolResultInvalid      a tool returned a value the journal cannot hold (NaN, a cycle...)
    ├── JournalError               the journal refused a read or a write
    │   ├── JournalConflict        another event already sits under the same (run_id, step_id, phase)
    │   ├── RunChanged             the run changed between a read and a compare-and-set write
    │   ├── JournalCorrupt         the file or its row hash chain does not check out
    │   │   └── JournalRolledBack  older than the journal this machine last saw at this path
    │   ├── SchemaTooNew           the journal was written by a newer cuaderno
    │   ├── FencedOut              another process took the run over; this one must stop
    │   ├── RunBusy                a live process is running the run; taking it over could repeat a step
    │   ├── JournalReplaced        the journal file was replaced or deleted while its runs are held
    │   ├── JournalLinked          the journal file has a second name (a hard link)
    │   ├── ConnectionLost         the connection to the journal's server was lost mid-write
    │   ├── JournalLocked          another connection's lock kept the journal from being read or opened
    │   ├── PayloadTooLarge        an event's payload is over the journal's per-payload limit
    │   ├── KeyMissing             encryption at rest needs a master key and none was given
    │   └── KeyInvalid             a master key that is malformed, or not the one a stored data key needs
    ├── RunNotFound                no run with that id
    ├── RunClosed                  the run already ended (completed, failed, cancelled)
    ├── RunCancelled               the run was cancelled; carries what completed, what is uncertain
    ├── ReplayDivergence           the code asked for another step than the one recorded there
    │   └── ConversationDivergence a message differs from the one recorded at its position
    ├── UncertainEffect            an effect may or may not have happened; nobody can know
    ├── NotUncertain               a resolution names a step that is not uncertain
    ├── VersionMismatch            the run was started under other versions; the caller must choose
    │   ├── DrainOnOldWorker       the caller chose to leave the run to a worker of its versions
    │   └── MigrationFailed        the migration function refused; nothing was written
    ├── ApprovalError              an approval or rejection cannot be written
    │   ├── NotWaitingForApproval  the step is not waiting for a decision
    │   └── ApprovalMismatch       the decision names other arguments than the ones shown
    ├── ToolError                  a tool call failed; carries its ErrorClass
    │   └── ToolArgumentsInvalid   the arguments fail the tool's schema (invalid_input)
    ├── IdempotencyKeyReuse        a provider key was reused for a different body (Stripe semantics)
    ├── GatewayError               a model call failed; carries ErrorClass, sent, retry_after
    │   ├── StreamInterrupted      a streamed answer stopped before its end (ambiguous: maybe billed)
    │   └── ResponseTooLarge       a model's answer is over the journal's per-payload limit (journaled as a failure)
    ├── BudgetExceeded             a per-run bound (retries, repairs, turns, rejected responses) ran out
    │   └── LadderExhausted        every rung of the empty-generation ladder was tried or skipped
    ├── MessageUnfinished          a conversation's last message has not finished; finish it first
    ├── ConversationClosed         the conversation was closed; it takes no new message
    ├── RateLimitWaitTooLong       a model request would wait for its provider's rate limit past max_wait
    ├── SubmitConflict             a submit names a run id the journal holds for another run
    ├── RunErased                  the run's content was erased: it cannot be resumed, forked or exported
    └── RunStillOpen               the run has not ended (or has work left): it cannot be erased yet

Errors never carry live objects: every field is plain data, so they can be journaled as evidence
and read back by the CLI or a later version. A message quotes what it was given through
:func:`quoted`, which cuts a long value and says how long it was: a megabyte run id or tool
output must not become a megabyte message (or a megabyte line on a terminal).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, Required, TypedDict, cast

if TYPE_CHECKING:
    from cuaderno.events.payloads import Escalation

QUOTE_LIMIT: Final = 200
"""Characters of a value (a run id, a step id, a tool name) quoted in a message before it is cut."""
LINE_LIMIT: Final = 2_000
"""Characters of a whole message (a description, a command line's error line) before it is cut."""


def clipped(text: str, limit: int = LINE_LIMIT) -> str:
    """``text``, or its first ``limit`` characters followed by ``...(N chars)``, N its full length.

    ASCII on purpose: the marker must print on any terminal (``PYTHONIOENCODING=ascii``).
    """
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for a message, cut like :func:`clipped` when long.

    A string is cut *before* its repr is taken (a repr of a megabyte costs a megabyte), and the
    length given is the string's own; anything else is cut after its repr.
    """
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}...({len(value)} chars)"
    return clipped(repr(value), limit)


class ErrorClass(enum.StrEnum):
    """The typed code an executor attaches to a failure; the model never infers it from text.

    The values are journaled; renaming one breaks every journal that recorded it.
    """

    INVALID_INPUT = "invalid_input"
    """Bad schema or id: repair once or fail, no backoff."""
    CONFLICT = "conflict"
    """Stale version: read fresh state and replan."""
    TRANSIENT = "transient"
    """429 or a failure *before* the request left: bounded retry with jitter."""
    AMBIGUOUS = "ambiguous"
    """Timeout *after* sending: look the effect up by its key; never a blind re-send."""
    PERMANENT = "permanent"
    """Permission denied and the like: fail or escalate, never retry."""
    BUG = "bug"
    """Impossible shape or broken invariant: stop and keep the evidence."""


class CuadernoError(Exception):
    """Base of every error cuaderno raises on purpose."""

    _pickled: ClassVar[tuple[str, ...]] = ()
    """The attributes, in ``__init__``'s order, an error is built again from when it is unpickled;
    ``()``: from its arguments, as any exception."""

    def __reduce__(self) -> tuple[Any, ...]:
        if not self._pickled:
            return cast("tuple[Any, ...]", super().__reduce__())  # an exception's is always a tuple
        return (type(self), tuple(getattr(self, name) for name in self._pickled))


class UsageError(CuadernoError):
    """A developer mistake: fix the code, retrying will not help."""


class ToolResultInvalid(UsageError):
    """A tool (or its lookup) returned a value the journal cannot hold.

    Not JSON (an object of no JSON form, a circular reference), a NaN or an infinity, an integer
    too long to write in decimal, or nesting deeper than the journal accepts. The tool *ran*: its
    effect may have happened, and its result is lost, so the loop ends the run ``failed`` (a bug)
    with this error journaled as the step's evidence, in one transaction; no part of the value is
    written. Fix the tool to return plain JSON (a dict, list, str, int, finite float, bool, None).
    """

    _pickled = ("run_id", "step_id", "tool", "problem")

    def __init__(self, run_id: str, step_id: str, tool: str, problem: str) -> None:
        self.run_id, self.step_id, self.tool, self.problem = run_id, step_id, tool, problem
        super().__init__(f"run {quoted(run_id)} step {quoted(step_id)}: tool {quoted(tool)} returned a value the "
                         f"journal cannot hold ({clipped(problem)}); nothing of it was written")


class JournalError(CuadernoError):
    """The journal refused a read or a write. Nothing was changed."""


class JournalConflict(JournalError):
    """A different event already sits under the same ``(run_id, step_id, phase)``.

    Appending the *same* event twice is a no-op; this error means two writers disagree about
    what happened at one position, which is never resolved by overwriting.
    """

    _pickled = ("run_id", "step_id", "phase")

    def __init__(self, run_id: str, step_id: str, phase: str) -> None:
        self.run_id, self.step_id, self.phase = run_id, step_id, phase
        super().__init__(
            f"run {quoted(run_id)}: a different event is already journaled at step {quoted(step_id)} "
            f"phase {quoted(phase)}; "
            "the journal is append-only and was not changed"
        )


class RunChanged(JournalError):
    """The run changed between the caller's read and its write (a compare-and-set append).

    Read the run again and decide again; nothing was written.
    """

    _pickled = ("run_id", "expected", "found")

    def __init__(self, run_id: str, expected: int, found: int) -> None:
        self.run_id, self.expected, self.found = run_id, expected, found
        super().__init__(f"run {quoted(run_id)} changed since it was read (event {found}, expected {expected}); "
                         "nothing was written")


class JournalCorrupt(JournalError):
    """The journal file, or the hash chain over its rows, does not check out.

    The file is left exactly as it was found, for forensics.
    """


class JournalRolledBack(JournalCorrupt):
    """The journal is older than the last one this machine saw at this path, or another one.

    Resuming from it would repeat effects that already happened. Nothing was changed; open it with
    ``accept_rollback=True`` (or delete the ``-anchor`` file beside it) to accept it deliberately.
    """

    def __init__(self, message: str, *, path: str = "", seen_row: int = 0, holds_row: int = 0) -> None:
        super().__init__(message)
        self.path, self.seen_row, self.holds_row = path, seen_row, holds_row

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_rolled_back, (str(self), self.path, self.seen_row, self.holds_row))


def _rebuild_rolled_back(message: str, path: str, seen_row: int, holds_row: int) -> JournalRolledBack:
    return JournalRolledBack(message, path=path, seen_row=seen_row, holds_row=holds_row)


class SchemaTooNew(JournalError):
    """The journal was written by a newer cuaderno whose schema this version cannot read."""

    _pickled = ("found", "supported", "what")

    def __init__(self, found: int, supported: int, what: str = "journal schema") -> None:
        self.found, self.supported, self.what = found, supported, what
        super().__init__(
            f"{clipped(what)} version {clipped(str(found), QUOTE_LIMIT)} is newer than this cuaderno supports "
            f"({supported}); upgrade cuaderno to read it. Nothing was changed."
        )


class FencedOut(JournalError):
    """Another process took this run over (a newer fencing epoch); this process must stop.

    Raised by the transaction that would have written an intent or a result, so a process that
    lost its lease can never record a step.
    """

    _pickled = ("run_id", "epoch", "current")

    def __init__(self, run_id: str, epoch: int, current: int) -> None:
        self.run_id, self.epoch, self.current = run_id, epoch, current
        super().__init__(
            f"run {quoted(run_id)}: this process holds epoch {epoch} but epoch {current} owns the run now; stopping"
        )


class RunBusy(JournalError):
    """Another process that is still alive is running this run.

    Taking it over now would find that process's step in flight (an intent without a result)
    and could run it a second time. Wait for it to finish or stop it, or take the run over with
    ``force`` if you know it is stuck. Nothing was changed.
    """

    _pickled = ("run_id", "holder")

    def __init__(self, run_id: str, holder: str) -> None:
        self.run_id, self.holder = run_id, holder
        super().__init__(f"run {quoted(run_id)} is being run by {clipped(str(holder), QUOTE_LIMIT)}; wait for it, "
                         "stop it, or take the run over with force (its step in flight may then run twice)")


class RunNotFound(CuadernoError):
    """No run with that id is in the journal."""

    _pickled = ("run_id",)

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {quoted(run_id)} in this journal")


class RunClosed(CuadernoError):
    """The run already ended; it cannot take this operation."""

    _pickled = ("run_id", "status")

    def __init__(self, run_id: str, status: str) -> None:
        self.run_id, self.status = run_id, status
        if status == "needs_human":  # not ended: it goes on once a person settles the effect
            super().__init__(f"run {quoted(run_id)} has not ended, it is waiting for a person to settle an uncertain "
                             f"effect ({status}); settle it first with `cuaderno resolve` (see `cuaderno show`)")
        else:
            super().__init__(f"run {quoted(run_id)} already ended ({clipped(str(status), QUOTE_LIMIT)})")


class RunCancelled(CuadernoError):
    """The run was cancelled: no new step is admitted after the cancellation committed.

    ``record`` says what completed, what is still uncertain and what cleanup was scheduled.
    """

    _pickled = ("run_id", "record")

    def __init__(self, run_id: str, record: Mapping[str, Any]) -> None:
        self.run_id, self.record = run_id, record
        completed, cleanup = len(record.get("completed") or []), len(record.get("cleanup") or [])
        reason = clipped(str(record.get("reason") or "no reason given"))
        super().__init__(f"run {quoted(run_id)} was cancelled ({reason}): "
                         f"{completed} effect{'' if completed == 1 else 's'} completed, "
                         f"{len(record.get('uncertain') or [])} uncertain, "
                         f"{cleanup} cleanup action{'' if cleanup == 1 else 's'} scheduled")


class ReplayDivergence(CuadernoError):
    """The step the code asks for is not the step recorded at that position.

    Replay never re-executes silently and never reuses a result recorded for another request.
    Check that the agent's instructions, tools and code are the ones the run started with, or
    start a new run.
    """

    _pickled = ("run_id", "step_id", "expected", "found")

    def __init__(self, run_id: str, step_id: str, expected: str, found: str) -> None:
        self.run_id, self.step_id, self.expected, self.found = run_id, step_id, expected, found
        super().__init__(
            f"run {quoted(run_id)} step {quoted(step_id)}: the journal recorded {clipped(expected)}, "
            f"but the code now asks for {clipped(found)}. "
            "Check that the agent (instructions, tools, code) is the one the run started with."
        )


class UncertainEffect(CuadernoError):
    """A non-idempotent effect has an intent on disk and no result: nobody knows if it happened.

    This is cuaderno refusing to guess. The evidence (intent, effect key, last receipt seen) is
    attached and journaled; a person or a reconciliation lookup must decide.
    """

    _pickled = ("run_id", "step_id", "evidence")

    def __init__(self, run_id: str, step_id: str, evidence: Mapping[str, Any]) -> None:
        self.run_id, self.step_id, self.evidence = run_id, step_id, evidence
        tool = evidence.get("tool", "?")
        super().__init__(
            f"run {quoted(run_id)} step {quoted(step_id)}: tool {quoted(tool)} was started and never recorded a "
            "result; it may or may not have taken effect. Reconcile it by hand (see `cuaderno show`) before resuming."
        )


class NotUncertain(CuadernoError):
    """A resolution names a step whose effect is not uncertain (or was already settled)."""


class VersionMismatch(CuadernoError):
    """The run was started under other versions (event schema, loop, policy, capabilities, agent).

    Resume with an explicit choice: unchanged, migrate, drain on the old worker, or cancel.
    """

    _pickled = ("run_id", "recorded", "current")

    def __init__(self, run_id: str, recorded: Mapping[str, object], current: Mapping[str, object]) -> None:
        self.run_id, self.recorded, self.current = run_id, recorded, current
        diff = {k: (recorded.get(k), current.get(k)) for k in sorted(set(recorded) | set(current))
                if recorded.get(k) != current.get(k)}
        super().__init__(
            f"run {quoted(run_id)} was started under other versions {clipped(str(diff))}; "
            "choose explicitly how to resume "
            "(on_version_mismatch='resume'|'migrate'|'drain'|'cancel')"
        )


class DrainOnOldWorker(VersionMismatch):
    """This worker leaves the run untouched for a worker that runs the versions it started with."""


class MigrationFailed(VersionMismatch):
    """The migration function raised: the run was not migrated and the journal was not changed."""


class ApprovalError(CuadernoError):
    """An approval or a rejection cannot be written. The journal was not changed."""


class NotWaitingForApproval(ApprovalError):
    """The step is not waiting for a decision (unknown, already decided, or never asked)."""


class ApprovalMismatch(ApprovalError):
    """The decision names other arguments than the ones shown to the person."""


class ErrorJSON(TypedDict, total=False):
    """The journaled form of a classified failure (``to_json`` of a :class:`ToolError` or a :class:`GatewayError`):
    what the model is told, and what replay hands back instead of running the call again."""

    error_class: Required[str]
    message: Required[str]
    sent: Required[bool | None]
    """``False``: the request never left (safe to send again); ``None``: a tool did not say."""
    type: Required[str]
    """The exception's class name, shown; never decides anything on replay."""
    data: Mapping[str, object]
    retry_after: float | None
    status: int | None
    escalations: list[Escalation]
    size: int
    limit: int
    step_id: str


class ToolError(CuadernoError):
    """A tool call failed, classified at the boundary that knows why.

    Tools raise this (or a subclass) to say *how* they failed; any other exception from a tool is
    classified as a ``bug``.
    """

    def __init__(self, message: str, *, error_class: ErrorClass = ErrorClass.PERMANENT,
                 sent: bool | None = None, data: Mapping[str, object] | None = None) -> None:
        self.error_class = ErrorClass(error_class)
        self.sent = sent
        self.data: Mapping[str, object] = data or {}
        super().__init__(message)

    def to_json(self) -> ErrorJSON:
        """The journaled form: what the model is told and what replay hands back."""
        return {"error_class": self.error_class.value, "message": str(self), "sent": self.sent,
                "data": self.data, "type": type(self).__name__}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_tool_error, (type(self), str(self), self.error_class.value, self.sent, self.data))


def _rebuild_tool_error(cls: type[ToolError], message: str, error_class: str, sent: bool | None,
                        data: Mapping[str, object]) -> ToolError:
    err = cls.__new__(cls)
    ToolError.__init__(err, message, error_class=ErrorClass(error_class), sent=sent, data=data)
    return err


class ToolArgumentsInvalid(ToolError):
    """The arguments fail the tool's schema; the tool did not run."""

    def __init__(self, message: str, *, data: Mapping[str, object] | None = None, **_: Any) -> None:
        super().__init__(message, error_class=ErrorClass.INVALID_INPUT, sent=False, data=data)


class IdempotencyKeyReuse(CuadernoError):
    """A provider idempotency key was reused for a different request body.

    Stripe semantics: the same key with the same body replays the stored answer; with another
    body it is a rejection, never a replay.
    """


class GatewayError(CuadernoError):
    """A model call failed, mapped to a class at the gateway boundary.

    Attributes:
        error_class: how cuaderno's single retry layer reacts.
        sent: whether the request may have reached the provider (``False`` means provably not).
        retry_after: seconds the provider asked to wait, if it said.
        status: the HTTP status, if there was one.
    """

    def __init__(self, message: str, *, error_class: ErrorClass, sent: bool,
                 retry_after: float | None = None, status: int | None = None) -> None:
        self.error_class = ErrorClass(error_class)
        self.sent = sent
        self.retry_after = retry_after
        self.status = status
        self.escalations: tuple[Escalation, ...] = ()
        """Evidence of lower-tier calls made (and maybe billed) for this step before it failed."""
        super().__init__(message)

    def to_json(self) -> ErrorJSON:
        """The journaled form of the failure."""
        out: ErrorJSON = {"error_class": self.error_class.value, "message": str(self), "sent": self.sent,
                          "retry_after": self.retry_after, "status": self.status, "type": type(self).__name__}
        if self.escalations:
            out["escalations"] = list(self.escalations)
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_gateway_error, (type(self), str(self), self.error_class.value, self.sent,
                                         self.retry_after, self.status))


def _rebuild_gateway_error(cls: type[GatewayError], message: str, error_class: str, sent: bool,
                           retry_after: float | None, status: int | None) -> GatewayError:
    err = cls.__new__(cls)
    GatewayError.__init__(err, message, error_class=ErrorClass(error_class), sent=sent,
                          retry_after=retry_after, status=status)
    return err


class BudgetExceeded(CuadernoError):
    """A per-run bound ran out (turns, retries, repairs, rejected responses...)."""

    _pickled = ("run_id", "budget", "limit")

    def __init__(self, run_id: str, budget: str, limit: int) -> None:
        self.run_id, self.budget, self.limit = run_id, budget, limit
        super().__init__(f"run {quoted(run_id)}: budget {quoted(budget)} exhausted (limit {limit})")


class JournalReplaced(JournalError):
    """The journal file at this path is not the one this process opened, or not the one whose
    runs a live process still holds: it was replaced (moved aside, restored over, recreated) or
    deleted. Writing into it would put rows where the holder never looks, or start a run the
    holder is running elsewhere. Nothing was written."""


class JournalLinked(JournalError):
    """The journal file has another name (a hard link). Each name would get its own hold file and
    its own ``-wal``, so two processes could run one run through the two names. Remove the other
    name. Nothing was written."""


class ConnectionLost(JournalError):
    """The connection to the journal's server was lost during a write, and a new one could not
    learn whether the write committed (the server is still unreachable). The step it belonged to
    must not be acted on; resume the run once the server is back (the journal then says)."""


class JournalLocked(JournalError):
    """Another connection's lock kept the journal from being opened or read in time (SQLite's
    ``SQLITE_BUSY``, ``SQLITE_LOCKED`` or ``SQLITE_PROTOCOL``): the file is in use, not damaged.
    Nothing was changed; try again."""


# -- conversations and streaming (appended: each class below is drawn in the tree above) ------------


class ConversationDivergence(ReplayDivergence):
    """A message sent to a conversation is not the one its journal recorded at that position.

    A conversation replays its recorded messages in order (each answered once, never re-paid);
    sending another text at a recorded position would give the recorded answer to a question
    nobody asked. Nothing was written. Send the recorded messages in order, call
    ``Conversation.resume()`` to continue after the last one, or start a new conversation id.
    """

    _pickled = ("conversation_id", "number", "recorded", "sent")

    def __init__(self, conversation_id: str, number: int, recorded: str, sent: str) -> None:
        self.conversation_id, self.number, self.recorded, self.sent = conversation_id, number, recorded, sent
        self.run_id, self.step_id = conversation_id, f"m{number:04d}"
        self.expected, self.found = f"message {recorded}", f"message {sent}"
        CuadernoError.__init__(
            self, f"conversation {quoted(conversation_id)} message {number}: the journal recorded "
            f"{quoted(recorded)}, but {quoted(sent)} was sent. Send the recorded messages in order, "
            "call resume() to continue after the last one, or start a new conversation id.")


class MessageUnfinished(CuadernoError):
    """A new message was sent while the conversation's last one has not finished.

    Its run waits for a person (an approval, an uncertain effect) or was interrupted. Nothing was
    written. Settle it (``approve``, ``deny``, ``resolve``), then ``Conversation.resume()``
    finishes it; the next message follows its answer.
    """

    _pickled = ("conversation_id", "message_run_id", "status")

    def __init__(self, conversation_id: str, message_run_id: str, status: str) -> None:
        self.conversation_id, self.message_run_id, self.status = conversation_id, message_run_id, status
        super().__init__(f"conversation {quoted(conversation_id)}: message run {quoted(message_run_id)} is "
                         f"{quoted(status)}, not finished; finish it (approve, deny or resolve it, then "
                         "resume()) before sending the next message")


class ConversationClosed(CuadernoError):
    """The conversation was closed (``Conversation.close()``); it takes no new message.

    Its recorded messages and answers stay readable (``Conversation.messages``). Start a new
    conversation id to go on talking."""

    _pickled = ("conversation_id",)

    def __init__(self, conversation_id: str) -> None:
        self.conversation_id = conversation_id
        super().__init__(f"conversation {quoted(conversation_id)} is closed; start a new conversation id")


class StreamInterrupted(GatewayError):
    """A streamed model answer stopped before its end: the connection was cut, or an event was
    cut in the middle.

    Always ``ambiguous`` with ``sent=True``: the provider started generating, so it may bill the
    whole answer. The loop re-sends with the same idempotency key within ``max_resends`` and
    counts the re-send as possibly billed twice; past that, the failure is journaled and raised.
    The tokens already shown to the caller were never journaled: only a complete answer is.
    """

    def __init__(self, message: str, *, error_class: ErrorClass = ErrorClass.AMBIGUOUS, sent: bool = True,
                 retry_after: float | None = None, status: int | None = None) -> None:
        super().__init__(message, error_class=error_class, sent=sent, retry_after=retry_after, status=status)


class ResponseTooLarge(GatewayError):
    """A model's answer is larger than the journal's per-payload limit (``store.max_payload``):
    it cannot be journaled, so the step's send is journaled as a failure (``error.N``, with this
    error's size and limit) and this is raised, as any permanent model error is; the run is not
    stopped by an append refused half-way through a step.

    ``permanent`` with ``sent=True``: the provider answered, and billed the answer. Resuming the
    run sends the request again (with a new intent), which may well get as large an answer: raise
    the limit, or change what the run asks for.

    Attributes:
        run_id, step_id: the model step.
        size: the bytes of JSON the answer's record would have held.
        limit: the limit it passed.
    """

    _pickled = ("run_id", "step_id", "size", "limit")

    def __init__(self, run_id: str, step_id: str, size: int, limit: int) -> None:
        self.run_id, self.step_id, self.size, self.limit = run_id, step_id, size, limit
        super().__init__(f"run {quoted(run_id)}, step {quoted(step_id)}: the model's answer is {size:,} bytes of "
                         f"JSON, more than the journal's limit of {limit:,} bytes per payload; it was not stored "
                         "(the call was made, and may be billed)", error_class=ErrorClass.PERMANENT, sent=True)

    __reduce__ = CuadernoError.__reduce__  # built again from its own arguments, not GatewayError's

    def to_json(self) -> ErrorJSON:
        return {**super().to_json(), "size": self.size, "limit": self.limit, "step_id": self.step_id}


class LadderExhausted(BudgetExceeded):
    """Every rung of the empty-generation ladder (:mod:`cuaderno.gateway.ladder`) was sent and
    rejected, or skipped, and the answer is still empty: the run ended ``failed`` with reason
    ``ladder_exhausted`` (budget ``"ladder"``, limit the number of rungs).

    Attributes:
        rungs: the ladder's rung names, in order.
        skipped: the rungs skipped at the end of the climb and why (identical request, refused
            because it would remove every tool the task needs, not applicable), as journaled.
    """

    _pickled = ("run_id", "rungs", "skipped")

    def __init__(self, run_id: str, rungs: list[str], skipped: Sequence[Mapping[str, object]]) -> None:
        self.rungs, self.skipped = list(rungs), list(skipped)
        BudgetExceeded.__init__(self, run_id, "ladder", len(self.rungs))
        tried = ", ".join(self.rungs) or "none: no recovery"
        Exception.__init__(self, f"run {quoted(run_id)}: the answer stayed empty on every rung of the ladder "
                                 f"({clipped(tried)}); the run ended failed (reason ladder_exhausted)")


class RateLimitWaitTooLong(CuadernoError):
    """A model request would have to wait longer than its rate limit's ``max_wait`` for its turn
    (:class:`cuaderno.RateLimit`, shared by every worker on the journal).

    Raised *before* the step's intent is written: nothing was sent, no idempotency key was used,
    nothing is counted; the run stays where it was and a later resume asks again. Or, with
    ``after_intent``, raised where a turn taken before its intent was overtaken by a pause while
    the intent was committed: the request was still not sent, and the journal holds the intent
    followed by an ``error.N`` that takes its send back (a resume sends again, not counted as
    possibly billed twice).

    Attributes:
        bucket: the limit's shared name (a hash of the endpoint and key or model, never the key).
        wait: seconds the request would have waited.
        max_wait: the configured bound.
        after_intent: the refusal came after the step's intent was journaled.
    """

    _pickled = ("bucket", "wait", "max_wait", "after_intent")

    def __init__(self, bucket: str, wait: float, max_wait: float, after_intent: bool = False) -> None:
        self.bucket, self.wait, self.max_wait = bucket, float(wait), float(max_wait)
        self.after_intent = bool(after_intent)
        what = ("nothing was sent; its intent is journaled with an error that takes the send back"
                if self.after_intent else "nothing was sent or journaled")
        super().__init__(f"rate limit {quoted(bucket)}: this model request would wait {self.wait:.1f} s for its turn, "
                         f"more than max_wait={self.max_wait:g} s; {what}; raise max_wait, "
                         "lower the workers' concurrency, or ask the provider for a higher limit")


class SubmitConflict(CuadernoError):
    """A submit (:func:`cuaderno.flow.submit`) names a run id the journal holds for another run:
    one queued with another task, or one started outside the queue. Nothing was written; submit
    another id (or the same task to get a handle to the queued run).

    Attributes:
        run_id: the id submitted.
        why: what the journal holds under it.
    """

    _pickled = ("run_id", "why")

    def __init__(self, run_id: str, why: str) -> None:
        self.run_id, self.why = run_id, why
        super().__init__(f"run {quoted(run_id)}: {clipped(why)}; nothing was written")


class PayloadTooLarge(JournalError):
    """An event's payload is larger than the journal's per-payload limit (the store's
    ``max_payload``, :data:`cuaderno.journal.base.DEFAULT_MAX_PAYLOAD` unless set): refused before
    anything is written (the journal is left as it was).

    A tool whose result is too large does not reach this: its step is journaled as a small error
    record naming the size (the model is told, the run goes on or ends as it decides), so a
    worker never retries a step whose result can never be stored.

    Attributes:
        run_id, step_id, phase: the event refused.
        size: its payload's bytes (JSON, before compression).
        limit: the limit it passed.
    """

    _pickled = ("run_id", "step_id", "phase", "size", "limit")

    def __init__(self, run_id: str, step_id: str, phase: str, size: int, limit: int) -> None:
        self.run_id, self.step_id, self.phase, self.size, self.limit = run_id, step_id, phase, size, limit
        super().__init__(f"run {quoted(run_id)}, step {quoted(step_id)}:{clipped(phase, 40)}: the payload is "
                         f"{size:,} bytes of JSON, more than the journal's limit of {limit:,} bytes per payload; "
                         "nothing was written")


class RunErased(CuadernoError):
    """The run's content was erased (``cuaderno erase``): its structure (steps, statuses,
    counters, cost, who decided) is left, its task, messages, tool arguments and results and
    answers are not. It cannot be resumed, forked or exported with its content.

    Attributes:
        run_id: the run ("" when the reader had only the row).
        what: what was asked for (a ``step:phase``, an operation).
    """

    _pickled = ("run_id", "what")

    def __init__(self, run_id: str, what: str = "") -> None:
        self.run_id, self.what = run_id, what
        where = f" ({clipped(what, QUOTE_LIMIT)})" if what else ""
        super().__init__(f"run {quoted(run_id)}: its content was erased{where}; only its structure is left, it "
                         "cannot be resumed, forked or exported with its content")


class RunStillOpen(CuadernoError):
    """The run has not ended, or a worker still has work in it (a compensation to run): erasing
    it would take the content its next step needs. Cancel it (and let its cleanup finish) first."""

    _pickled = ("run_id", "status")

    def __init__(self, run_id: str, status: str) -> None:
        self.run_id, self.status = run_id, status
        super().__init__(f"run {quoted(run_id)} is {clipped(str(status), QUOTE_LIMIT)}: only an ended run with no "
                         "work left is erased; cancel it first (`cuaderno cancel`) and let its cleanup finish. "
                         "Nothing was changed")


class KeyMissing(JournalError):
    """Encryption at rest needs a master key and the key provider has none (an unset variable,
    no key file); nothing was read or written."""


class KeyInvalid(JournalError):
    """A master key that is not 32 bytes of base64, a key file others can read, or a key that is
    not the one a stored data key was wrapped with; nothing was read or written."""


__all__ = sorted(["ErrorClass", "clipped", "quoted",
                  *(name for name, value in list(globals().items())
                    if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == __name__
                    and not name.startswith("_"))])
"""Every error class defined here (a new one cannot be left out), ``ErrorClass``, and the two
message helpers."""
