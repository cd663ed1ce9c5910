"""Flow control for a fleet of workers: a queue of submitted runs, with priorities,
``start_at``, idempotent starts and concurrency limits per key.

An application submits a run (:func:`submit`) instead of starting it; every
:class:`~cuaderno.worker.Worker` on the journal claims submitted runs, best priority first,
none before its ``start_at``, never more than a key's limit (:func:`set_limit`) in progress at
once; cron schedules (:func:`add_schedule`) that start one run per fire time. See
``docs/guide/flow-control.md``.

A provider's requests and tokens per minute, shared by every worker on the journal (a model
request that must wait waits before its intent is written): :mod:`cuaderno.flow.ratelimit`,
``docs/guide/rate-limits.md``.
"""

from cuaderno.flow.queue import Submitted, limits, queued_state, set_limit, submit, waiting_for
from cuaderno.flow.ratelimit import RateGate, SharedLimits, rate_gate
from cuaderno.flow.schedules import (
    Schedule,
    add_schedule,
    fire_due,
    list_schedules,
    remove_schedule,
    schedule_run_id,
)

__all__ = ["RateGate", "Schedule", "SharedLimits", "Submitted", "add_schedule", "fire_due", "limits",
           "list_schedules", "queued_state", "rate_gate", "remove_schedule", "schedule_run_id", "set_limit",
           "submit", "waiting_for"]
