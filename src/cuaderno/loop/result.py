"""``run_to_end`` and ``run_sync``: drive a run until it stops, and say how it stopped.

:meth:`Agent.run <cuaderno.loop.agent.Agent.run>` yields steps; most callers want the answer.
:func:`run_to_end` iterates for them and returns a :class:`RunResult` built from the steps it saw
and from the run's checkpoint (read after the loop stopped, so its counters and cost are the
journal's, the whole run's, not only this process's).

A run that stops to wait for something (a person's approval, a person's judgement on an effect
nobody can know happened) is not an error of the call: it returns with ``status`` ``"suspended"``
or ``"needs_human"`` and what the run waits for. A run that ended for good without an answer
(a budget, a cancellation), now or before this call, returns ``"failed"`` or ``"cancelled"`` with
the record. Everything
else (bad input, a journal that refuses, a version mismatch, a gateway error) is raised as it
would be by :meth:`Agent.run`: those are for the caller to act on, not states of the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from cuaderno.checkpoint import Checkpoint
from cuaderno.errors import BudgetExceeded, RunCancelled, RunClosed, UncertainEffect, UsageError
from cuaderno.events.payloads import Outcome, PendingApproval, UncertainEvidence
from cuaderno.gateway import base
from cuaderno.loop.steps import FinalStep, Step

if TYPE_CHECKING:
    from cuaderno.loop.agent import Agent, Session

__all__ = ["RunResult", "Usage", "run_sync", "run_to_end"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage(base.Usage):
    """Tokens the whole run spent (every process that worked on it), from its checkpoint: the
    token counts of one call (:class:`cuaderno.Usage`), summed over the run's calls."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


_TOKENS = tuple(f.name for f in fields(Usage))
"""The checkpoint's counters a run's :class:`Usage` is read from: its fields, by name."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    """How a run stopped, and what it produced and spent.

    Attributes:
        run_id: the run.
        status: ``completed``, ``suspended`` (waiting for an approval), ``needs_human`` (an
            effect nobody can know happened), ``failed`` or ``cancelled``.
        output: the final answer: the text, or, for an agent with an ``output_type``, the
            validated model instance rebuilt from the journaled JSON. ``None`` unless completed.
        text: the final answer's text as the model wrote it (``None`` unless completed).
        usage: tokens the whole run spent.
        cost_usd: what the priced calls cost, summed. Calls without a price are not in it: they
            are counted in ``unpriced_calls``, never taken as free.
        unpriced_calls: model calls (and lower-tier calls) whose price is unknown.
        possibly_billed_twice: re-sends of a request whose first send may have been billed too.
        steps: the steps this call yielded (a resumed run yields only what happened now).
        pending: for ``suspended``: the approvals waiting, by approval step id.
        uncertain: for ``needs_human``: the evidence for each step nobody can know happened.
        outcome: the journaled final, failure or cancellation record.
        replayed: the run was already completed: this is its recorded answer.
        checkpoint: the run's checkpoint when the call returned.
    """

    run_id: str
    status: str
    output: Any = None
    text: str | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    possibly_billed_twice: int = 0
    steps: tuple[Step, ...] = ()
    pending: dict[str, PendingApproval] = field(default_factory=dict[str, PendingApproval])
    uncertain: dict[str, UncertainEvidence] = field(default_factory=dict[str, UncertainEvidence])
    outcome: Outcome | None = None
    replayed: bool = False
    checkpoint: Checkpoint | None = None

    @property
    def completed(self) -> bool:
        """Whether the run gave its final answer."""
        return self.status == "completed"


async def run_to_end(agent: Agent, task: str, *, session: Session) -> RunResult:
    """Run (or resume) ``session.run_id`` until it stops; see the module docstring."""
    steps: list[Step] = []
    final: FinalStep | None = None
    try:
        async for step in agent.run(task, session=session):
            steps.append(step)
            if isinstance(step, FinalStep):
                final = step
    except (BudgetExceeded, RunCancelled, RunClosed, UncertainEffect):
        # The run stopped in a state its journal records (failed, cancelled, needs_human) and
        # the checkpoint read below reports; anything else is the caller's to handle.
        pass
    return _result(agent, session, steps, final)


def _result(agent: Agent, session: Session, steps: list[Step], final: FinalStep | None) -> RunResult:
    cp = session.store.checkpoint(session.run_id)
    if cp is None:  # pragma: no cover - the loop wrote the run's start before any step
        raise UsageError(f"run {session.run_id!r} has no checkpoint after running")
    output: Any = None
    text: str | None = None
    if cp.status == "completed":
        record: Mapping[str, Any] = final.data if final is not None else (cp.outcome or {})
        text = str(record.get("output", ""))
        output = agent.output_of(record)
    return RunResult(run_id=session.run_id, status=cp.status, output=output, text=text,
                     usage=Usage(**{name: cp.count(name) for name in _TOKENS}), cost_usd=cp.cost_usd,
                     unpriced_calls=cp.count("unpriced_calls"),
                     possibly_billed_twice=cp.count("possibly_billed_twice"), steps=tuple(steps),
                     pending=dict(cp.pending), uncertain=dict(cp.uncertain), outcome=cp.outcome,
                     replayed=final is not None and final.replayed, checkpoint=cp)


T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new event loop, from synchronous code.

    Raises:
        UsageError: called from inside a running event loop (``asyncio.run`` would fail, and
            blocking that loop would stall everything on it): ``await agent.run_to_end(...)``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()  # never awaited: closed so Python does not warn about it
    raise UsageError("run_sync was called inside a running event loop; use `await agent.run_to_end(...)` there")
