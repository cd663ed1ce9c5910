"""Resuming a ``DurableRunner`` run from its journal alone: what a worker does with it.

A worker knows the run id only. The run's input is its task (a string) or, for a list of input
items, the ``input`` field of its ``run/start`` event (the items as JSON), read back here and
handed to :meth:`DurableRunner.run`, which checks it against the run's task fingerprint as any
other call. What is not journaled (the agent, the run context, ``max_turns``, the run config) the
worker is given when the resumable is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agents import Agent, RunConfig

from cuaderno.errors import UsageError
from cuaderno.integrations._worker import entered, start_event
from cuaderno.journal.base import Checkpointer

if TYPE_CHECKING:
    from cuaderno.integrations.openai_agents._runner import DurableRunner

__all__ = ["RunnerResumable"]


class RunnerResumable:
    """A :class:`~cuaderno.integrations.Resumable` for one agent on one :class:`DurableRunner`:
    each resume runs it with ``context`` (or what ``context_factory()`` makes for that drive,
    entered if it is an async context manager), ``max_turns`` and ``run_config``."""

    def __init__(self, runner: DurableRunner, agent: Agent[Any], *, context: Any = None,
                 context_factory: Callable[[], Any] | None = None, max_turns: int,
                 run_config: RunConfig | None = None) -> None:
        if not isinstance(agent, Agent):
            raise UsageError(f"agent must be an agents.Agent, got {type(agent).__name__}")
        if context is not None and context_factory is not None:
            raise UsageError("give context or context_factory, not both")
        if context_factory is not None and not callable(context_factory):
            raise UsageError("context_factory must be a function of no arguments")
        self.runner, self.agent = runner, agent
        self.context, self.context_factory = context, context_factory
        self.max_turns, self.run_config = max_turns, run_config

    @property
    def journal(self) -> Checkpointer:
        return self.runner.store

    def run_versions(self) -> dict[str, Any]:
        return self.runner.run_versions(self.agent)

    async def compensate(self, run_id: str) -> list[dict[str, Any]]:
        return await self.runner.compensate(run_id)

    async def resume(self, run_id: str) -> str:
        """Go on with ``run_id`` from its journal; the status it stopped in.

        Raises:
            RunNotFound: the runner's journal has no such run.
        """
        start = start_event(self.runner.store, run_id).payload
        items = start.get("input")
        task: str | list[Any] = list(items) if isinstance(items, list) else str(start.get("task"))
        async with entered(self.context, self.context_factory) as context:
            result = await self.runner.run(self.agent, task, run_id=run_id, context=context,
                                           max_turns=self.max_turns, run_config=self.run_config)
        return result.status
