"""``DurableAgent``: a Pydantic AI agent, unchanged, run durably under a run id.

One call of :meth:`DurableAgent.run` opens the run (:func:`~cuaderno.durable.open_run`), then runs
the agent from the start with a per-run capability (:class:`CuadernoJournal`) that puts every
model request through the model-call protocol and every tool call through the effect protocol.
What the journal holds is replayed (nothing is sent or run again); the first step it lacks is
made live. So resuming a crashed run, in this process or another, is calling ``run`` again with
the same run id; a run that ended answers from its journal. :meth:`DurableAgent.run_stream` and
:meth:`DurableAgent.iter` give the framework's own streaming shapes under the same promises
(:mod:`._stream`: when their end is journaled, what an ended run gives).

Tools that require approval (``requires_approval=True``, Pydantic AI's deferred tools) end the
agent's run with ``DeferredToolRequests``; each call becomes a cuaderno approval request on disk,
bound to the fingerprint of its exact arguments, and the run is ``suspended``. After a person
decides (``cuaderno approve RUN STEP --fingerprint FP``), the next ``run`` of the run id replays up
to there and continues the agent with the decisions (``deferred_tool_results``); the approved tool
runs once, as an effect, only if the arguments still match the fingerprint approved.

What replay needs from the run's own events: ``run/start`` (``task``, the prompt; ``versions``,
the agent definition's fingerprint); the approval ``request`` (``arguments``, the exact arguments
the person is shown; ``tool_call_id``, the framework's id the decision is passed back under);
``final/result`` (``output``: the structured output as JSON; ``messages``: the whole conversation,
the framework's own dump), which a closed run answers from.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import TypeAdapter
from pydantic_ai import Agent
from pydantic_ai._agent_graph import GraphAgentState
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.models import Model
from pydantic_ai.result import StreamedRunResult
from pydantic_ai.run import AgentRun, AgentRunResult
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolDenied
from pydantic_ai.toolsets import AbstractToolset
from pydantic_core import to_jsonable_python

from cuaderno import faults
from cuaderno.durable.approval import Approval
from cuaderno.durable.opening import Mismatch, Opened, open_run
from cuaderno.errors import RunClosed, UsageError
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.pricing import Prices
from cuaderno.gateway.rate import RateLimit
from cuaderno.integrations._budget import RunBudget
from cuaderno.integrations._compensate import (
    Compensation,
    check_compensations,
    reopened,
)
from cuaderno.integrations._wrapper import CompensatingWrapper, checked_limits
from cuaderno.integrations.pydantic_ai._definition import definition_fingerprint
from cuaderno.integrations.pydantic_ai._effects import ToolEffect, check_effects
from cuaderno.integrations.pydantic_ai._messages import content, dump
from cuaderno.integrations.pydantic_ai._model import JournaledModel, check_sdk_retries
from cuaderno.integrations.pydantic_ai._resume import AgentResumable
from cuaderno.integrations.pydantic_ai._state import RunState
from cuaderno.integrations.pydantic_ai._stream import cancelled_closes, ended_on_failure, iter_refused
from cuaderno.integrations.pydantic_ai._toolset import EFFECT_VERSION, JournaledToolset, arguments_fingerprint
from cuaderno.journal.base import Checkpointer
from cuaderno.loop.agent import RetryPolicy

__all__ = ["CuadernoJournal", "DurableAgent", "DurableResult", "PendingApproval"]

OutputT = TypeVar("OutputT")

DEFAULT_KEY_HEADERS = ("Idempotency-Key", "X-Idempotency-Key")
"""The headers every model request carries the step's idempotency key in (as cuaderno's own
OpenAI gateway sends it)."""


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A tool call waiting for a person: decide it with ``cuaderno approve RUN STEP --fingerprint FP``."""

    step_id: str
    tool: str
    arguments: dict[str, Any]
    fingerprint: str


@dataclass(frozen=True, slots=True)
class DurableResult(Generic[OutputT]):
    """How a call of :meth:`DurableAgent.run` left the run.

    ``status``: ``completed`` (``output`` holds the agent's output), ``suspended`` (``pending``
    lists the calls waiting for a decision), or ``failed`` (``reason``). ``replayed``: the run had
    ended before this call, which answered from the journal and sent nothing.
    """

    run_id: str
    status: Literal["completed", "suspended", "failed"]
    output: OutputT | None = None
    messages: list[ModelMessage] = field(default_factory=list)
    pending: tuple[PendingApproval, ...] = ()
    reason: str | None = None
    replayed: bool = False


@dataclass
class CuadernoJournal(AbstractCapability[Any]):
    """The per-run capability: wraps whichever model serves each request (:class:`JournaledModel`)
    and the run's assembled toolset (:class:`JournaledToolset`). Built by :class:`DurableAgent`
    for each run; not meant to be attached to an agent by hand (it needs an opened run)."""

    state: RunState

    def get_wrapper_model(self, model: Model) -> Model | None:
        if isinstance(model, JournaledModel):
            return None
        return JournaledModel(model, self.state)

    def get_wrapper_toolset(self, toolset: AbstractToolset[Any]) -> AbstractToolset[Any] | None:
        return JournaledToolset(toolset, state=self.state)


class DurableAgent(CompensatingWrapper, Generic[OutputT]):
    """Run ``agent`` durably: journaled, keyed, counted, resumable by run id (module docstring).

    Args:
        agent: the Pydantic AI agent, as written; it is not modified.
        journal: a cuaderno journal (``SqliteCheckpointer``, ``PostgresCheckpointer``...).
        effects: each tool's effect class (:mod:`._effects`); a tool not named is
            ``non_idempotent``: a call in flight at a crash stops the run ``needs_human``.
        tenant: journaled on the run and part of every effect key.
        owner: who holds the run while it runs (shown by ``cuaderno list``).
        retry: the one retry layer for model requests (the SDK's own must be off).
        key_headers: the headers the provider idempotency key is sent in.
        on_version_mismatch: what a run started by another agent definition does: ``refuse``
            (:class:`~cuaderno.errors.VersionMismatch`), ``drain``, or a callable (see
            :func:`~cuaderno.durable.open_run`).
        prices: what each model step's cost is priced with (a :class:`~cuaderno.PriceTable`, or
            any :class:`~cuaderno.gateway.pricing.Prices`). ``None``: the maintained
            ``genai-prices`` table for the model's endpoint when the ``[prices]`` extra is
            installed; unknown models are unpriced and counted as such (``cuaderno show``).
        rate_limit: the provider's requests and tokens per minute, shared by every process on
            the journal (:class:`~cuaderno.RateLimit`: how a request waits for its turn).
        budget: bounds on what a run spends (:class:`~cuaderno.integrations.RunBudget`: how they
            are counted and checked, and what a run past one does).
        compensations: what undoes each tool's effect if the run is cancelled
            (:class:`~cuaderno.integrations.Compensation` by tool name): journaled with each result
            that happened, scheduled by the cancellation record, run once each by
            :meth:`compensate` (or a ``cuaderno worker``).

    Raises:
        UsageError: a model whose OpenAI client retries on its own (``max_retries`` must be 0:
            a retry the SDK makes is a send the journal never counts), or a malformed ``effects``.
    """

    def __init__(self, agent: Agent[Any, OutputT], *, journal: Checkpointer,
                 effects: Mapping[str, ToolEffect] | None = None, tenant: str = "default",
                 owner: str | None = None, retry: RetryPolicy | None = None,
                 key_headers: Sequence[str] = DEFAULT_KEY_HEADERS,
                 on_version_mismatch: Literal["refuse", "drain"] | Mismatch = "refuse",
                 prices: Prices | None = None, rate_limit: RateLimit | None = None,
                 budget: RunBudget | None = None,
                 compensations: Mapping[str, Compensation] | None = None) -> None:
        if not isinstance(agent, Agent):
            raise UsageError(f"DurableAgent wraps a pydantic_ai.Agent, got {type(agent).__name__}")
        if not isinstance(journal, Checkpointer):
            raise UsageError(f"journal must be a cuaderno Checkpointer, got {type(journal).__name__}")
        check_sdk_retries(agent.model)
        self.agent = agent
        self.journal = journal
        self.effects = check_effects(effects or {})
        self.tenant = tenant
        self.owner = owner or f"pydantic-ai:{os.getpid()}"
        self.retry: RetryPolicy = retry or RetryPolicy()
        self.key_headers = tuple(key_headers)
        self.on_version_mismatch = on_version_mismatch
        self.compensations = check_compensations(compensations)
        self.definition = definition_fingerprint(agent, self.effects, self.compensations)
        self.prices = prices
        self.rate_limit, self.budget = checked_limits(rate_limit, budget)

    def run_versions(self) -> dict[str, Any]:
        """The versions this agent's runs are started under: its definition's fingerprint and the
        integration's effect version (a run started under others is a ``VersionMismatch``)."""
        return {"agent": self.definition, "integration": EFFECT_VERSION}

    def resumable(self, *, deps: Any = None, deps_factory: Callable[[], Any] | None = None,
                  **run_kwargs: Any) -> AgentResumable:
        """What a worker resumes this agent's runs with (``cuaderno worker --agent module:attr``):
        each resume runs with ``deps`` (or ``deps_factory()``, made for each drive and entered if it
        is an async context manager) and ``run_kwargs``; the prompt and history come from the
        run's journal."""
        return AgentResumable(self, deps=deps, deps_factory=deps_factory, run_kwargs=run_kwargs)

    async def resume(self, run_id: str) -> str:
        """Go on with ``run_id`` from its journal (no ``deps``): a :class:`~cuaderno.integrations.Resumable`."""
        return await AgentResumable(self).resume(run_id)

    async def run(self, user_prompt: str | None = None, *, run_id: str,
                  message_history: Sequence[ModelMessage] | None = None, deps: Any = None,
                  **run_kwargs: Any) -> DurableResult[OutputT]:
        """Run (or resume) ``run_id``: see the module docstring. ``run_kwargs`` go to the agent's
        ``run`` unchanged (``model_settings``, ``usage_limits``...), and must be the same on every
        call of one run id (they are not journaled).

        Raises:
            VersionMismatch: the run was started by another agent definition.
            ReplayDivergence: another prompt or history than the run's, or a request the journal
                did not record at that step.
            BudgetExceeded: the run's ``budget`` ran out; it ended ``failed`` (journaled).
            RunCancelled: the run was cancelled (``cuaderno cancel``); it is closed with its
                record, whose ``cleanup`` lists the compensations :meth:`compensate` runs.
            UncertainEffect: a tool's effect may or may not have happened; the run is
                ``needs_human`` (``cuaderno show`` has the evidence, ``cuaderno resolve`` settles it).
        """
        history = list(message_history or [])
        opened = self._open(run_id, user_prompt, history)
        if opened.closed:
            return self._answered(opened)
        try:
            with cancelled_closes(opened):
                return await self._go(opened, user_prompt, history, deps, run_kwargs)
        finally:
            opened.release()

    @asynccontextmanager
    async def run_stream(self, user_prompt: str | None = None, *, run_id: str,
                         message_history: Sequence[ModelMessage] | None = None, deps: Any = None,
                         **run_kwargs: Any) -> AsyncIterator[StreamedRunResult[Any, OutputT]]:
        """Pydantic AI's ``run_stream``, durable: ``async with durable.run_stream(..., run_id=...) as
        stream`` gives the framework's own ``StreamedRunResult``; the run's end is journaled when
        the stream was read whole (:mod:`._stream`). An ended run gives one holding its journaled
        output and conversation. Raises what :meth:`run` raises, and
        :class:`~cuaderno.errors.RunClosed` for a run that ended ``failed``."""
        history = list(message_history or [])
        opened = self._open(run_id, user_prompt, history)
        if opened.closed:
            answered = self._answered(opened)
            if answered.status != "completed":
                raise RunClosed(opened.run_id, opened.checkpoint.status)
            messages = list(answered.messages)
            yield StreamedRunResult(messages, len(history),
                                    run_result=AgentRunResult(cast(OutputT, answered.output),
                                                              _state=GraphAgentState(message_history=messages),
                                                              _new_message_index=len(history)))
            return
        async with self._streamed(opened) as state, self.agent.run_stream(
                user_prompt, message_history=history, deps=deps, capabilities=[CuadernoJournal(state)],
                **run_kwargs) as stream:
            yield stream
            if stream.is_complete:  # read whole: its output is the run's (else the run stays open)
                self._ended(opened, state, await stream.get_output(), stream.all_messages())

    @asynccontextmanager
    async def iter(self, user_prompt: str | None = None, *, run_id: str,
                   message_history: Sequence[ModelMessage] | None = None, deps: Any = None,
                   **run_kwargs: Any) -> AsyncIterator[AgentRun[Any, OutputT]]:
        """Pydantic AI's ``iter``, durable: ``async with durable.iter(..., run_id=...) as
        agent_run`` gives the framework's own ``AgentRun``; the run's end is journaled when the
        graph reached its end (:mod:`._stream`). Raises what :meth:`run` raises, and
        :class:`~cuaderno.errors.RunClosed` for an ended run (the framework's graph run cannot be
        rebuilt from a journal: :meth:`run` answers it)."""
        history = list(message_history or [])
        opened = self._open(run_id, user_prompt, history)
        if opened.closed:
            raise iter_refused(opened.run_id, opened.checkpoint.status)
        async with self._streamed(opened) as state, self.agent.iter(
                user_prompt, message_history=history, deps=deps, capabilities=[CuadernoJournal(state)],
                **run_kwargs) as agent_run:
            yield agent_run
            if agent_run.result is not None:  # the graph reached its end
                self._ended(opened, state, agent_run.result.output, agent_run.result.all_messages())

    @asynccontextmanager
    async def _streamed(self, opened: Opened) -> AsyncIterator[RunState]:
        """The hold of a :meth:`run_stream` or :meth:`iter` on its open run: the state its journaled
        model and toolset share; a cancellation met closes the run, a failure ends it (:mod:`._stream`),
        and the run is released at the end whatever happened."""
        try:
            with cancelled_closes(opened), ended_on_failure(opened):
                yield self._state(opened)
        finally:
            opened.release()

    def _open(self, run_id: str, user_prompt: str | None, history: list[ModelMessage]) -> Opened:
        """Open (or reopen) ``run_id`` for this call: the task it is checked against is the prompt
        and the history, journaled on its ``run/start`` (module docstring)."""
        if not isinstance(run_id, str) or not run_id:
            raise UsageError("run_id must be a non-empty string")
        task = {"prompt": to_jsonable_python(user_prompt, fallback=repr), "history": content(dump(history))}
        with reopened(self.journal, run_id):
            return open_run(self.journal, run_id,
                            task=user_prompt if isinstance(user_prompt, str) else json.dumps(task["prompt"]),
                            task_fingerprint=fingerprint(task), versions=self.run_versions(),
                            tenant=self.tenant, owner=self.owner, name=self.agent.name,
                            start={"framework": "pydantic-ai", "prompt": task["prompt"], "history": dump(history)},
                            on_version_mismatch=self.on_version_mismatch)

    def _state(self, opened: Opened) -> RunState:
        """The per-run state the journaled model and toolset share."""
        return RunState(log=opened.log, run_id=opened.run_id, tenant=self.tenant, effects=self.effects,
                        retry=self.retry, key_headers=self.key_headers, prices=self.prices, store=self.journal,
                        rate_limit=self.rate_limit, rng=random.Random(), budget=self.budget,
                        compensations=self.compensations)

    def _finish(self, opened: Opened, output: Any, messages: list[ModelMessage]) -> None:
        """Journal the run's end: its output and whole conversation, what a later call answers from."""
        faults.point("final.K0")
        jsonable = to_jsonable_python(output, fallback=repr)
        opened.finish(output if isinstance(output, str) else json.dumps(jsonable, sort_keys=True),
                      structured=jsonable, structured_type=type(output).__qualname__, messages=dump(messages))
        faults.point("final.K7")

    def _ended(self, opened: Opened, state: RunState, output: Any, messages: list[ModelMessage]) -> None:
        """A streamed run's end: approvals it ended in are journaled (:meth:`_approvals`; the run
        goes on with :meth:`run` once decided), any other output finishes the run."""
        if isinstance(output, DeferredToolRequests):
            self._approvals(state, output)
        else:
            self._finish(opened, output, messages)

    def _journal(self) -> Checkpointer:
        return self.journal

    async def _go(self, opened: Opened, user_prompt: str | None, history: list[ModelMessage], deps: Any,
                  run_kwargs: dict[str, Any]) -> DurableResult[OutputT]:
        state = self._state(opened)
        capability = CuadernoJournal(state)
        prompt: str | None = user_prompt
        deferred: DeferredToolResults | None = None
        while True:
            with ended_on_failure(opened):
                result = await self.agent.run(prompt, message_history=history, deferred_tool_results=deferred,
                                              deps=deps, capabilities=[capability], **run_kwargs)
            output = result.output
            if not isinstance(output, DeferredToolRequests):
                break
            pending, decisions = self._approvals(state, output)
            if pending:
                return DurableResult(opened.run_id, "suspended", messages=result.all_messages(), pending=pending)
            prompt, history, deferred = None, result.all_messages(), decisions
        messages = result.all_messages()
        self._finish(opened, output, messages)
        return DurableResult(opened.run_id, "completed", output=output, messages=messages)

    def _approvals(self, state: RunState,
                   requests: DeferredToolRequests) -> tuple[tuple[PendingApproval, ...], DeferredToolResults]:
        """Journal an approval request for each call not yet asked about; return the calls still
        waiting and the decisions taken (each bound to the fingerprint of the exact arguments)."""
        if requests.calls:  # not reached: the journaled toolset makes each a step waiting in the journal
            raise UsageError("external (deferred) tool calls reached the agent's output unjournaled; nothing ran")
        log = state.log
        pending: list[PendingApproval] = []
        decisions = DeferredToolResults()
        for part in requests.approvals:
            step = state.tool_step(part.tool_call_id)
            arguments = dict(requests.validated_args.get(part.tool_call_id) or part.args_as_dict())
            args_fp = arguments_fingerprint(part.tool_name, arguments)
            approval = Approval(log, step, part.tool_name, to_jsonable_python(arguments), args_fp)
            approval.request("the tool requires approval (pydantic-ai requires_approval)",
                             extra={"tool_call_id": part.tool_call_id})
            decided = approval.decided()
            if decided is None:
                pending.append(PendingApproval(approval.step_id, part.tool_name, arguments, args_fp))
            elif decided.approved:
                decisions.approvals[part.tool_call_id] = True
            else:
                reason = decided.reason or "rejected by a person"
                decisions.approvals[part.tool_call_id] = ToolDenied(f"The tool call was denied: {reason}")
        log.commit()  # approval.K1 inside its transaction (the journal log passes it)
        faults.point("approval.K7")
        return tuple(pending), decisions

    def _answered(self, opened: Opened) -> DurableResult[OutputT]:
        """A run that ended, answered from its journal: nothing is sent or run."""
        cp = opened.checkpoint
        if cp.status != "completed" or cp.outcome is None:
            reason = None
            for ev in reversed(opened.events):
                if ev.step_id == "run" and ev.phase == "end":
                    reason = str(ev.payload.get("reason"))
                    break
            return DurableResult(opened.run_id, "failed", reason=reason, replayed=True)
        outcome = cp.outcome
        messages = ModelMessagesTypeAdapter.validate_python(outcome.get("messages") or [])
        return DurableResult(opened.run_id, "completed", output=self._output(outcome.get("structured"), outcome.get("structured_type")),
                             messages=messages, replayed=True)

    def _output(self, jsonable: Any, kind: Any) -> Any:
        """The journaled output as the agent's output type (``kind``: the journaled type name picks
        the member of a list of output types), where the type can be rebuilt from JSON; else the JSON."""
        declared = self.agent.output_type
        members: list[Any] = list(declared) if isinstance(declared, (list, tuple)) else [declared]
        for member in members:
            if isinstance(member, type) and kind not in (None, member.__qualname__):
                continue
            try:
                return TypeAdapter[Any](member).validate_python(jsonable)
            except Exception:  # not a type pydantic rebuilds (a function, a marker): try the next
                continue
        return jsonable

