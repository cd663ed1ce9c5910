"""What both durable wrappers (OpenAI Agents' ``DurableRunner``, Pydantic AI's ``DurableAgent``)
check and do alike: the shared limits they take, and ``compensate``."""

from __future__ import annotations

from typing import Any

from cuaderno.durable.model_call import Retrying
from cuaderno.errors import UsageError
from cuaderno.gateway.rate import RateLimit
from cuaderno.integrations._budget import RunBudget
from cuaderno.integrations._compensate import Compensation, compensate_run
from cuaderno.journal.base import Checkpointer

__all__ = ["CompensatingWrapper", "checked_limits"]


def checked_limits(rate_limit: RateLimit | None, budget: RunBudget | None) -> tuple[RateLimit | None, RunBudget | None]:
    """``rate_limit`` and ``budget`` as given, once each is known to be of its type (or ``None``).

    Raises:
        UsageError: either is something else.
    """
    if rate_limit is not None and not isinstance(rate_limit, RateLimit):
        raise UsageError(f"rate_limit must be a RateLimit or None, got {type(rate_limit).__name__}")
    if budget is not None and not isinstance(budget, RunBudget):
        raise UsageError(f"budget must be a RunBudget or None, got {type(budget).__name__}")
    return rate_limit, budget


class CompensatingWrapper:
    """A wrapper whose cancelled runs may have scheduled compensations (:meth:`compensate`)."""

    owner: str
    retry: Retrying
    compensations: dict[str, Compensation]

    def _journal(self) -> Checkpointer:
        """The journal the wrapper's runs are in."""
        raise NotImplementedError

    async def compensate(self, run_id: str) -> list[dict[str, Any]]:
        """Run the compensations the cancelled run ``run_id`` scheduled, each once, as an effect
        (see :class:`~cuaderno.integrations.Compensation`); return their journaled results.

        Raises:
            CuadernoError: the run is not cancelled.
            UsageError: a scheduled compensation's tool is not declared in ``compensations``.
            UncertainEffect: a compensation's fate is unknown; ``cuaderno resolve`` settles it.
        """
        return await compensate_run(self._journal(), run_id, self.compensations, owner=self.owner, retry=self.retry)
