"""Flow control for a fleet of workers, coordinated by the journal's own database.

- :mod:`cuaderno.flow.ratelimit`: a provider's requests and tokens per minute, shared by every
  process on the journal; a model request that must wait waits before its intent is written.
"""

from cuaderno.flow.ratelimit import RateGate, SharedLimits, rate_gate

__all__ = ["RateGate", "SharedLimits", "rate_gate"]
