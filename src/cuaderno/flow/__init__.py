"""Flow control for a fleet of workers, coordinated by the journal's own database.

- :mod:`cuaderno.flow.queue`: a queue of submitted runs, with priorities, ``start_at``, idempotent
  starts and concurrency limits per key. An application submits a run (:func:`submit`) instead
  of starting it; every :class:`~cuaderno.worker.Worker` on the journal claims submitted runs,
  best priority first, none before its ``start_at``, never more than a key's limit
  (:func:`set_limit`) in progress at once.
- :mod:`cuaderno.flow.ratelimit`: a provider's requests and tokens per minute, shared by every
  process on the journal; a model request that must wait waits before its intent is written.

See ``docs/guide/flow-control.md`` and ``docs/guide/rate-limits.md``.
"""

from cuaderno.flow.queue import Submitted, limits, queued_state, set_limit, submit, waiting_for
from cuaderno.flow.ratelimit import RateGate, SharedLimits, rate_gate

__all__ = ["limits", "queued_state", "rate_gate", "RateGate", "set_limit", "SharedLimits", "submit", "Submitted", "waiting_for"]
