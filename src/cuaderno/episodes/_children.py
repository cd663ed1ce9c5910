"""Where child passes run: the parent asks a :class:`ChildRunner` for a :class:`ChildPass` and
journals the :class:`ChildOutcome` it returns. :class:`LocalChildRunner` runs them in this process;
under Temporal each is a child workflow (:mod:`cuaderno.temporal._child`). Both run
:func:`run_child_pass`: the same loop over the same agent."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from cuaderno.cancellation import cancel
from cuaderno.errors import BudgetExceeded, CuadernoError, RunCancelled, RunClosed
from cuaderno.loop import Agent, FinalStep, Session
from cuaderno.tools.sandbox import ReadOnlyRoot

if TYPE_CHECKING:
    from cuaderno.episodes.episode import Episode


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildPass:
    """Child pass ``number`` as the parent asks for it: every field is derived from the parent's
    journal (run id, step id, task, what is left of the rejection cap), so a resumed parent asks
    for the same pass again, and a runner re-attaches to it by ``run_id``."""

    parent_run_id: str
    step_id: str
    """``<episode>.passNN``, the parent's step for this pass."""
    run_id: str
    """The child's run id: ``<parent_run_id>/<step_id>`` (under Temporal, its workflow id)."""
    number: int
    task: str
    rejected_left: int
    """Rejected responses the child's loop may still admit (the episode's cap, less what earlier
    passes spent)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChildOutcome:
    """How a child pass's run ended, read from its journal (the parent journals it as the pass's
    ``result``). Plain JSON both ways: under Temporal it is a child workflow's result."""

    status: str
    """The child run's status: ``completed`` (``output`` holds its answer), ``failed``, ``cancelled``."""
    output: str | None
    """The final answer's text, or ``None`` when the child ended without one."""
    outcome: Mapping[str, Any] = field(default_factory=dict[str, Any])
    """The child checkpoint's outcome (why it ended: a budget, a bug, a cancellation)."""
    turns: int = 0
    rejected: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    possibly_billed_twice: int = 0
    tool_errors: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChildOutcome:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})


class ChildRunner(Protocol):
    """Where a parent's child passes run: the seam between the episode's code and an engine.

    :class:`LocalChildRunner` runs them in this process (the default); under Temporal each pass is
    a child workflow (:mod:`cuaderno.temporal._child`). Both run :func:`run_child_pass`: the same
    loop over the same agent (:meth:`Episode.child_agent`)."""

    async def run(self, episode: Episode[Any], child: ChildPass) -> ChildOutcome:
        """Run child pass ``child`` (or re-attach to it: a finished one answers from its journal
        with no model call) and say how it ended."""
        ...

    def cancel(self, child_run_id: str, reason: str, *, by: str) -> None:
        """The parent was cancelled while this child pass was open: ask it to stop (best effort)."""
        ...


async def run_child_pass(agent: Agent, child: ChildPass, session: Session) -> ChildOutcome:
    """Run ``agent`` on the pass's task as run ``session.run_id`` (the same code in every runner)
    and read how it ended from ``session.store``."""
    final: FinalStep | None = None
    try:
        async for step in agent.run(child.task, session=session):
            if isinstance(step, FinalStep):
                final = step
    except (BudgetExceeded, RunClosed, RunCancelled):
        # The child run ended without an answer (a bound, or someone cancelled the child alone):
        # its checkpoint says why. Caught here, so a cancelled child is never taken for a
        # cancellation of the parent.
        pass
    except CuadernoError:
        raise  # the journal, a lease, a divergence: nothing is known about the pass yet
    except Exception:
        # A child tool raised an unclassified error: the loop journaled it as a bug and ended the
        # child failed. That is the pass's outcome; anything else is not known yet.
        cp = session.store.checkpoint(session.run_id)
        if cp is None or cp.status != "failed":
            raise
    cp = session.store.checkpoint(session.run_id)
    assert cp is not None
    output = final.output if final is not None else None
    if output is None and cp.status == "completed":
        output = str((cp.outcome or {}).get("output", ""))  # closed before: answered from its journal
    return ChildOutcome(status=cp.status, output=output, outcome=dict(cp.outcome or {}),
                        turns=cp.count("model_calls"), rejected=cp.count("rejected_responses"),
                        cost_usd=cp.cost_usd, unpriced_calls=cp.count("unpriced_calls"),
                        possibly_billed_twice=cp.count("possibly_billed_twice"), tool_errors=cp.count("tool_errors"))


class LocalChildRunner:
    """Child passes in this process, in the parent session's journal, over an open snapshot.

    Each pass is a run of its own (``child.run_id``) with the parent session's gateway, runtime,
    ownership and model caller. A finished child answers from its journal (0 model calls); one
    killed mid-way resumes under the loop's rules (no journaled response is paid again)."""

    def __init__(self, session: Session, root: ReadOnlyRoot) -> None:
        self.session, self.root = session, root

    async def run(self, episode: Episode[Any], child: ChildPass) -> ChildOutcome:
        s = self.session
        session = Session(child.run_id, s.gateway, s.store, tenant=s.tenant, owner=s.owner, retry=s.retry,
                          runtime=s.runtime, ownership=s.ownership, model_caller=s.model_caller)
        return await run_child_pass(episode.child_agent(self.root, child.rejected_left), child, session)

    def cancel(self, child_run_id: str, reason: str, *, by: str) -> None:
        store = self.session.store
        cp = store.checkpoint(child_run_id)
        if cp is not None and cp.is_open:
            try:
                cancel(store, child_run_id, reason, by=by)
            except CuadernoError:
                pass  # best effort: the child's next opener finds its parent closed anyway
