"""Cancelling a run from any process, and the record a cancelled run keeps (seed 001 §7).

Cancelling stops admitting new steps; it does not undo an effect in flight. ``cancel`` writes a
request; from that commit on, the journal refuses every new intent of the run (checked in the
intent's own transaction), while results are still admitted so an effect already in flight ends
journaled. Whoever finalizes the run — the loop at its next step, the next resume, or ``cancel``
itself when the run is waiting for a person — writes one ``cancelled`` record:

- ``completed``: tool steps whose effect happened, with their effect keys;
- ``uncertain``: tool steps started and never recorded (their evidence), to reconcile by hand;
- ``not_started``: calls that were waiting for approval, or approved and never started, and
  will not run;
- ``cleanup``: compensations scheduled for completed effects. A compensation is another action,
  with its own identity (effect key), its own policy decision and its own failures; it runs only
  when someone calls :func:`cuaderno.compensate`. For an effect a person settled
  (``resolve(happened=True)``) the entry names the original call (``derive_from``), and
  ``compensate`` works its compensation out from the agent's declaration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn, Required, TypedDict

from cuaderno.checkpoint import Checkpoint, verified
from cuaderno.errors import (
    JournalConflict,
    JournalError,
    RunBusy,
    RunCancelled,
    RunChanged,
    RunClosed,
    UsageError,
)
from cuaderno.events import StepEvent, call_arguments, not_happened_since_sent
from cuaderno.events.payloads import InFlight, ToolResult, view
from cuaderno.journal.base import Checkpointer, validate_event
from cuaderno.loop.ownership import DEFAULT_OWNERSHIP, Ownership, ProcessOwnership
from cuaderno.loop.runtime import DEFAULT_RUNTIME, Runtime
from cuaderno.plainjson import JSONObject

__all__ = ["cancel", "cancellation_record", "check_store", "check_strings", "close", "confirmed_since", "derived_cleanup", "in_flight",
           "request_cancel", "wait_for_holder"]


def check_store(store: object) -> None:
    """Refuse a ``store`` that is not a Checkpointer (``None``, a path), before it is used: it
    would fail later as an ``AttributeError`` that names no argument. Shared by every function
    that writes while no loop runs (here and :mod:`cuaderno.operations`)."""
    if not isinstance(store, Checkpointer):
        raise UsageError(f"store must be a Checkpointer, got {type(store).__name__}")


def check_strings(*fields: tuple[str, object]) -> None:
    """Refuse any ``(label, value)`` whose value is neither ``None`` nor a string: the names and
    notes of a record are text, and a number would be journaled as evidence of another type."""
    for label, value in fields:
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{label} must be a string, got {type(value).__name__}")


def cancel(store: Checkpointer, run_id: str, reason: str, *, by: str | None = None,
           runtime: Runtime = DEFAULT_RUNTIME, ownership: Ownership | None = None) -> Checkpoint:
    """Ask the run to stop. Idempotent; safe from any process, while the run runs or not.

    Two steps, each its own function so that a caller with its own clock (a workflow) can do the
    second one its own way: :func:`request_cancel` writes the request (and closes a run that waits
    for a person and is not held), then :func:`wait_for_holder` closes a waiting run whose holder
    is just letting it go.

    Returns:
        The run's checkpoint after the request. Its status is ``cancelled`` at once when no loop
        can be running it (it was waiting for a person); otherwise ``cancel_requested`` is set
        and the run's own loop (or its next resume) finalizes it.

    Raises:
        RunNotFound: no such run.
        RunClosed: the run already completed or failed (a cancelled run is returned as is).
    """
    ownership = ownership or ProcessOwnership(runtime)
    cp = request_cancel(store, run_id, reason, by=by, ownership=ownership)
    if _held_while_waiting(store, run_id, cp, ownership):
        cp = wait_for_holder(store, run_id, by=by, runtime=runtime, ownership=ownership)
    return cp


def request_cancel(store: Checkpointer, run_id: str, reason: str, *, by: str | None = None,
                   ownership: Ownership = DEFAULT_OWNERSHIP) -> Checkpoint:
    """Write the cancellation request; for a run that waits for a person and that nobody holds,
    close it in the same transaction. Never waits.

    Returns the run's checkpoint after the write (``cancel_requested`` set, or ``cancelled``).
    Raises as :func:`cancel` does.
    """
    check_store(store)
    if not isinstance(run_id, str) or not run_id:
        raise UsageError("run_id must be a non-empty string")
    if not isinstance(reason, str):
        raise UsageError("reason must be a string")
    check_strings(("by", by))
    request = StepEvent(run_id=run_id, step_id="cancel", phase="request", kind="cancel",
                        payload={"reason": reason, "by": by})
    validate_event(request)  # before anything is written, the takeover included
    # Decided from a read, written in a later transaction: the write re-checks what the decision
    # rests on (the run is still open; for a record, that nothing was appended since it was
    # computed) and the whole decision is taken again when it no longer holds.
    for _ in range(_MAX_TRIES):
        # Read from the journal, not the summary alone, before anything is written (the takeover
        # included): a damaged journal or summary is left as it was found (JournalCorrupt).
        cp, _ = verified(store, run_id)
        if cp.status == "cancelled" or cp.cancel_requested is not None:
            return cp  # closed, or asked already: closing it is the holder's (or wait_for_holder's)
        if cp.status in ("completed", "failed"):
            raise RunClosed(run_id, cp.status)
        try:
            _write(store, run_id, request, finalize=cp.status in _WAITING, by=by, ownership=ownership)
        except (RunChanged, RunClosed):
            continue  # the run moved on since the read: look again
        except JournalConflict:
            pass  # another process cancelled first: its request stands
        after = store.checkpoint(run_id)
        assert after is not None
        return after
    raise JournalError(f"run {run_id!r} changed {_MAX_TRIES} times while it was being cancelled; nothing was "
                       "written, try again")


def wait_for_holder(store: Checkpointer, run_id: str, *, by: str | None = None, runtime: Runtime = DEFAULT_RUNTIME,
                    ownership: Ownership | None = None) -> Checkpoint:
    """Close a run that waits for a person and has a cancellation request, once its holder lets
    it go; give up after a bounded time and return the checkpoint as it is then.

    A request can land just after the loop holding the run last looked for one, as that loop
    stops for a person (it checks, then lets the run go). Nobody would close the run then: so
    while such a run is still held, keep trying to take it over and close it here. A loop
    stopping lets go within moments; one still working (a lookup settling an uncertain step)
    meets the request at its next step. Writes no request (:func:`request_cancel` does).
    """
    ownership = ownership or ProcessOwnership(runtime)
    deadline = runtime.monotonic() + _WAIT_FOR_HOLDER_S
    for tries in range(_MAX_TRIES):
        cp, _ = verified(store, run_id)
        if cp.status == "cancelled" or cp.cancel_requested is None or cp.status not in _WAITING:
            return cp  # closed, or its loop closes it at its next step
        if tries and runtime.monotonic() > deadline:
            return cp  # still held: its holder (or the next resume) closes it
        try:
            _write(store, run_id, None, finalize=True, by=by, ownership=ownership)
        except (RunChanged, RunClosed):
            continue  # the run moved on since the read: look again
        except JournalConflict:
            pass
        after = store.checkpoint(run_id)
        assert after is not None
        if _held_while_waiting(store, run_id, after, ownership):
            runtime.block(0.01 * min(tries + 1, 10))
            continue
        return after
    raise JournalError(f"run {run_id!r} changed {_MAX_TRIES} times while its cancellation was being recorded; "
                       "the request stands, try again")


def _held_while_waiting(store: Checkpointer, run_id: str, cp: Checkpoint, ownership: Ownership) -> bool:
    """Whether a run with a request waits for a person and is still held: its holder is stopping.
    (Not when the holder is a loop on this very thread, say the caller's own: it cannot stop
    while we wait, and it meets the request itself.)"""
    return (cp.status in _WAITING and cp.cancel_requested is not None
            and not ownership.busy_here(ownership.key(store, run_id)))


_WAITING = ("suspended", "needs_human")
_MAX_TRIES = 100
_WAIT_FOR_HOLDER_S = 2.0
"""How long ``cancel`` keeps trying to close a run that waits for a person but is still held."""


def _write(store: Checkpointer, run_id: str, request: StepEvent | None, *, finalize: bool, by: str | None,
           ownership: Ownership) -> None:
    """Write the request (``None``: it is already written); for a run that waits for a person,
    close it in the same transaction.

    Closing is running the run, so it takes the run over first: a process that is resuming it
    right now (a person approved, a lookup is settling an uncertain step) keeps it, and only the
    request is written; that process's loop closes the run at its next step. The record lists
    exactly the journal it was computed from (compare-and-set).
    """
    asked = [] if request is None else [request]
    if not finalize:
        store.append(asked)
        return
    where, me = ownership.key(store, run_id), _Canceller()
    try:
        # A loop of this process in the middle of a step keeps the run, as another process would.
        ownership.start(where, me, force=False)
        epoch = ownership.acquire(store, run_id, f"cancel by {by}" if by else "cancel", force=False)
    except RunBusy:
        ownership.stop(where, me)
        store.append(asked)
        return
    try:
        ownership.took(where, me)
        journal = store.load(run_id)
        asked_for = request.payload if request is not None else next(
            e.payload for e in journal if e.kind == "cancel" and e.phase == "request")
        close(store, run_id, journal, asked_for, epoch, asked)
    finally:
        ownership.release(store, run_id, epoch)
        ownership.stop(where, me)


class _Canceller:
    """Holds a run for as long as ``cancel`` closes it; it never has results of its own."""

    def hand_over(self) -> None:
        pass


def finalize(store: Checkpointer, run_id: str, epoch: int) -> NoReturn:
    """Write the cancellation record of a run this process holds at ``epoch``, and stop.

    Raises :class:`RunCancelled` with the record (this process's, or the one another process
    wrote first), :class:`RunClosed` if the run ended otherwise meanwhile, and
    :class:`JournalError` if the run kept changing under every attempt to record it.
    """
    for _ in range(100):
        events = store.load(run_id)
        cp = store.checkpoint(run_id)
        assert cp is not None
        if cp.status == "cancelled":  # another process finalized it first: its record stands
            raise RunCancelled(run_id, cp.outcome or {})
        if cp.status in ("completed", "failed"):
            raise RunClosed(run_id, cp.status)
        try:
            record = close(store, run_id, events, cp.cancel_requested or {}, epoch)
        except (RunChanged, RunClosed, JournalConflict):
            continue  # something was written since the read (or the run was closed): look again
        raise RunCancelled(run_id, record)
    raise JournalError(f"run {run_id!r} kept changing while its cancellation was being recorded")


class CompletedEffect(TypedDict):
    """A ``completed`` entry of a cancelled run's record: a tool step whose effect happened. Read
    back by people and by ``compensate`` (which finds the step's result by ``step_id``)."""

    step_id: str
    tool: str | None
    effect_key: str | None
    """The effect's identity, as the intent journaled it: what the external service saw."""


class DerivedFrom(TypedDict):
    """The original call of an effect a person confirmed: ``compensate`` works its compensation
    out from the agent's declaration for ``tool``."""

    tool: str | None
    arguments: JSONObject | None
    """As the intent (or, failing that, the model's response) journaled them."""
    value: object
    """The result the person recorded, handed to the compensation's ``arguments`` function."""


class CleanupEntry(TypedDict, total=False):
    """A ``cleanup`` entry of a cancelled run's record: a compensation scheduled for the effect of
    ``for_step``, as declared with its result (``tool``, ``arguments``, ``error``) or, for an
    effect a person confirmed, to be derived (``derive_from``). Its index names its step."""

    for_step: Required[str]
    status: Required[str]
    tool: str
    arguments: JSONObject | None
    error: str
    derive_from: DerivedFrom


def close(store: Checkpointer, run_id: str, journal: list[StepEvent], request: Mapping[str, object], epoch: int,
          asked: list[StepEvent] | None = None) -> dict[str, object]:
    """Close a cancelled run with the record of ``journal`` (after ``asked``, the request when it
    is not written yet), compare-and-set: :class:`~cuaderno.errors.RunChanged` if anything was
    appended since ``journal`` was read, so the record never misses a step. Returns the record."""
    record = cancellation_record(journal, request)
    store.append([*(asked or []), end_event(run_id, record)], epoch=epoch, expect_seq=journal[-1].seq)
    return record


def end_event(run_id: str, record: dict[str, object]) -> StepEvent:
    """The event that closes a cancelled run."""
    return StepEvent(run_id=run_id, step_id="run", phase="end", kind="run", payload=record)


def in_flight(events: list[StepEvent]) -> list[InFlight]:
    """Tool steps started and never recorded, with their evidence: effects nobody knows happened.
    Any record that closes a run lists them, so closing it never hides one."""
    by_key = {(e.step_id, e.phase): e for e in events}
    return [_in_flight(ev, by_key) for ev in events
            if ev.kind == "tool" and ev.phase == "intent" and (ev.step_id, "result") not in by_key
            and not not_happened_since_sent(by_key, ev.step_id)]


def confirmed_since(events: list[StepEvent]) -> list[CleanupEntry]:
    """Cleanup for effects a person confirmed (``resolve(happened=True)``) after the cancellation
    record was written: they were listed as uncertain then. Appended after the record's own
    entries, in journal order, so the step ids of those never move."""
    end = max((e.seq for e in events if e.kind == "run" and e.phase == "end"), default=None)
    if end is None:
        return []
    by_key = {(e.step_id, e.phase): e for e in events}
    return [derived_cleanup(ev, events, by_key) for ev in events
            if ev.seq > end and ev.kind == "tool" and ev.phase == "result" and ev.decision == "resolved"
            and not ev.step_id.startswith("cleanup") and view(ev, ToolResult).get("outcome") == "ok"]


def derived_cleanup(result: StepEvent, events: list[StepEvent],
                    by_key: dict[tuple[str, str], StepEvent]) -> CleanupEntry:
    """The cleanup entry for an effect a person confirmed (``resolve(happened=True)``): its result
    was written without the agent, so the entry names the original call and ``compensate``
    works the compensation out from the agent's declaration."""
    evidence = (by_key.get((result.step_id, "uncertain")) or by_key.get((result.step_id, "intent")) or result).payload
    arguments = evidence.get("arguments")
    return {"for_step": result.step_id, "derive_from": {
        "tool": result.name, "arguments": arguments if isinstance(arguments, dict) else call_arguments(
            events, result.step_id), "value": result.payload.get("value")}, "status": "scheduled"}


def _in_flight(intent: StepEvent, by_key: dict[tuple[str, str], StepEvent]) -> InFlight:
    return {"step_id": intent.step_id, "tool": intent.name, "effect_key": intent.payload.get("effect_key"),
            "evidence": (by_key.get((intent.step_id, "uncertain")) or intent).payload}


def cancellation_record(events: list[StepEvent], request: Mapping[str, object]) -> dict[str, object]:
    """What a cancelled run keeps, derived from its journal alone."""
    by_key = {(e.step_id, e.phase): e for e in events}
    completed: list[CompletedEffect] = []
    uncertain: list[Mapping[str, object]] = []
    not_started: list[str] = []
    cleanup: list[Mapping[str, object]] = []
    for ev in events:
        if ev.kind == "tool" and ev.phase == "intent":
            result = by_key.get((ev.step_id, "result"))
            if result is None:
                if not not_happened_since_sent(by_key, ev.step_id):
                    uncertain.append(_in_flight(ev, by_key))
            elif result.payload.get("outcome") == "ok":
                completed.append({"step_id": ev.step_id, "tool": ev.name, "effect_key": ev.payload.get("effect_key")})
                if result.payload.get("compensation"):
                    cleanup.append({"for_step": ev.step_id, **result.payload["compensation"],
                                    "status": "scheduled"})
                elif result.decision == "resolved" and not ev.step_id.startswith("cleanup"):
                    cleanup.append(derived_cleanup(result, events, by_key))
        elif ev.kind == "approval" and ev.phase == "request":
            decided = by_key.get((ev.step_id, "decision"))
            # Waiting for a person, or approved and never started: either way it will not run.
            if decided is None or (decided.decision == "approved"
                                   and (ev.payload.get("tool_step"), "intent") not in by_key):
                not_started.append(ev.step_id)
    return {"status": "cancelled", "reason": request.get("reason"), "by": request.get("by"),
            "completed": completed, "uncertain": uncertain, "not_started": not_started, "cleanup": cleanup}
