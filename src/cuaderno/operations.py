"""The operator's actions on a journal, in one place: what the command line and the web page
(:mod:`cuaderno.ui`) do to a run while no loop runs it, and what they read to say where it stands.

- **Decide**: :func:`approve` / :func:`deny` a pending tool call, bound to the fingerprint of
  the exact arguments the person was shown; :func:`resolve` an uncertain effect after a person
  checked the receiving system. The loop cannot write a person's decision (it was not running
  when the decision was taken): these append it, and the next resume acts on it exactly once.
- **Stop**: :func:`cancel_run` (idempotent, from any process; see :mod:`cuaderno.cancellation`).
- **Copy out**: :func:`fork` a run at a step, :func:`export_lines` its journal.
- **Repair**: :func:`rebuild_summary` rewrites a summary from its journal, never the reverse.
- **Keep**: :func:`prune` removes closed runs past a retention bound, whole
  (:mod:`cuaderno.journal.retention`); :func:`backup` copies a SQLite journal while it is written and
  :func:`restore` puts a copy back, saying what happens to runs past it
  (:mod:`cuaderno.journal.backups`).
- **Read**: :func:`run_state` / :func:`run_states` (what a run is doing now and who holds it),
  :func:`list_runs`, :func:`pending_approvals`.

Every check runs before anything is written, for a clear error, and runs again inside the
append's own transaction (the journal's append plan): a decision read as valid can still lose a
race (a cancellation, another approver, a resumer settling the step), and then the write is
refused with the same typed error. A malformed or late decision changes nothing.

``cuaderno.harness`` and ``cuaderno.forks`` are the old names of parts of this module, kept as
re-exports.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple, TypedDict

from pydantic_core import to_jsonable_python

from cuaderno.cancellation import cancel, check_store, check_strings
from cuaderno.checkpoint import Checkpoint, rebuild, verified
from cuaderno.durable.effect import resolved_result, restore_uncertain
from cuaderno.errors import (
    ApprovalMismatch,
    JournalConflict,
    NotUncertain,
    NotWaitingForApproval,
    RunChanged,
    RunClosed,
    RunErased,
    RunNotFound,
    UsageError,
    clipped,
    quoted,
)
from cuaderno.events import RESTORE_STEP, StepEvent
from cuaderno.events.payloads import PendingApproval
from cuaderno.journal import Erasure, Rekeyed, SupportsErase, rekey_journal, state_of
from cuaderno.journal.backups import BackupReport, RestoreReport, backup, mark_runs, restore_record, restored_record
from cuaderno.journal.backups import restore as _restore
from cuaderno.journal.base import Checkpointer, SupportsClaims, SupportsRebuild
from cuaderno.journal.keys import KeyProvider
from cuaderno.journal.retention import DEFAULT_BATCH, PruneReport, parse_duration
from cuaderno.journal.retention import incremental as _incremental
from cuaderno.journal.retention import prune as _prune
from cuaderno.journal.retention import vacuum as _vacuum
from cuaderno.plainjson import MAX_DEPTH, not_plain

__all__ = ["STATUSES", "BackupReport", "CancelOutcome", "PruneReport", "Rekeyed", "RestoreReport", "RunRow", "RunState",
           "SummaryRebuilt", "approve", "backup", "cancel_run", "check_store", "check_strings", "cleanup_left", "deny",
           "erase", "export_lines", "fingerprint_mismatch", "fork", "holders", "list_runs", "mark_restored",
           "pending_approvals", "prune", "read_receipt", "rebuild_summary", "rekey", "resolve", "restore", "restore_record",
           "restored_record", "run_state", "run_states", "shown"]

STATUSES: Final = ("running", "suspended", "completed", "failed", "cancelled", "needs_human")
"""Every status a run can have (a filter accepts only these: a typo would list nothing, silently)."""


# -- deciding ------------------------------------------------------------------------------------------


def pending_approvals(store: Checkpointer, run_id: str) -> dict[str, PendingApproval]:
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
    if happened and step_id == RESTORE_STEP:
        # The run went on past the backup, and the journal lost what it did: no resume can know
        # which of those effects to skip. It ends (cancel) or starts again from here (fork).
        raise UsageError(f"run {quoted(run_id)} went on past the backup its journal was restored from, and what it "
                         "did then is not in the journal: no resume can continue it without repeating or skipping "
                         "effects. Cancel it (cuaderno cancel) or fork it (cuaderno fork); nothing was written")
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


def read_receipt(text: str, *, what: str) -> Any:
    """The receipt a person typed for :func:`resolve` (``happened=True``), read as JSON.

    ``what`` names the field in the message (``--result``, ``the receipt``): the command line
    and the page refuse with the same reasons in their own words.

    Raises:
        UsageError: not JSON, nested deeper than the parser recurses (:data:`MAX_DEPTH` levels is
            what a receipt may hold), or an integer longer than Python reads; nothing was written.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} is not JSON: {exc}; nothing was written") from None
    except RecursionError:  # the parser recurses once per level: a hostile depth overflows it
        raise UsageError(f"{what} is nested too deeply (a receipt may nest at most {MAX_DEPTH} levels); "
                         "nothing was written") from None
    except ValueError:  # Python refuses to read an integer of more than 4,300 digits
        raise UsageError(f"{what} holds an integer too long to read (more than 4,300 digits); nothing was written") \
            from None


# -- copying out -------------------------------------------------------------------------------------

# A fork is a new run whose journal starts as a copy of the original's up to a step: resumed with
# the same agent and task under its new run id, it replays that copy (no model call paid again,
# no tool run again, since every one of them has its result journaled) and does the step and
# everything after it anew. Effect keys are derived from the run id (``effect_key(tenant, run_id,
# ...)``), so every effect the fork sends from there on carries a key of its own, and a receiver
# never takes it for the original's; the effects copied keep the original's keys, as they were
# sent and are never sent again.
#
# Only a point the run passed with nothing in flight can be forked: every model call and tool
# call before the step must have its result journaled, and no approval may be waiting and no
# effect be uncertain there (a resume of the copy would otherwise send a call again, or look up an
# effect under the original's key). Such a fork is refused with a message naming the step in the
# way; pick an earlier one.


def fork(store: Checkpointer, run_id: str, *, at: str, new_run_id: str) -> Checkpoint:
    """Start ``new_run_id`` as a copy of ``run_id``'s journal up to (not including) step ``at``.

    Args:
        at: the step the fork does anew (``t0002.model`` to ask the model again at turn 2,
            ``t0001.tool00`` to decide that tool call again); everything the run journaled
            before that step's first event is copied, in one transaction.
        new_run_id: the fork's run id; must not exist yet.

    Returns:
        The fork's summary (status ``running``): resume it with the same agent and task.

    Raises:
        RunNotFound: no run ``run_id``.
        JournalCorrupt: the original's journal does not check out (nothing is copied from it).
        UsageError: no step ``at`` in the run, a point with a call in flight, a waiting approval
            or an uncertain effect, or ``new_run_id`` already exists; nothing was written.
    """
    check_store(store)
    check_strings(("run_id", run_id), ("at", at), ("new_run_id", new_run_id))
    if not run_id or not at or not new_run_id:
        raise UsageError("run_id, at and new_run_id must be non-empty strings")
    if new_run_id == run_id:
        raise UsageError("a fork needs a new run id (--as): it is another run")
    if at == "run":
        raise UsageError("cannot fork at 'run' (the run's start): start a new run instead")
    _, events = verified(store, run_id)
    first = next((ev.seq for ev in events if ev.step_id == at), None)
    if first is None:
        steps = list(dict.fromkeys(ev.step_id for ev in events if ev.step_id != "run"))
        shown = ", ".join(steps[:8]) + (f", ... ({len(steps)} steps)" if len(steps) > 8 else "")
        raise UsageError(f"run {run_id!r} has no step {at!r} (its steps: {shown or 'none'}); nothing was written")
    copies = [_copy(ev, new_run_id, {"run_id": run_id, "at": at, "seq": first - 1}) for ev in events[:first - 1]]
    _check_point(run_id, at, copies)
    if store.checkpoint(new_run_id) is not None:
        raise UsageError(f"run {new_run_id!r} already exists: a fork needs a new run id; nothing was written")
    try:
        store.append(copies, expect_seq=0)  # all or nothing, and only onto a run nobody started
    except RunChanged as exc:
        raise UsageError(f"run {new_run_id!r} was started by someone else meanwhile; nothing was written") from exc
    cp = store.checkpoint(new_run_id)
    assert cp is not None
    return cp


def _copy(ev: StepEvent, run_id: str, origin: Mapping[str, object]) -> StepEvent:
    payload = ev.payload
    if ev.step_id == "run" and ev.phase == "start":
        # Where the fork came from, for people (nothing replays it): the run start is its only
        # event that says what the run is.
        payload = {**payload, "forked_from": origin}
    return StepEvent(run_id=run_id, step_id=ev.step_id, phase=ev.phase, kind=ev.kind, name=ev.name,
                     decision=ev.decision, fingerprint=ev.fingerprint, payload=payload)


def _check_point(run_id: str, at: str, copies: list[StepEvent]) -> None:
    """Refuse a fork point where the copy would not replay to exactly what the run had done."""
    if not copies or copies[0].step_id != "run" or copies[0].phase != "start":
        raise UsageError(f"run {run_id!r}: its journal does not begin with the run's start; it cannot be forked")
    started: dict[str, str] = {}
    ended: set[str] = set()
    for ev in copies:
        if ev.kind in ("model", "tool") and ev.phase.startswith("intent"):
            started.setdefault(ev.step_id, ev.kind)
        if ev.kind in ("model", "tool") and ev.phase == "result":
            ended.add(ev.step_id)
    open_steps = [step for step in started if step not in ended]
    if open_steps:
        raise UsageError(f"run {run_id!r} cannot be forked at {at!r}: step {open_steps[0]!r} was in flight there "
                         "(started, no result), and the fork would send it again; fork at an earlier step")
    cp = rebuild(run_id, copies)
    if cp.status != "running" or cp.pending or cp.uncertain or cp.cancel_requested is not None:
        waiting = sorted(cp.pending) or sorted(cp.uncertain)
        why = f"waiting for {waiting[0]!r}" if waiting else f"{cp.status}"
        raise UsageError(f"run {run_id!r} cannot be forked at {at!r}: the run was {why} there; fork at an earlier "
                         "step")


def erase(store: Checkpointer, run_id: str, *, reason: str = "", thorough: bool = False) -> Erasure:
    """Erase the run's content (task, messages, tool arguments and results, answers, evidence)
    while its structure (steps, statuses, counters, cost, who decided) and hash chain stay; see
    :mod:`cuaderno.journal._erase` and ``docs/guide/erasure-and-encryption.md``. Idempotent: a
    second call (after a kill, or while another connection kept the files from being scrubbed)
    finishes what the first left.

    Raises:
        RunNotFound: no such run.
        RunStillOpen: the run has not ended, or has compensations to run; nothing was changed.
        JournalCorrupt: its chain does not check out; nothing was changed.
        UsageError: a journal that cannot erase (the in-memory one), or a bad ``reason``.
    """
    check_store(store)
    check_strings(("run_id", run_id))
    if not isinstance(store, SupportsErase):
        raise UsageError(f"a {type(store).__name__} cannot erase a run (the SQLite and PostgreSQL journals can)")
    return store.erase_run(run_id, reason=reason, thorough=thorough)


def rekey(store: Checkpointer, *, batch: int = 200) -> Rekeyed:
    """Re-wrap every run's data key of a journal encrypted at rest under its key provider's
    current master key, in batches of ``batch`` runs, each its own transaction; resumable (a
    second call after a kill finishes). No row is rewritten. See
    :mod:`cuaderno.journal._rekey` and ``docs/guide/erasure-and-encryption.md``.

    Raises:
        UsageError: a store not opened with keys, or a bad ``batch``.
        KeyInvalid: a data key wrapped by a master key the provider no longer holds.
    """
    check_store(store)
    return rekey_journal(store, batch=batch)


def shown(store: Checkpointer, run_id: str) -> tuple[Checkpoint, list[StepEvent]]:
    """The run's summary and events as ``show`` and the page present them: :func:`verified`, or,
    for an erased run (whose summary cannot be rebuilt from rows without content), the stored
    summary and the events :meth:`~cuaderno.journal.base.Checkpointer.load` checked against its
    chain head; its payloads show as erased (:func:`cuaderno.events.shown_payload`)."""
    try:
        return verified(store, run_id)
    except RunErased:
        cp = store.checkpoint(run_id)
        if cp is None:
            raise RunNotFound(run_id) from None
        return cp, store.load(run_id)


def export_lines(store: Checkpointer, run_id: str) -> Iterator[str]:
    """The run's journal, one JSON object per event (``seq``, ``step_id``, ``phase``, ``kind``,
    ``name``, ``decision``, ``fingerprint``, ``created_at``, ``row_hash``, ``payload``), checked
    against its hash chain first (JournalCorrupt otherwise, before any line). Non-ASCII text
    stays readable; a line holding a lone surrogate (a model can write one) is ASCII-escaped,
    which JSON reads back exactly."""
    check_store(store)
    _, events = verified(store, run_id)
    for ev in events:
        record = {"run_id": ev.run_id, "seq": ev.seq, "step_id": ev.step_id, "phase": ev.phase, "kind": ev.kind,
                  "name": ev.name, "decision": ev.decision, "fingerprint": ev.fingerprint,
                  "created_at": ev.created_at, "row_hash": ev.row_hash, "payload": ev.payload}
        line = json.dumps(record, ensure_ascii=False, sort_keys=False)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = json.dumps(record, ensure_ascii=True)
        yield line


# -- stopping ----------------------------------------------------------------------------------------


class CancelOutcome(NamedTuple):
    """What :func:`cancel_run` did."""

    checkpoint: Checkpoint
    """The run's summary after the request: ``cancelled`` when no loop could be running it,
    else with ``cancel_requested`` set (its loop, or its next resume, finalizes it)."""
    already: bool
    """Nothing new was decided: the run was already cancelled (when ``checkpoint`` says
    ``cancelled``), or its cancellation already requested (otherwise)."""


def cancel_run(store: Checkpointer, run_id: str, reason: str = "", *, by: str | None = None) -> CancelOutcome:
    """Cancel a run: no new step is admitted; what completed and what is uncertain are kept.

    :func:`cuaderno.cancellation.cancel` decides on its own read and is idempotent; the read
    before it only words the answer (``already``).

    Raises:
        RunNotFound, RunClosed (it completed or failed), UsageError: as ``cancel``; nothing was written.
    """
    check_store(store)
    before = store.checkpoint(run_id) if isinstance(run_id, str) and run_id else None
    cp = cancel(store, run_id, reason, by=by)
    if cp.status == "cancelled":
        already = before is not None and before.status == "cancelled"
    else:
        already = before is not None and before.cancel_requested is not None
    return CancelOutcome(cp, already)


# -- reading -----------------------------------------------------------------------------------------


class RunState(TypedDict):
    """What a run is doing now (:func:`run_state`), as ``cuaderno status --json`` prints it."""

    state: str
    """``running`` only while a live process holds the run; ``waiting``; or the status of a run
    that ended."""
    waiting_for: str | None
    """What would move it on (a worker, an approval, a person), for people."""
    held_by: str | None
    """Who holds it (owner label, process, host), for people; ``None``: nobody."""
    summary: str
    """The one line ``cuaderno status`` prints."""


class RunRow(NamedTuple):
    """One run of :func:`list_runs`."""

    checkpoint: Checkpoint
    state: RunState


def holders(store: Checkpointer, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Who holds each run now, by run id (a run nobody holds is absent). A store without
    :class:`~cuaderno.journal.base.SupportsClaims` cannot tell, and names nobody."""
    if not run_ids or not isinstance(store, SupportsClaims):
        return {}
    return dict(store.holders(list(run_ids)))


def run_state(store: Checkpointer, cp: Checkpoint, events: Sequence[StepEvent] | None = None) -> RunState:
    """``state``, ``waiting_for``, ``held_by`` and ``summary`` of a run (see
    :func:`cuaderno.journal.state_of`). The stored status says ``running`` for a run whose
    process died; this says ``running`` only while a live process holds the run.

    Args:
        events: the run's journal, when the caller read it: a cancelled run then also says how
            many of its scheduled cleanup actions are left (:func:`cleanup_left`).
    """
    return _state(cp, holders(store, [cp.run_id]).get(cp.run_id), events)


def run_states(store: Checkpointer, runs: Iterable[Checkpoint]) -> dict[str, RunState]:
    """:func:`run_state` of each run, by run id, asking the store who holds them once."""
    runs = list(runs)
    held = holders(store, [cp.run_id for cp in runs])
    return {cp.run_id: _state(cp, held.get(cp.run_id), None) for cp in runs}


def _state(cp: Checkpoint, holder: dict[str, Any] | None, events: Sequence[StepEvent] | None) -> RunState:
    left = cleanup_left(cp, events) if events is not None and cp.status == "cancelled" else None
    found = state_of(cp, holder, cleanup_left=left)
    return RunState(state=found["state"], waiting_for=found["waiting_for"], held_by=found["held_by"],
                    summary=found["summary"])


def list_runs(store: Checkpointer, *, status: str | None = None, limit: int = 50) -> list[RunRow]:
    """The runs, most recently updated first, each with its :func:`run_state`.

    Raises:
        UsageError: ``status`` is not one of :data:`STATUSES`; nothing was read.
    """
    check_store(store)
    if status is not None and status not in STATUSES:
        raise UsageError(f"{quoted(status)} is not a run status; use one of: {', '.join(STATUSES)}")
    runs = store.list_runs(status=status, limit=limit)
    states = run_states(store, runs)
    return [RunRow(cp, states[cp.run_id]) for cp in runs]


def cleanup_left(cp: Checkpoint, events: Sequence[StepEvent]) -> int:
    """Compensations the cancellation record scheduled whose results are not journaled yet (one
    left uncertain counts: ``compensate`` says so again without writing)."""
    done = {ev.step_id for ev in events if ev.phase == "result" and ev.step_id.startswith("cleanup")}
    entries = (cp.outcome or {}).get("cleanup") or []
    end = max((ev.seq for ev in events if ev.kind == "run" and ev.phase == "end"), default=None)
    # Effects a person confirmed after the record was written get cleanup too (as compensate() counts them).
    confirmed = 0 if end is None else sum(
        1 for ev in events if ev.seq > end and ev.kind == "tool" and ev.phase == "result"
        and ev.decision == "resolved" and not ev.step_id.startswith("cleanup") and ev.payload.get("outcome") == "ok")
    total = len(entries) + confirmed
    return sum(1 for i in range(total) if f"cleanup{i:02d}" not in done)


# -- keeping ---------------------------------------------------------------------------------------------


def prune(store: Checkpointer, older_than: float | str, *, batch: int = DEFAULT_BATCH, dry_run: bool = False,
          vacuum: bool | None = None, now: float | None = None, max_batches: int | None = None) -> PruneReport:
    """Remove the closed runs (completed, failed, cancelled) last updated longer ago than
    ``older_than`` (seconds, or ``"7d"``, ``"12h"``...), whole, ``batch`` runs per transaction;
    never a run that is open, held, or has compensations left (see :mod:`cuaderno.journal.retention`).

    Args:
        vacuum: ``None``: nothing more (freed pages are reused by later appends; a SQLite file in
            ``auto_vacuum=INCREMENTAL`` mode gives them back incrementally); ``False``: the
            incremental vacuum only; ``True``: a full ``VACUUM`` of a SQLite file after pruning
            (which switches it to incremental mode for later prunes). See
            :func:`cuaderno.journal.retention.vacuum`.
        now: the clock, for a test's simulated time.

    Raises:
        UsageError: a bound that is not a duration, a store that cannot prune; nothing was written.
    """
    check_store(store)
    seconds = parse_duration(older_than) if isinstance(older_than, str) else older_than
    report = _prune(store, seconds, cleanup_left=cleanup_left, batch=batch, dry_run=dry_run, now=now,
                    max_batches=max_batches)
    if not dry_run and (vacuum is not None or report.runs):
        report.vacuum = _vacuum(store, full=bool(vacuum)) if vacuum is not None or _incremental(store) else None
    return report


def restore(backup_path: str | os.PathLike[str], journal: str | os.PathLike[str], *,
            runs_after_backup: Literal["needs-human", "accept"], keys: KeyProvider | None = None) -> RestoreReport:
    """Put a backup made by :func:`backup` at ``journal``'s path as a restore the rollback check
    knows, saying what happens to runs that may have gone on after the backup: ``"needs-human"``
    (each is marked uncertain at step ``restore``, with the evidence) or ``"accept"`` (they go on
    from the backup). See :mod:`cuaderno.journal.backups`; stop the workers first.

    Raises:
        UsageError, RunBusy, JournalCorrupt: nothing was changed.
    """
    return _restore(backup_path, journal, runs_after_backup=runs_after_backup, uncertain=restore_uncertain, keys=keys)


def mark_restored(store: Checkpointer, *, runs_after_backup: Literal["needs-human", "accept"],
                  source: str = "a restore") -> RestoreReport:
    """After a journal was restored by other means (PostgreSQL: ``pg_restore`` of a ``pg_dump``),
    before any worker runs: say what happens to its runs that may have gone on after the dump, as
    :func:`restore` does for SQLite. ``"needs-human"`` marks every open run (the journal the dump
    replaced cannot be compared: it is gone) with an uncertain ``restore`` step and its evidence;
    ``"accept"`` marks none. Either way the restore is recorded in the journal's ``cuaderno_meta``
    (:func:`restored_record`). ``source`` names the dump, for the record.

    Raises:
        UsageError: a choice other than the two; nothing was written.
    """
    check_store(store)
    if runs_after_backup not in ("needs-human", "accept"):
        raise UsageError(f"runs_after_backup must be 'needs-human' or 'accept', got {runs_after_backup!r:.40}; "
                         "nothing was written")
    check_strings(("source", source))
    report = RestoreReport(journal=str(getattr(store, "url", None) or getattr(store, "path", "")), backup=source,
                           choice=runs_after_backup)
    mark_runs(store, report, source, None, None, restore_uncertain)
    return report
