"""Fork a run at a step, and export a run's journal as JSON lines.

A fork is a new run whose journal starts as a copy of the original's up to a step: resumed with
the same agent and task under its new run id, it replays that copy (no model call paid again,
no tool run again, since every one of them has its result journaled) and does the step and
everything after it anew. Effect keys are derived from the run id (``effect_key(tenant, run_id,
...)``), so every effect the fork sends from there on carries a key of its own, and a receiver
never takes it for the original's; the effects copied keep the original's keys, as they were
sent and are never sent again.

Only a point the run passed with nothing in flight can be forked: every model call and tool
call before the step must have its result journaled, and no approval may be waiting and no
effect be uncertain there (a resume of the copy would otherwise send a call again, or look up an
effect under the original's key). Such a fork is refused with a message naming the step in the
way; pick an earlier one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from cuaderno.checkpoint import Checkpoint, rebuild, verified
from cuaderno.errors import RunChanged, UsageError
from cuaderno.events import StepEvent
from cuaderno.harness import check_store, check_strings
from cuaderno.journal.base import Checkpointer

__all__ = ["export_lines", "fork"]


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


def _copy(ev: StepEvent, run_id: str, origin: dict[str, Any]) -> StepEvent:
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
