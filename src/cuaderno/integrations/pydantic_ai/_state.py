"""What one durable run shares between its model wrapper, its toolset wrapper and its agent.

Step ids are positions, the same on every replay of the run: the n-th model request of the run is
``tNNNN.model`` (counted across the agent runs one cuaderno run makes: an approval ends one, the
decision starts the next), and the i-th tool call of that response is ``tNNNN.toolII``, the ids
cuaderno's own loop uses (``cuaderno show`` and ``cuaderno approve`` read them alike).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from cuaderno.durable.log import JournalLog
from cuaderno.errors import ReplayDivergence
from cuaderno.gateway.pricing import Prices
from cuaderno.gateway.rate import RateLimit
from cuaderno.integrations._budget import RunBudget, ToolCalls
from cuaderno.integrations._compensate import Compensation
from cuaderno.integrations.pydantic_ai._effects import ToolEffect
from cuaderno.loop.agent import RetryPolicy

__all__ = ["RunState"]


@dataclass(slots=True)
class RunState:
    """One run's journal and positions (see the module docstring)."""

    log: JournalLog
    run_id: str
    tenant: str
    effects: dict[str, ToolEffect]
    retry: RetryPolicy
    key_headers: tuple[str, ...]
    prices: Prices | None = None
    """What a model step's cost is priced with (``None``: every step unpriced, counted as such)."""
    store: object = None
    """The journal (its database holds the shared rate limit's state)."""
    rate_limit: RateLimit | None = None
    """The provider's limit every worker on the journal shares (``None``: none)."""
    rng: random.Random = field(default_factory=random.Random)
    budget: RunBudget | None = None
    """The run's spending bounds, checked before every send (``None``: unbounded)."""
    compensations: dict[str, Compensation] = field(default_factory=dict)
    """What undoes each tool's effect if the run is cancelled (journaled with each result)."""
    tool_calls: ToolCalls = field(default_factory=ToolCalls)
    """The run's tool calls in this process, admitted under the budget's tool bounds."""
    model_steps: int = 0
    """Model requests made (or replayed) so far in this process's pass over the run."""
    calls: dict[str, str] = field(default_factory=dict)
    """Tool call id → its tool step id, filled as each response is made or replayed."""

    def next_model_step(self) -> str:
        step = f"t{self.model_steps:04d}.model"
        self.model_steps += 1
        return step

    def place_calls(self, step_id: str, call_ids: list[str]) -> None:
        """Give each tool call of the response at ``step_id`` its step (in the response's order).

        The latest response wins: its calls are the ones the agent runs next (before it asks the
        model again), and a provider that reuses call ids across turns (``call_0`` every turn)
        must not send a new call to an old call's journaled result."""
        turn = step_id.removesuffix(".model")
        for i, call_id in enumerate(call_ids):
            self.calls[call_id] = f"{turn}.tool{i:02d}"

    def tool_step(self, call_id: str | None) -> str:
        """The step of a tool call the agent is about to run; it must come from a journaled response."""
        step = self.calls.get(call_id or "")
        if step is None:
            # A call no response of this run holds (a history the caller built, a tool id the
            # framework made up): it has no position to journal its effect at, and running it
            # unjournaled would break the promise silently.
            raise ReplayDivergence(self.run_id, f"tool call {call_id!r}", "a call of a journaled response",
                                   "a call no model response of this run made")
        return step
