"""Cron schedules: each fire time of a schedule starts exactly one run,
whatever the number of workers and however many of them die.

A schedule is a row in the journal (:func:`add_schedule`; ``cuaderno schedule add|list|remove``):
a cron expression (``croniter``'s syntax: five fields, or six with seconds last, ``* * * * *
*/2`` for every 2 s), the agent whose workers start it (by name), and the run's task. Every
:class:`~cuaderno.worker.Worker` of that agent looks at the schedules at each poll
(:func:`fire_due`) and submits a run for each fire time that has come.

Exactly one run per fire time: the run's id is derived from the schedule and the fire time
(``sched:<name>:<UTC time>``), and a submit of an id already queued answers that run
(:func:`~cuaderno.flow.submit`); two workers that fire the same time at once make one run. Only
after every run up to a fire time is submitted does the schedule record it (``last_fire``, only
ever moved forward), so a worker that dies in between leaves the next worker to submit the same
runs again, which changes nothing.

Missed fire times (no worker was up, the journal was away) follow ``catch_up``: of the fire
times that have come since the last recorded one, the latest ``catch_up`` are started and the
older ones are skipped (``catch_up=1``, the default: only the latest; a large ``catch_up``:
every one). Fire times are computed on the journal's clock (the PostgreSQL server's; this host's
for SQLite), from the schedule's creation: a schedule added now never fires for the past.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cuaderno.errors import UsageError, quoted
from cuaderno.flow.queue import Submitted, submit
from cuaderno.journal import schedules_of
from cuaderno.journal.base import Checkpointer
from cuaderno.loop.agent import Agent

__all__ = ["Schedule", "add_schedule", "fire_due", "list_schedules", "remove_schedule", "schedule_run_id"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A schedule as the journal records it."""

    name: str
    cron: str
    agent: str
    """The name of the agent whose workers start its runs."""
    task: str
    tenant: str
    priority: int
    concurrency_key: str | None
    catch_up: int
    created_at: float
    last_fire: float
    """The latest fire time whose run (and every earlier one's) is submitted; ``created_at`` at first."""


def _croniter() -> Any:
    """``croniter.croniter``, imported when a schedule is used (the ``schedules`` extra)."""
    try:
        from croniter import croniter
    except ImportError:
        raise UsageError("cron schedules need croniter: pip install 'cuaderno[schedules]'") from None
    return croniter


def schedule_run_id(name: str, fire_time: float) -> str:
    """The run id of a schedule's fire time: the same in every worker, so one run per fire time."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(fire_time))
    millis = round((fire_time - math.floor(fire_time)) * 1000)
    return f"sched:{name}:{stamp}{f'.{millis:03d}' if millis else ''}Z"


def add_schedule(store: Checkpointer, name: str, cron: str, agent: Agent | str, task: str, *, tenant: str = "default",
                 priority: int = 0, concurrency_key: str | None = None, catch_up: int = 1) -> Schedule:
    """Add a schedule: from now on, each fire time of ``cron`` starts one run of ``agent`` on ``task``.

    Raises:
        UsageError: a bad argument, a name already taken, or a journal without a queue (nothing
            is written).
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(f"a schedule name is 1-100 letters, digits, '_', '.', '-' (starting with a letter or digit), "
                         f"got {quoted(name)}")
    if not isinstance(cron, str) or not _croniter().is_valid(cron):
        raise UsageError(f"{quoted(cron)} is not a cron expression (five fields, or six with seconds last)")
    agent_name = agent.name if isinstance(agent, Agent) else agent
    if not isinstance(agent_name, str) or not agent_name:
        raise UsageError(f"agent must be an Agent or an agent's name, got {quoted(agent)}")
    if not isinstance(task, str):
        raise UsageError(f"task must be a string, got {type(task).__name__}")
    if isinstance(catch_up, bool) or not isinstance(catch_up, int) or not 1 <= catch_up <= 100_000:
        raise UsageError(f"catch_up must be an integer from 1 to 100000, got {quoted(catch_up)}")
    if isinstance(priority, bool) or not isinstance(priority, int) or not -(2**31) < priority < 2**31:
        raise UsageError(f"priority must be a 32-bit integer, got {quoted(priority)}")
    if concurrency_key is not None and (not isinstance(concurrency_key, str) or not concurrency_key):
        raise UsageError(f"concurrency_key must be a non-empty string, got {quoted(concurrency_key)}")
    table = schedules_of(store)
    now = table.now()
    row = (name, cron, agent_name, task, tenant, priority, concurrency_key, catch_up, now, now)
    if not table.add(row):
        raise UsageError(f"a schedule named {quoted(name)} exists; remove it first (nothing was written)")
    return _schedule(row)


def remove_schedule(store: Checkpointer, name: str) -> None:
    """Remove a schedule (the runs it started stay).

    Raises:
        UsageError: no schedule of that name (nothing is written).
    """
    if not schedules_of(store).remove(name):
        raise UsageError(f"no schedule named {quoted(name)}")


def list_schedules(store: Checkpointer) -> list[Schedule]:
    """Every schedule, by name."""
    return [_schedule(row) for row in schedules_of(store).rows()]


def fire_due(store: Checkpointer, agent: Agent) -> list[Submitted]:
    """Submit a run for each fire time that has come, of every schedule of ``agent`` (by name);
    return the handles (``created=False`` for a fire time another worker submitted first)."""
    table = schedules_of(store)
    handles: list[Submitted] = []
    rows = [r for r in table.rows() if r[2] == agent.name]
    if not rows:
        return handles
    now = table.now()
    for schedule in map(_schedule, rows):
        due = _due(schedule, now)
        for fire_time in due[-schedule.catch_up:]:
            handles.append(submit(store, agent, schedule.task, run_id=schedule_run_id(schedule.name, fire_time),
                                  tenant=schedule.tenant, priority=schedule.priority,
                                  concurrency_key=schedule.concurrency_key, start_at=fire_time))
        if due:
            table.fired(schedule.name, due[-1])  # after every run up to it was submitted
    return handles


def _due(schedule: Schedule, now: float) -> Sequence[float]:
    """The fire times to start now, oldest first: of those after ``last_fire`` that have come by
    ``now``, the latest ``catch_up`` (walked back from now, so a long outage costs nothing)."""
    found: list[float] = []
    it = _croniter()(schedule.cron, now)
    while len(found) < schedule.catch_up:
        previous = float(it.get_prev(float))
        if previous <= schedule.last_fire:
            break
        found.append(previous)
    return found[::-1]


def _schedule(row: tuple[object, ...]) -> Schedule:
    name, cron, agent, task, tenant, priority, key, catch_up, created, last = row
    return Schedule(name=str(name), cron=str(cron), agent=str(agent), task=str(task), tenant=str(tenant),
                    priority=int(priority),  # type: ignore[call-overload]
                    concurrency_key=None if key is None else str(key),
                    catch_up=int(catch_up), created_at=float(created), last_fire=float(last))  # type: ignore[call-overload,arg-type]
