"""Submitting runs to the queue, and the limits their workers keep.

A submit writes, in this order:

1. the run's queue row (and its idempotency key's), in one transaction
   (:meth:`~cuaderno.journal.JournalQueue.enqueue`): priority, ``start_at``, concurrency key,
   and what starting it takes (agent name, versions, tenant, task);
2. the run's first event, ``run.start``, exactly as the loop writes it
   (:class:`~cuaderno.loop.runner.Runner`), so a worker resumes it as if the application had
   started it and gone away;
3. on PostgreSQL, a ``NOTIFY`` that wakes the listening workers.

Why two transactions and not one: the first event goes through the store's own append (its hash
chain, its summary row), which owns its transaction. The order makes the gap harmless: a worker
claims only a queued run whose first event is written (the claim joins the runs table), so a
submitter that dies between 1 and 2 leaves a row nobody runs, and the next submit of the same
run id or idempotency key writes the missing event from the row (the row, not the caller, says
what the run is: a second submit of one key never changes its task).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime

from cuaderno import faults
from cuaderno.errors import SubmitConflict, UsageError, quoted
from cuaderno.events import StepEvent
from cuaderno.events.payloads import RunStart
from cuaderno.fingerprint import fingerprint
from cuaderno.journal import QueueEntry, canonical_versions, queue_of
from cuaderno.journal.base import Checkpointer
from cuaderno.loop.agent import Agent
from cuaderno.operations import RunState

__all__ = ["Submitted", "limits", "queued_state", "set_limit", "submit", "waiting_for"]

_KEY_LIMIT = 200
"""Longest idempotency or concurrency key, in characters (a key is an index entry, not a payload)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Submitted:
    """A handle to a submitted run."""

    run_id: str
    created: bool
    """Whether this submit created the run (``False``: an earlier submit of the same run id, or of
    the same idempotency key while its run is open or within ``debounce``, did)."""
    priority: int
    start_at: float
    """When it may start (seconds since the epoch on the journal's clock)."""
    concurrency_key: str | None
    idempotency_key: str | None


def submit(store: Checkpointer, agent: Agent, task: str, *, run_id: str | None = None, tenant: str = "default",
           idempotency_key: str | None = None, debounce: float | None = None, concurrency_key: str | None = None,
           priority: int = 0, start_at: float | datetime | None = None) -> Submitted:
    """Submit a run of ``agent`` on ``task`` for the journal's workers to start.

    Args:
        store: an open SQLite or PostgreSQL journal (or a :class:`~cuaderno.journal.GroupCommit` on one).
        agent: the agent whose workers will run it (its name and versions are recorded).
        run_id: the run's id (default: a new random one). Submitting an id that is queued
            already answers that run (``created=False``); an id started outside the queue is refused.
        idempotency_key: one business request, one run: while the last run submitted with this
            key is open, a submit with it answers that run.
        debounce: seconds; with ``idempotency_key``, a submit less than this long after the key's
            last run was submitted answers it even if it has ended.
        concurrency_key: counted against the key's limit (:func:`set_limit`).
        priority: higher is claimed first; ties go to the oldest submit.
        start_at: not started before (seconds since the epoch, or an aware ``datetime``), on the
            journal's clock (the PostgreSQL server's; this host's for SQLite).

    Raises:
        UsageError: a bad argument, or a journal without a queue (in memory). Nothing is written.
        SubmitConflict: ``run_id`` is queued with another task, or was started outside the queue
            (nothing is written).
    """
    if not isinstance(agent, Agent):
        raise UsageError(f"agent must be an Agent, got {type(agent).__name__}")
    if not isinstance(task, str):
        raise UsageError(f"task must be a string, got {type(task).__name__}")
    if not isinstance(tenant, str) or not tenant:
        raise UsageError(f"tenant must be a non-empty string, got {quoted(tenant)}")
    if run_id is not None and (not isinstance(run_id, str) or not run_id or "\x00" in run_id or len(run_id) > 200):
        raise UsageError(f"run_id must be a non-empty string of at most 200 characters without NUL, got {quoted(run_id)}")
    for name, key in (("idempotency_key", idempotency_key), ("concurrency_key", concurrency_key)):
        if key is not None and (not isinstance(key, str) or not key or "\x00" in key or len(key) > _KEY_LIMIT):
            raise UsageError(f"{name} must be a non-empty string of at most {_KEY_LIMIT} characters without NUL, "
                             f"got {quoted(key)}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) < priority < 2**31:
        raise UsageError(f"priority must be a 32-bit integer, got {quoted(priority)}")
    if debounce is not None and (isinstance(debounce, bool) or not isinstance(debounce, (int, float))
                                 or not math.isfinite(debounce) or debounce <= 0):
        raise UsageError(f"debounce must be a positive number of seconds, got {quoted(debounce)}")
    if debounce is not None and idempotency_key is None:
        raise UsageError("debounce needs an idempotency_key (the window is the key's)")
    queue = queue_of(store)
    now = queue.now()
    at = _seconds(start_at, now)
    entry = QueueEntry(run_id=run_id if run_id is not None else f"q-{uuid.uuid4().hex}", agent=agent.name,
                       versions=canonical_versions(agent.versions()), tenant=tenant, task=task, priority=priority,
                       start_at=at, submitted_at=now, concurrency_key=concurrency_key, idempotency_key=idempotency_key)
    found, created = queue.enqueue(entry, debounce=debounce)
    if not created and run_id is not None and found.run_id == run_id and found.task != task:
        raise SubmitConflict(run_id, "the run is queued with another task")
    faults.point("flow.S1")  # crash point: the queue row committed, the run's first event not yet written
    start: RunStart = {"task": found.task, "versions": agent.versions(), "tenant": found.tenant}
    if store.checkpoint(found.run_id) is None:
        # Equal to the loop's own first event: stored once however many submits write it.
        store.append([StepEvent(run_id=found.run_id, step_id="run", phase="start", kind="run", name=found.agent,
                                fingerprint=fingerprint({"task": found.task}), payload=dict(start))])
    queue.notify()
    return Submitted(run_id=found.run_id, created=created, priority=found.priority, start_at=found.start_at,
                     concurrency_key=found.concurrency_key, idempotency_key=found.idempotency_key)


def _seconds(start_at: float | datetime | None, now: float) -> float:
    if start_at is None:
        return now
    if isinstance(start_at, datetime):
        if start_at.tzinfo is None:
            raise UsageError("start_at must be an aware datetime (with a tzinfo): a naive one names no instant")
        return start_at.timestamp()
    if isinstance(start_at, bool) or not isinstance(start_at, (int, float)) or not math.isfinite(start_at):
        raise UsageError(f"start_at must be seconds since the epoch or an aware datetime, got {quoted(start_at)}")
    return float(start_at)


def set_limit(store: Checkpointer, concurrency_key: str, limit: int | None) -> None:
    """At most ``limit`` runs of ``concurrency_key`` in progress at once across every worker of
    the journal (``None``: no limit). Stored in the journal, so every worker keeps the same one.

    Raises:
        UsageError: a bad key or limit, or a journal without a queue (nothing is written).
    """
    if not isinstance(concurrency_key, str) or not concurrency_key or len(concurrency_key) > _KEY_LIMIT:
        raise UsageError(f"concurrency_key must be a non-empty string of at most {_KEY_LIMIT} characters, "
                         f"got {quoted(concurrency_key)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit < 2**31):
        raise UsageError(f"limit must be a positive integer or None, got {quoted(limit)}")
    queue = queue_of(store)
    queue.set_limit(concurrency_key, limit)
    queue.notify()  # a raised limit frees slots now


def limits(store: Checkpointer) -> dict[str, int]:
    """Every concurrency limit the journal records, by key."""
    return queue_of(store).limits()


def queued_state(store: Checkpointer, state: RunState, run_id: str) -> RunState:
    """``state`` (:func:`cuaderno.operations.run_state`) with the queue's reason when it holds the
    run back: a run that waits for a worker because its ``start_at`` has not come, or because
    its key has K runs in progress, says so (``cuaderno status``, the run's page). Any other
    state, or a store without a queue, is returned as it is."""
    if state["waiting_for"] != "a worker":
        return state
    try:
        why = queue_of(store).waiting_for(run_id)
    except UsageError:
        return state
    if why is None:
        return state
    return {**state, "waiting_for": why, "summary": f"queued, waiting for {why}"}


def waiting_for(store: Checkpointer, run_id: str) -> str | None:
    """What holds a queued run back, for people: its start time, or its key's limit (``None``:
    nothing of the queue's)."""
    return queue_of(store).waiting_for(run_id)
