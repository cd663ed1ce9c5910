"""What the harness writes while no loop is running: approvals and rejections.

The loop cannot write a person's decision: it was not running when the decision was taken. These
functions append it to the run's journal, bound to the fingerprint of the exact arguments the
person was shown; the next resume finds it and acts on it exactly once.

Every check runs before anything is written, for a clear error, and runs again inside the
append's own transaction (``cuaderno.journal._append``): a decision read as valid can still lose
a race (a cancellation, another approver, a resumer settling the step), and then the write is
refused with the same typed error. A malformed or late decision changes nothing.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from pydantic_core import to_jsonable_python

from cuaderno._json import not_plain
from cuaderno.checkpoint import Checkpoint, verified
from cuaderno.durable.effect import resolved_result
from cuaderno.errors import (
    ApprovalMismatch,
    JournalConflict,
    NotUncertain,
    NotWaitingForApproval,
    RunClosed,
    UsageError,
    clipped,
    quoted,
)
from cuaderno.events import StepEvent
from cuaderno.journal.base import Checkpointer, SupportsRebuild

__all__ = ["SummaryRebuilt", "approve", "deny", "fingerprint_mismatch", "pending_approvals", "rebuild_summary",
           "resolve"]


def pending_approvals(store: Checkpointer, run_id: str) -> dict[str, dict[str, Any]]:
    """The approvals a run is waiting for, by approval step id (tool, arguments, fingerprint)."""
    return dict(_open_run(store, run_id).pending)


def approve(store: Checkpointer, run_id: str, step_id: str, *, fingerprint: str | None = None,
            approver: str | None = None, reason: str | None = None) -> StepEvent:
    """Approve the tool call waiting at ``step_id``; the next resume runs it exactly once.

    Args:
        step_id: the approval step id (``t0000.tool00.approval``) or its tool step id.
        fingerprint: the fingerprint of the arguments the person saw. When given, it must equal
            the pending request's, or :class:`~cuaderno.errors.ApprovalMismatch` is raised.
        approver: who decided, for the record.
        reason: why, for the record.

    Raises:
        RunNotFound, RunClosed, NotWaitingForApproval, ApprovalMismatch: nothing was written.
    """
    return _decide(store, run_id, step_id, "approved", fingerprint, approver, reason)


def deny(store: Checkpointer, run_id: str, step_id: str, *, fingerprint: str | None = None,
         approver: str | None = None, reason: str | None = None) -> StepEvent:
    """Reject the tool call waiting at ``step_id``; the model is told it was rejected.

    Same arguments and errors as :func:`approve`.
    """
    return _decide(store, run_id, step_id, "rejected", fingerprint, approver, reason)


def check_store(store: object) -> None:
    """Refuse a ``store`` that is not a Checkpointer (``None``, a path), before it is used: it
    would fail later as an ``AttributeError`` that names no argument. Shared by every function
    that writes while no loop runs (here and :func:`cuaderno.cancellation.cancel`)."""
    if not isinstance(store, Checkpointer):
        raise UsageError(f"store must be a Checkpointer, got {type(store).__name__}")


def check_strings(*fields: tuple[str, object]) -> None:
    """Refuse any ``(label, value)`` whose value is neither ``None`` nor a string: the names and
    notes of a record are text, and a number would be journaled as evidence of another type."""
    for label, value in fields:
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{label} must be a string, got {type(value).__name__}")


def _open_run(store: Checkpointer, run_id: str) -> Checkpoint:
    check_store(store)
    if not isinstance(run_id, str) or not run_id:
        raise UsageError("run_id must be a non-empty string")
    # The summary the decision is taken from must be the journal's (a damaged or edited one
    # could show other arguments than the ones the decision binds): JournalCorrupt otherwise.
    cp, _ = verified(store, run_id)
    if not cp.is_open:
        raise RunClosed(run_id, cp.status)
    return cp


def _decide(store: Checkpointer, run_id: str, step_id: str, decision: str, fingerprint: str | None,
            approver: str | None, reason: str | None) -> StepEvent:
    check_strings(("step_id", step_id), ("fingerprint", fingerprint), ("approver", approver), ("reason", reason))
    if not step_id:
        raise UsageError("step_id must be a non-empty string")
    cp = _open_run(store, run_id)
    appr_id = step_id if step_id.endswith(".approval") else f"{step_id}.approval"
    pending = cp.pending.get(appr_id)
    if pending is None:
        waiting = clipped(", ".join(sorted(cp.pending)) or "none")
        raise NotWaitingForApproval(f"run {quoted(run_id)}: step {quoted(step_id)} is not waiting for a decision "
                                    f"(waiting: {waiting})")
    shown = pending.get("fingerprint")
    if fingerprint is not None and fingerprint != shown:
        raise ApprovalMismatch(f"run {quoted(run_id)} step {quoted(appr_id)}: "
                               f"{fingerprint_mismatch(fingerprint, str(shown))}")
    event = StepEvent(run_id=run_id, step_id=appr_id, phase="decision", kind="approval", name=pending.get("tool"),
                      decision=decision, fingerprint=shown,
                      payload={"approver": approver, "reason": reason, "tool_step": pending.get("tool_step")})
    try:
        return store.append([event])[0]
    except JournalConflict as exc:
        raise NotWaitingForApproval(f"run {quoted(run_id)}: step {quoted(appr_id)} was already decided "
                                    "otherwise") from exc


def fingerprint_mismatch(given: str, shown: str) -> str:
    """Why ``given`` does not bind the pending call, with the two values shown where they differ.

    A prefix is never a match: the decision must name exactly the arguments the person saw. Cut
    both to one length, a prefix would print as the very value it is compared with.
    """
    if not given.strip():
        return f"the fingerprint given is empty; pass the one `cuaderno show` prints ({shown}); nothing was written"
    if len(given) != len(shown) and shown.startswith(given):
        return (f"expected the full {len(shown)}-character fingerprint shown by `cuaderno show`, got "
                f"{len(given)} characters ({given}); a prefix does not bind the arguments; nothing was written")
    # Show both up to a few characters past the first difference, so they never look alike.
    differ = next((i for i, (a, b) in enumerate(zip(given, shown, strict=False)) if a != b), min(len(given), len(shown)))
    cut = max(12, differ + 4)
    return (f"the decision names arguments {clipped(given, cut)}, but the pending call has {clipped(shown, cut)}; "
            "show the person the current arguments and decide again; nothing was written")


def resolve(store: Checkpointer, run_id: str, step_id: str, *, happened: bool, result: Any = None,
            by: str | None = None, note: str | None = None) -> StepEvent:
    """Settle an uncertain effect by hand, after a person checked the receiving system.

    Args:
        step_id: the tool step that is uncertain (``cuaderno show`` lists them).
        happened: ``True`` if the effect exists; ``result`` is then recorded as the tool's
            result (for example the receipt found). ``False`` if its absence was established:
            the next resume sends it again, with the same effect key (on a run that already
            ended, cancelled or failed, nothing is sent: the answer is only recorded).
        result: only with ``happened=True``. A receipt given with ``happened=False`` is refused:
            it says the effect exists, and the resume would send it again. It is made plain JSON
            the way a tool's result and a lookup's receipt are (``to_jsonable_python``: a tuple
            becomes a list, a key that is not a string its text); the event returned holds the
            value as journaled.
        by: who checked, for the record.
        note: what was checked, for the record.

    Raises:
        UsageError: a receipt with ``happened=False``, a receipt JSON cannot hold, an argument of
            the wrong type; nothing was written.
        RunNotFound, NotUncertain: nothing was written.
    """
    check_store(store)
    if not isinstance(run_id, str) or not run_id:
        raise UsageError("run_id must be a non-empty string")
    check_strings(("step_id", step_id), ("by", by), ("note", note))
    if not step_id:
        raise UsageError("step_id must be a non-empty string")
    if not isinstance(happened, bool):
        raise UsageError(f"happened must be True or False, got {quoted(happened, 40)}: it decides whether a real "
                         "effect is sent again")
    if not happened and result is not None:
        raise UsageError("a result (a receipt) goes only with happened=True: with happened=False the next resume "
                         "sends the effect again; nothing was written")
    if happened:
        # Normalised, not refused: a lookup's receipt and a tool's result are journaled through
        # to_jsonable_python too, and a person's receipt is the same evidence. The event below is
        # built from the normalised value, so what is returned is exactly what is journaled.
        try:
            result = to_jsonable_python(result)
        except ValueError as exc:  # a type it cannot convert, a cycle, nesting or an integer too long
            raise UsageError(f"result is not plain JSON ({exc}); nothing was written") from exc
        problem = not_plain(result)
        if problem is not None:
            raise UsageError(f"result is not plain JSON (it holds {problem}); nothing was written")
    cp, events = verified(store, run_id)  # the evidence shown to the person is the journal's
    evidence = cp.uncertain.get(step_id)
    if evidence is None:
        raise NotUncertain(f"run {quoted(run_id)}: step {quoted(step_id)} is not uncertain "
                           f"(uncertain: {clipped(', '.join(sorted(cp.uncertain)) or 'none')})")
    record = {"by": by, "note": note, "effect_key": evidence.get("effect_key")}
    # The uncertain event, or (for an effect in flight when the run was closed) its intent.
    uncertain = next((ev for ev in events if ev.step_id == step_id and ev.phase == "uncertain"), None) or next(
        ev for ev in events if ev.step_id == step_id and ev.phase == "intent")
    if happened:
        event = resolved_result(run_id, step_id, tool=uncertain.name, fingerprint=uncertain.fingerprint,
                                value=result, record=record, effect_key=evidence.get("effect_key"))
    else:
        # Numbered like the uncertain events: a re-send after one resolution may end uncertain
        # again, and a person settles it again.
        n = sum(1 for ev in events if ev.step_id == step_id and ev.phase.split(".")[0] == "resolution")
        phase = "resolution" if n == 0 else f"resolution.{n + 1}"
        event = StepEvent(run_id=run_id, step_id=step_id, phase=phase, kind="tool", name=uncertain.name,
                          decision="not_happened", fingerprint=uncertain.fingerprint, payload=record)
    try:
        return store.append([event])[0]
    except JournalConflict as exc:
        raise NotUncertain(f"run {quoted(run_id)}: step {quoted(step_id)} was already settled otherwise") from exc


class SummaryRebuilt(NamedTuple):
    """What :func:`rebuild_summary` did."""

    checkpoint: Checkpoint
    """The run's summary as it is now stored."""
    differed: list[str]
    """The fields in which the old summary differed from its journal; empty: it matched, and
    nothing was written."""


def rebuild_summary(store: Checkpointer, run_id: str, *, trust_journal: bool = False) -> SummaryRebuilt:
    """Rebuild a run's stored summary (its checkpoint row) from its hash-chained journal.

    The way forward when a resume, a decision or ``cuaderno show`` refuses a run because its
    summary "does not match its journal": the journal is the record, the summary only its
    projection, so the summary is rewritten from the events, never the events from it. No event
    is written or changed, and the run's epoch and holder are kept. Run it after finding out what
    changed the file: the refusal named the fields that differ.

    Args:
        trust_journal: rebuild even when the stored summary's head is not the journal's last row:
            when it names events the journal does not hold (rows removed from its end look
            exactly like that), cannot be read, or ends *before* the journal's last row (rows
            appended with correct hashes by something other than cuaderno look exactly like
            that: the chain is a check, not a signature). Say so only when the journal is known
            to be complete and every row in it to be cuaderno's.

    Raises:
        RunNotFound: no such run.
        JournalCorrupt: the journal's rows do not chain (nothing can be rebuilt from them), or,
            without ``trust_journal``, rows may be missing from its end or appended past the
            summary's head; nothing was written.
        UsageError: a store that cannot rebuild a summary (a custom Checkpointer without
            :class:`~cuaderno.journal.base.SupportsRebuild`), or an argument of the wrong type.
    """
    check_store(store)
    if not isinstance(run_id, str) or not run_id:
        raise UsageError("run_id must be a non-empty string")
    if not isinstance(trust_journal, bool):
        raise UsageError(f"trust_journal must be True or False, got {quoted(trust_journal, 40)}")
    if not isinstance(store, SupportsRebuild):
        raise UsageError(f"{type(store).__name__} cannot rebuild a run's summary (it does not declare the "
                         "SupportsRebuild capability: no rebuild_checkpoint)")
    cp, differed = store.rebuild_checkpoint(run_id, trust_journal=trust_journal)
    return SummaryRebuilt(cp, list(differed))
