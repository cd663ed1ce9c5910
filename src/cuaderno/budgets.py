"""Per-run bounds, one per kind of second attempt, counted separately (seed 001 §2).

Retry (same intent, same arguments, same effect identity), repair (fix an invalid input), replan
(the world changed: read fresh state), reflect (weigh a refusal or a permanent failure and choose
another course), escalate (ask a stronger tier or a person), and rejected responses (empty or
refused generations where a turn had to act, final answers that fail the agent's
``output_type``). An agent that "reasons" ten times about a 403 is hiding a broken retry: each
kind has its own bound, and the spent amounts live in the run's checkpoint, so a resumed run
continues from what it had already spent.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["Budgets"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Budgets:
    """Bounds per run (``None`` = unbounded). Constants in code, not wishes in a prompt.

    ``rejected_responses`` is counted per episode (the whole run), not per round: three rounds of
    three attempts would otherwise be nine calls.
    """

    retries: int | None = 10
    repairs: int | None = 3
    replans: int | None = 3
    reflects: int | None = 5
    escalations: int | None = 5
    rejected_responses: int | None = 3

    def limit(self, name: str) -> int | None:
        """The bound for one counter, or ``None`` when it has none."""
        value: int | None = getattr(self, name, None) if name in _NAMES else None
        return value


_NAMES = frozenset(f.name for f in fields(Budgets))
