"""Per-run spending bounds for a wrapped run: what ``budget=`` on either integration checks.

The spending is the journal's: the run's summary (:class:`~cuaderno.checkpoint.Checkpoint`
counters, folded from its events) counts each answered model call, its tokens and its priced
cost once, when its result is journaled. A resumed run replays its journaled steps without
counting them again, so a crash and a resume spend no budget twice.

Checked before every model request this process sends (a step's first send, or a re-send of a
step whose fate is unknown), before its intent: a run whose journaled spending has reached a
bound sends nothing more. It ends ``failed`` with the same record cuaderno's own runner writes
(``reason: budget``, ``budget``, ``limit``, ``spent``), and :class:`~cuaderno.errors.BudgetExceeded`
is raised; every later call answers it from the journal. A bound is checked between calls: the
call that crosses it is answered and journaled (it was paid), and the next one is not sent.

A cost bound needs each call priced: a call the price table does not know (``unpriced``) makes
the run's cost unknown, and with ``cost_usd`` set that stops the run as the bound does (never
counted as $0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from cuaderno.errors import BudgetExceeded, UsageError
from cuaderno.journal.base import Checkpointer

__all__ = ["RunBudget", "check_budget", "ended_fields"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunBudget:
    """Bounds on what one wrapped run spends (``None``: unbounded), counted from its journal.

    ``cost_usd``: priced cost of its answered model calls. ``tokens``: their input and output
    tokens. ``model_calls``: answered model requests (the run's model steps). ``model_sends``:
    requests sent, re-sends included (each re-send of a step whose fate was unknown counts)."""

    cost_usd: float | None = None
    tokens: int | None = None
    model_calls: int | None = None
    model_sends: int | None = None

    def __post_init__(self) -> None:
        for name in ("tokens", "model_calls", "model_sends"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise UsageError(f"RunBudget.{name} must be a non-negative integer or None, got {value!r:.40}")
        cost = self.cost_usd
        if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0 <= cost < float("inf")):
            raise UsageError(f"RunBudget.cost_usd must be a non-negative number or None, got {cost!r:.40}")

    def exceeded(self, counters: dict[str, int], cost_usd: float) -> tuple[str, float, float] | None:
        """The first bound the spending has reached: ``(budget, limit, spent)``, or ``None``."""
        spent: dict[str, float] = {
            "tokens": counters.get("input_tokens", 0) + counters.get("output_tokens", 0),
            "model_calls": counters.get("model_calls", 0),
            "model_sends": counters.get("model_sends", 0),
        }
        for name in ("model_calls", "model_sends", "tokens"):
            limit = getattr(self, name)
            if limit is not None and spent[name] >= limit:
                return name, limit, spent[name]
        if self.cost_usd is not None:
            if counters.get("unpriced_calls", 0) > 0:
                return "cost_usd", self.cost_usd, float("nan")  # unknown: not provably under the bound
            if cost_usd >= self.cost_usd:
                return "cost_usd", self.cost_usd, cost_usd
        return None


def check_budget(store: Checkpointer, run_id: str, budget: RunBudget | None) -> None:
    """Raise :class:`BudgetExceeded` if the run's journaled spending has reached a bound of
    ``budget`` (module docstring); the caller ends the run with :func:`ended_fields`."""
    if budget is None:
        return
    cp = store.checkpoint(run_id)
    if cp is None:
        return
    over = budget.exceeded(cp.counters, cp.cost_usd)
    if over is not None:
        name, limit, spent = over
        # The error's limit is printed as given (a cost bound is a float); what was spent goes
        # with it to the run's end record.
        exc = BudgetExceeded(run_id, name, cast(int, limit))
        exc.spent = spent  # type: ignore[attr-defined]
        raise exc


def ended_fields(exc: BudgetExceeded) -> dict[str, Any]:
    """The fields of the run's ``failed`` end for an exceeded budget (cuaderno's runner's own)."""
    spent = getattr(exc, "spent", None)
    return {"budget": exc.budget, "limit": exc.limit,
            "spent": None if spent is None or spent != spent else spent}  # NaN: unknown (unpriced calls)
