"""Resuming a ``DurableAgent`` run from its journal alone: what a worker does with it.

A worker knows the run id only. The prompt and the message history the run was started with are
in its ``run/start`` event (``prompt``: the prompt as JSON, a string or ``null``; ``history``: the
messages, the framework's own dump), read back here and handed to :meth:`DurableAgent.run`, which
checks them against the run's task fingerprint as any other call. What is not journaled (``deps``,
the agent's ``run`` keywords) the worker is given when the resumable is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import ModelMessagesTypeAdapter

from cuaderno.errors import UsageError, quoted
from cuaderno.integrations._worker import entered, start_event
from cuaderno.journal.base import Checkpointer

if TYPE_CHECKING:
    from cuaderno.integrations.pydantic_ai._agent import DurableAgent

__all__ = ["AgentResumable"]


class AgentResumable:
    """A :class:`~cuaderno.integrations.Resumable` for one :class:`DurableAgent`: each resume
    runs it with ``deps`` (or what ``deps_factory()`` makes for that drive, entered if it is an
    async context manager) and ``run_kwargs``, as the application's own calls do."""

    def __init__(self, durable: DurableAgent[Any], *, deps: Any = None, deps_factory: Callable[[], Any] | None = None,
                 run_kwargs: dict[str, Any] | None = None) -> None:
        if deps is not None and deps_factory is not None:
            raise UsageError("give deps or deps_factory, not both")
        if deps_factory is not None and not callable(deps_factory):
            raise UsageError("deps_factory must be a function of no arguments")
        self.durable = durable
        self.deps = deps
        self.deps_factory = deps_factory
        self.run_kwargs = dict(run_kwargs or {})

    @property
    def journal(self) -> Checkpointer:
        return self.durable.journal

    def run_versions(self) -> dict[str, Any]:
        return self.durable.run_versions()

    async def compensate(self, run_id: str) -> list[dict[str, Any]]:
        return await self.durable.compensate(run_id)

    async def resume(self, run_id: str) -> str:
        """Go on with ``run_id`` from its journal; the status it stopped in.

        Raises:
            RunNotFound: the agent's journal has no such run.
            UsageError: the run was started with a prompt a worker cannot rebuild (not text).
        """
        start = start_event(self.durable.journal, run_id).payload
        if "prompt" in start:
            prompt = start["prompt"]
            history = ModelMessagesTypeAdapter.validate_python(start.get("history") or [])
        else:  # journaled before the start recorded them: a text prompt, no history
            prompt, history = start.get("task"), []
        if prompt is not None and not isinstance(prompt, str):
            raise UsageError(f"run {quoted(run_id)} was started with a prompt that is not text; "
                             "resume it by calling DurableAgent.run with that prompt")
        async with entered(self.deps, self.deps_factory) as deps:
            result = await self.durable.run(prompt, run_id=run_id, message_history=history, deps=deps,
                                            **self.run_kwargs)
        return result.status
