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

Tool calls are bounded the same way (``tool_calls``, and ``tool_calls_per_tool`` for a tool by
name): a tool call counts once the run has started it (its intent is journaled: however often it
is later re-sent or looked up, and whatever its outcome), counted from the run's journal, so a
resumed run goes on counting where the crashed one stopped. Checked before each new call's intent:
a call answered from the journal, or one in flight at a crash and settled on resume, is not a new
one and is never refused. A call past a bound is not started; the run ends ``failed`` with the
same record (``budget``: ``tool_calls`` or ``tool_calls[NAME]``).

A cost bound needs each call priced: a call the price table does not know (``unpriced``) makes
the run's cost unknown, and with ``cost_usd`` set that stops the run as the bound does (never
counted as $0).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from cuaderno.durable.log import JournalLog
from cuaderno.errors import BudgetExceeded, UsageError
from cuaderno.journal.base import Checkpointer

__all__ = ["RunBudget", "ToolCalls", "check_budget", "check_tool_budget", "ended_fields"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunBudget:
    """Bounds on what one wrapped run spends (``None``: unbounded), counted from its journal.

    ``cost_usd``: priced cost of its answered model calls. ``tokens``: their input and output
    tokens. ``model_calls``: answered model requests (the run's model steps). ``model_sends``:
    requests sent, re-sends included (each re-send of a step whose fate was unknown counts).
    ``tool_calls``: tool calls started (module docstring); ``tool_calls_per_tool``: the same, for
    each tool named (``{"transfer": 3}``).

    Given to a wrapper (``budget=``), it is counted from the run's journal (a resume counts
    nothing again) and checked before every request and every new tool call: past one, the run
    ends ``failed`` and :class:`~cuaderno.errors.BudgetExceeded` is raised."""

    cost_usd: float | None = None
    tokens: int | None = None
    model_calls: int | None = None
    model_sends: int | None = None
    tool_calls: int | None = None
    tool_calls_per_tool: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        for name in ("tokens", "model_calls", "model_sends", "tool_calls"):
            _check_count(f"RunBudget.{name}", getattr(self, name))
        per_tool = self.tool_calls_per_tool
        if per_tool is not None:
            if not isinstance(per_tool, Mapping):
                raise UsageError(f"RunBudget.tool_calls_per_tool must be a mapping of tool name to count, "
                                 f"got {type(per_tool).__name__}")
            for tool, value in per_tool.items():
                if not isinstance(tool, str) or not tool:
                    raise UsageError(f"RunBudget.tool_calls_per_tool: a tool name must be a non-empty string, got {tool!r:.40}")
                _check_count(f"RunBudget.tool_calls_per_tool[{tool!r:.40}]", value)
            # A copy the caller cannot change under a running run (the dataclass is frozen).
            object.__setattr__(self, "tool_calls_per_tool", MappingProxyType(dict(per_tool)))
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


class ToolCalls:
    """One run's tool calls in this process, under the budget's tool bounds (module docstring).

    ``admitted``: the new calls this process admitted (step → tool), counted with the journal's
    intents until theirs commit (a response's calls run concurrently: each must count the others').
    A call refused waits for the calls already running to end before it raises: the framework
    cancels a refused call's siblings, and a sibling cancelled after its intent would leave an
    effect whose fate nobody recorded in a run that ends ``failed``."""

    def __init__(self) -> None:
        self.admitted: dict[str, str] = {}
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @asynccontextmanager
    async def admit(self, budget: RunBudget | None, log: JournalLog, tool: str, step_id: str) -> AsyncIterator[None]:
        """Around one call of ``tool`` at ``step_id`` (its effect run to a journaled result): a new
        call past a bound raises :class:`BudgetExceeded` once the calls running have ended, and
        is not started."""
        if log.get(step_id, "intent") is None:  # a new call; a started one is settled, never refused
            try:
                check_tool_budget(budget, log, tool, step_id, self.admitted)
            except BudgetExceeded:
                await self._idle.wait()
                raise
        self._running += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._running -= 1
            if self._running == 0:
                self._idle.set()


def check_tool_budget(budget: RunBudget | None, log: JournalLog, tool: str, step_id: str,
                      admitted: MutableMapping[str, str]) -> None:
    """Before a new call of ``tool`` at ``step_id`` is started: raise :class:`BudgetExceeded` if
    the run has started as many tool calls as a bound of ``budget`` allows (module docstring).

    Counted from the run's journal (``log.index``: every tool step with an intent) plus
    ``admitted`` (:class:`ToolCalls`). An admitted call is added to ``admitted``."""
    if budget is None or (budget.tool_calls is None and not budget.tool_calls_per_tool):
        return
    started = {step: str(ev.name) for (step, phase), ev in log.index.items() if ev.kind == "tool" and phase == "intent"}
    started.update(admitted)
    if budget.tool_calls is not None and len(started) >= budget.tool_calls:
        _over(log.run_id, "tool_calls", budget.tool_calls, len(started))
    limit = (budget.tool_calls_per_tool or {}).get(tool)
    if limit is not None:
        spent = sum(1 for name in started.values() if name == tool)
        if spent >= limit:
            _over(log.run_id, f"tool_calls[{tool}]", limit, spent)
    admitted[step_id] = tool


def _over(run_id: str, name: str, limit: int, spent: int) -> None:
    exc = BudgetExceeded(run_id, name, limit)
    exc.spent = spent  # type: ignore[attr-defined]
    raise exc


def _check_count(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise UsageError(f"{name} must be a non-negative integer or None, got {value!r:.40}")


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
