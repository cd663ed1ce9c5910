"""What one durable run shares between its model wrapper and its tool wrappers."""

from __future__ import annotations

from dataclasses import dataclass, field

from cuaderno.durable import JournalLog
from cuaderno.durable.model_call import Retrying
from cuaderno.gateway.pricing import Prices
from cuaderno.gateway.rate import RateLimit
from cuaderno.integrations._budget import RunBudget, ToolCalls
from cuaderno.integrations._compensate import Compensation

__all__ = ["POLICY_VERSION", "RunShared"]

POLICY_VERSION = "openai-agents/1"
"""Journaled on every effect intent, and part of every effect key: the rules the integration
derives keys and step ids by. A later version that derives them otherwise changes it, so a run
started under this one keeps the keys its intents hold (the effect protocol reads them back)."""


@dataclass(slots=True)
class RunShared:
    """The run being driven: its journal, its identity, and the step counter.

    ``model_steps`` counts the model calls this process has made or replayed, in the order the
    SDK asks for them: the SDK's loop is deterministic given the same model responses and tool
    outputs, and both are replayed from the journal, so the n-th call of a resume is the n-th call
    of the first process (its request fingerprint is checked to prove it). ``turn`` is the model
    step whose tool calls are running: a tool step is named after it and the model's call id, so
    parallel calls get distinct, stable step ids whatever order they finish in."""

    log: JournalLog
    run_id: str
    tenant: str
    retry: Retrying
    prices: Prices | None = None
    """What a model step's cost is priced with (``None``: every step unpriced, counted as such)."""
    store: object = None
    """The journal (its database holds the shared rate limit's state)."""
    rate_limit: RateLimit | None = None
    """The provider's limit every worker on the journal shares (``None``: none)."""
    budget: RunBudget | None = None
    """The run's spending bounds, checked before every send (``None``: unbounded)."""
    compensations: dict[str, Compensation] = field(default_factory=dict)
    """What undoes each tool's effect if the run is cancelled (journaled with each result)."""
    guards: dict[tuple[str, str], int] = field(default_factory=dict)
    """Calls of each guardrail (``in``/``out``, name) in this pass: the number in its step id."""
    tool_calls: ToolCalls = field(default_factory=ToolCalls)
    """The run's tool calls in this process, admitted under the budget's tool bounds."""
    model_steps: int = 0
    turn: int = -1
