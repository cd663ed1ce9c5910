"""``DurableRunner``: the SDK's ``Runner.run``, with every model call and tool call journaled.

``await DurableRunner(store, effects=...).run(agent, input, run_id=...)`` opens the run
(:func:`cuaderno.durable.open_run`), then drives the SDK's own ``Runner.run`` on a copy of the
agent whose model and function tools are wrapped (:mod:`._model`, :mod:`._tools`). Calling it
again with the same run id, in any process, replays what is journaled (no model call paid twice,
no effect run twice) and goes on from there; a run that ended answers from its journal.

How a run stops, and what is left on disk:

- completed: the final output (its text, and the structured value for an ``output_type``) is
  the run's ``final`` record;
- ``suspended``: a ``needs_approval`` tool interrupted the run; each pending call is a cuaderno
  approval request bound to the fingerprint of its exact arguments. ``cuaderno approve`` (or
  ``deny``) decides; the next ``run`` with the run id continues with the decision;
- ``needs_human``: an effect's outcome cannot be known (:class:`~cuaderno.errors.UncertainEffect`
  is raised, the evidence journaled); ``cuaderno resolve`` settles it and the next run goes on;
- a model call that fails past the retry bounds (any class): the failure is journaled, the
  error raised, and the run left open and released, as cuaderno's own runner leaves it (the next
  run sends the step again with the same key, counted; a permanent error, a revoked key say,
  is fixed and the same run goes on);
- any other error of the run (the SDK's ``MaxTurnsExceeded``, a guardrail, a tool bug) ends it
  ``failed`` and is raised.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from agents import Agent, AgentOutputSchemaBase, Handoff, Model, RunConfig, Runner, RunResult, RunResultStreaming
from agents.items import ToolApprovalItem
from agents.models.multi_provider import MultiProvider
from agents.run import DEFAULT_MAX_TURNS
from agents.stream_events import StreamEvent
from agents.tool import FunctionTool, Tool
from pydantic import TypeAdapter

from cuaderno import faults
from cuaderno.durable import Approval, Opened, open_run
from cuaderno.durable.effect import BodyBug
from cuaderno.durable.model_call import Retrying
from cuaderno.errors import (
    BudgetExceeded,
    GatewayError,
    JournalError,
    RunCancelled,
    RunClosed,
    UncertainEffect,
    UsageError,
)
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.pricing import Prices, default_prices
from cuaderno.gateway.rate import RateLimit
from cuaderno.integrations._budget import RunBudget, ended_fields
from cuaderno.integrations._compensate import (
    Compensation,
    check_compensations,
    close_cancelled,
    reopened,
)
from cuaderno.integrations._wrapper import CompensatingWrapper, checked_limits
from cuaderno.integrations.openai_agents._definition import agent_fingerprint
from cuaderno.integrations.openai_agents._effects import ToolEffect, resolve_effects
from cuaderno.integrations.openai_agents._guardrails import journaled_input_guardrail, journaled_output_guardrail
from cuaderno.integrations.openai_agents._model import DurableModel, DurableModelProvider, jsonable
from cuaderno.integrations.openai_agents._resume import RunnerResumable
from cuaderno.integrations.openai_agents._state import RunShared
from cuaderno.integrations.openai_agents._tools import arguments_of, call_fingerprint, tool_step_id, wrap_tool
from cuaderno.journal.base import Checkpointer
from cuaderno.loop.agent import RetryPolicy

__all__ = ["DurableResult", "DurableRunner", "DurableStream"]

@dataclass(slots=True)
class DurableResult:
    """How a :meth:`DurableRunner.run` call left the run.

    ``status``: ``completed`` or ``suspended`` (approvals pending, listed in ``pending`` by
    approval step id with the tool, arguments and fingerprint ``cuaderno approve`` binds).
    ``final_output``: the agent's final output (the ``output_type`` value, rebuilt from the
    journal when the run had already ended). ``result``: the SDK's own ``RunResult`` (or
    ``RunResultStreaming``) of this process (``None`` when the run was answered from its journal: nothing ran)."""

    run_id: str
    status: Literal["completed", "suspended"]
    final_output: Any = None
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    result: RunResult | RunResultStreaming | None = None

    @property
    def replayed(self) -> bool:
        """Whether the run had ended before this call (answered from the journal)."""
        return self.result is None and self.status == "completed"


class DurableRunner(CompensatingWrapper):
    """Runs OpenAI Agents SDK agents durably on a cuaderno journal (see the module docstring).

    Args:
        store: the journal (``SqliteCheckpointer``, ``PostgresCheckpointer``...).
        effects: each function tool's effect class by tool name (``"idempotent"``,
            ``"non_idempotent"``, ``"effect_free"``, or ``lookup(fn)``); undeclared tools are
            non-idempotent (an unknown outcome stops the run ``needs_human``).
        tenant: in every effect key, recorded on the run (a resume under another is refused).
        owner: who holds the run while it runs (default: host and pid).
        retry: bounds on retries (unsent failures) and re-sends (ambiguous ones) of a step.
        agent_version: the version label recorded on the run. ``None`` (default): the agent
            definition's fingerprint, so a changed agent is a ``VersionMismatch``; a label you
            choose keeps runs resumable across changes you declare compatible.
        on_version_mismatch: ``"refuse"`` or ``"drain"`` (see :func:`cuaderno.durable.open_run`).
        prices: what each model step's cost is priced with (a :class:`~cuaderno.PriceTable`, or
            any :class:`~cuaderno.gateway.pricing.Prices`). ``None``: the maintained
            ``genai-prices`` table when the ``[prices]`` extra is installed, found by the model's
            name; unknown models are unpriced and counted as such (``cuaderno show``).
        rate_limit: the provider's requests and tokens per minute, shared by every process on
            the journal (:class:`~cuaderno.RateLimit`: how a request waits for its turn).
        budget: bounds on what a run spends (:class:`~cuaderno.integrations.RunBudget`: how they
            are counted and checked, and what a run past one does).
        compensations: what undoes each function tool's effect if the run is cancelled
            (:class:`~cuaderno.integrations.Compensation` by tool name): journaled with each result
            that happened, scheduled by the cancellation record, run once each by
            :meth:`compensate` (or a ``cuaderno worker``). Part of the definition's fingerprint.
    """

    def __init__(self, store: Checkpointer, *, effects: Mapping[str, ToolEffect | str] | None = None,
                 tenant: str = "default", owner: str | None = None, retry: Retrying | None = None,
                 agent_version: str | None = None,
                 on_version_mismatch: Literal["refuse", "drain"] = "refuse", prices: Prices | None = None,
                 rate_limit: RateLimit | None = None, budget: RunBudget | None = None,
                 compensations: Mapping[str, Compensation] | None = None) -> None:
        if not isinstance(store, Checkpointer):
            raise UsageError(f"store must be a Checkpointer, got {type(store).__name__}")
        if not isinstance(tenant, str) or not tenant:
            raise UsageError("tenant must be a non-empty string")
        if agent_version is not None and (not isinstance(agent_version, str) or not agent_version):
            raise UsageError("agent_version must be a non-empty string or None")
        self.store = store
        self.effects = resolve_effects(effects)
        self.tenant = tenant
        self.owner = owner or f"openai-agents@{socket.gethostname()}:{os.getpid()}"
        self.retry: Retrying = retry or RetryPolicy()
        self.agent_version = agent_version
        self.on_version_mismatch = on_version_mismatch
        self.prices = prices if prices is not None else default_prices()
        self.rate_limit, self.budget = checked_limits(rate_limit, budget)
        self.compensations = check_compensations(compensations)

    def _journal(self) -> Checkpointer:
        return self.store

    async def run(self, agent: Agent[Any], input: str | list[Any], *, run_id: str, context: Any = None,
                  max_turns: int = DEFAULT_MAX_TURNS, run_config: RunConfig | None = None) -> DurableResult:
        """Run ``agent`` on ``input`` as run ``run_id``, or go on with it (module docstring).

        ``input`` is a string or the SDK's list of input items (a multi-turn conversation); it is
        the run's task: another input under the same run id is a ``ReplayDivergence``."""
        stream = self._stream(agent, input, run_id, context, max_turns, run_config, streamed=False)
        async for _ in stream.stream_events():
            pass
        assert stream.result is not None
        return stream.result

    def run_streamed(self, agent: Agent[Any], input: str | list[Any], *, run_id: str, context: Any = None,
                     max_turns: int = DEFAULT_MAX_TURNS, run_config: RunConfig | None = None) -> DurableStream:
        """:meth:`run` through the SDK's ``Runner.run_streamed``: iterate
        :meth:`DurableStream.stream_events` for the SDK's stream events, then read
        :attr:`DurableStream.result`. The same run id may be run either way: each model step is
        journaled whole (its ``response.completed`` is handed on once journaled), and a step
        already journaled streams as that one event. Bad arguments raise here, before anything
        is written."""
        return self._stream(agent, input, run_id, context, max_turns, run_config, streamed=True)

    def _stream(self, agent: Agent[Any], input: str | list[Any], run_id: str, context: Any, max_turns: int,
                run_config: RunConfig | None, *, streamed: bool) -> DurableStream:
        if not isinstance(agent, Agent):
            raise UsageError(f"agent must be an agents.Agent, got {type(agent).__name__}")
        if not isinstance(run_id, str) or not run_id:
            raise UsageError("run_id must be a non-empty string")
        if not isinstance(input, (str, list)):
            raise UsageError(f"input must be a string or a list of input items, got {type(input).__name__}")
        unknown = sorted(set(self.effects) - _tool_names(agent))
        if unknown:
            raise UsageError(f"effects declared for tools the agent does not have: {', '.join(unknown)}")
        return DurableStream(self, agent, input, run_id, context, max_turns, run_config, streamed=streamed)

    def run_versions(self, agent: Agent[Any]) -> dict[str, Any]:
        """The versions runs of ``agent`` are started under (``agent_version``, or the agent
        definition's fingerprint): a run started under others is a ``VersionMismatch``."""
        defined = agent_fingerprint(agent, self.effects)
        if self.compensations:  # only then: a definition without any keeps the fingerprint it had
            defined = fingerprint([defined, sorted(self.compensations)])
        return {"openai_agents": self.agent_version or defined}

    def resumable(self, agent: Agent[Any], *, context: Any = None, context_factory: Callable[[], Any] | None = None,
                  max_turns: int = DEFAULT_MAX_TURNS, run_config: RunConfig | None = None) -> RunnerResumable:
        """What a worker resumes this runner's runs of ``agent`` with (``cuaderno worker --agent
        module:attr``): each resume runs with ``context`` (or ``context_factory()``, made for each
        drive and entered if it is an async context manager); the input comes from the journal."""
        return RunnerResumable(self, agent, context=context, context_factory=context_factory, max_turns=max_turns,
                               run_config=run_config)

    def _open(self, agent: Agent[Any], input: str | list[Any], run_id: str) -> Opened:
        task_json = jsonable(input)
        # A list of input items is kept as JSON on the start: a worker resuming the run knows
        # only its id, and the task string alone cannot tell a list from a text that looks like one.
        start: dict[str, Any] = {"framework": "openai-agents"} | ({} if isinstance(input, str) else {"input": task_json})
        return open_run(self.store, run_id, task=input if isinstance(input, str) else json.dumps(task_json),
                        task_fingerprint=fingerprint({"input": task_json}), versions=self.run_versions(agent),
                        tenant=self.tenant, owner=self.owner, name=agent.name, start=start,
                        on_version_mismatch=self.on_version_mismatch)


class DurableStream:
    """One :meth:`DurableRunner.run_streamed` call: :meth:`stream_events` drives the run and
    yields the SDK's stream events; :attr:`result` is how it left the run (set when the events
    end). Stopping early (leaving the loop, a cancellation) leaves the run open and released:
    the next run with its run id goes on from its journal."""

    def __init__(self, runner: DurableRunner, agent: Agent[Any], input: str | list[Any], run_id: str, context: Any,
                 max_turns: int, run_config: RunConfig | None, *, streamed: bool = True) -> None:
        self.run_id = run_id
        self.result: DurableResult | None = None
        self._runner, self._agent, self._input, self._context = runner, agent, input, context
        self._max_turns, self._run_config = max_turns, run_config
        self._streamed = streamed
        self._started = False

    async def stream_events(self) -> AsyncIterator[StreamEvent]:
        """The run's events (see the class docstring); once only.

        Raises:
            UsageError: called a second time.
        """
        if self._started:
            raise UsageError(f"run {self.run_id!r}: stream_events() was already called on this stream")
        self._started = True
        runner, agent = self._runner, self._agent
        with reopened(runner.store, self.run_id):
            opened = runner._open(agent, self._input, self.run_id)
        if opened.closed:
            self.result = _answered(opened, agent)
            return
        shared = RunShared(log=opened.log, run_id=self.run_id, tenant=runner.tenant, retry=runner.retry,
                           prices=runner.prices, store=runner.store, rate_limit=runner.rate_limit,
                           budget=runner.budget, compensations=runner.compensations)
        try:
            if opened.checkpoint.cancel_requested is not None:
                close_cancelled(opened)  # asked while nobody held it: closed now, nothing more runs
            async for event in self._drive(opened, shared):
                yield event
        finally:
            try:
                opened.release()
            except JournalError:  # fenced out or gone: the next holder takes it over regardless
                pass

    async def _drive(self, opened: Opened, shared: RunShared) -> AsyncIterator[StreamEvent]:
        config = self._run_config or RunConfig()
        provider = config.model_provider if config.model_provider is not None else MultiProvider()
        changes: dict[str, Any] = {
            "model_provider": DurableModelProvider(provider, shared),
            "input_guardrails": [journaled_input_guardrail(g, shared) for g in config.input_guardrails or []],
            "output_guardrails": [journaled_output_guardrail(g, shared) for g in config.output_guardrails or []]}
        if isinstance(config.model, Model):
            changes["model"] = DurableModel(config.model, shared)
        config = dataclasses.replace(config, **changes)
        wrapped = _wrap_agent(self._agent, shared, self._runner.effects, {})
        step: Any = list(self._input) if isinstance(self._input, list) else self._input
        kwargs = {"context": self._context, "max_turns": self._max_turns, "run_config": config}
        try:
            while True:
                result: RunResult | RunResultStreaming
                if self._streamed:
                    result = Runner.run_streamed(wrapped, step, **kwargs)
                    async for event in result.stream_events():
                        yield event
                else:
                    result = await Runner.run(wrapped, step, **kwargs)
                if not result.interruptions:
                    final = result.final_output
                    faults.point("final.K0")
                    opened.finish(final if isinstance(final, str) else json.dumps(jsonable(final)),
                                  structured=jsonable(final), agent=result.last_agent.name)
                    faults.point("final.K7")
                    self.result = DurableResult(opened.run_id, "completed", final, result=result)
                    return
                state = result.to_state()
                pending = _ask(opened, shared, state, result.interruptions)
                if pending:
                    self.result = DurableResult(opened.run_id, "suspended", pending=pending, result=result)
                    return
                step = state
        except BaseException as exc:
            if _cause(exc, RunCancelled) is not None:
                # The journal refused a step's intent: the cancellation committed. Close the run
                # with its record (what happened, what is uncertain, what cleanup is scheduled).
                close_cancelled(opened)
            try:
                _end(opened, exc)
            except JournalError:  # the run could not be ended (fenced out, cancelled): the error raised says why
                pass
            for kind in (UncertainEffect, BudgetExceeded):
                cause = _cause(exc, kind)
                if cause is not None and cause is not exc:
                    raise cause from exc  # the SDK wraps a tool's exception in UserError: say what it is
            raise


def _tool_names(agent: Agent[Any], seen: set[int] | None = None) -> set[str]:
    seen = seen if seen is not None else set()
    if id(agent) in seen:
        return set()
    seen.add(id(agent))
    names = {t.name for t in agent.tools}
    for h in agent.handoffs:
        if isinstance(h, Agent):
            names |= _tool_names(h, seen)
    return names


def _wrap_agent(agent: Agent[Any], shared: RunShared, effects: Mapping[str, ToolEffect],
                done: dict[int, Agent[Any]]) -> Agent[Any]:
    """A clone of ``agent`` with its model and function tools wrapped, handoffs too (as DBOS's
    runner does: a ``Model`` instance on the agent bypasses the run's model provider)."""
    if id(agent) in done:
        return done[id(agent)]
    tools: list[Tool] = [wrap_tool(t, effects.get(t.name, ToolEffect()), shared) if isinstance(t, FunctionTool) else t
                         for t in agent.tools]
    clone = agent.clone(tools=tools,
                        input_guardrails=[journaled_input_guardrail(g, shared) for g in agent.input_guardrails],
                        output_guardrails=[journaled_output_guardrail(g, shared) for g in agent.output_guardrails])
    done[id(agent)] = clone
    if isinstance(agent.model, Model) and not isinstance(agent.model, DurableModel):
        clone.model = DurableModel(agent.model, shared)
    handoffs: list[Agent[Any] | Handoff[Any, Any]] = []
    for h in agent.handoffs:
        if isinstance(h, Agent):
            handoffs.append(_wrap_agent(h, shared, effects, done))
        else:
            handoffs.append(_wrap_handoff(h, shared, effects, done))
    clone.handoffs = handoffs
    return clone


def _wrap_handoff(handoff: Handoff[Any, Any], shared: RunShared, effects: Mapping[str, ToolEffect],
                  done: dict[int, Agent[Any]]) -> Handoff[Any, Any]:
    original = handoff.on_invoke_handoff

    async def invoke(*args: Any, **kwargs: Any) -> Agent[Any]:
        return _wrap_agent(await original(*args, **kwargs), shared, effects, done)

    return dataclasses.replace(handoff, on_invoke_handoff=invoke)


def _ask(opened: Opened, shared: RunShared, state: Any, interruptions: list[ToolApprovalItem]) -> dict[str, dict[str, Any]]:
    """Turn the SDK's interruptions into cuaderno approvals, or apply their decisions.

    A call with no request on disk gets one (bound to the fingerprint of its exact arguments);
    a decided one is approved or rejected on the SDK's state; the undecided are returned."""
    log = opened.log
    pending: dict[str, dict[str, Any]] = {}
    for item in interruptions:
        raw = item.raw_item
        call_id = str(_field(raw, "call_id") or _field(raw, "id") or "")
        name = item.tool_name or str(_field(raw, "name") or "")
        args = arguments_of(str(_field(raw, "arguments") or ""))
        args_fp = call_fingerprint(name, args)
        step_id = tool_step_id(shared.turn, call_id)
        approval = Approval(log, step_id, name, args, args_fp)
        # A request journaled for other arguments at this step is an ApprovalMismatch (raised).
        approval.request("needs_approval (openai-agents)")
        decided = approval.decided()
        if decided is None:
            pending[approval.step_id] = {"tool": name, "arguments": args, "fingerprint": args_fp, "tool_step": step_id}
        elif decided.approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=decided.reason or "rejected by a person")
    faults.point("approval.K0")
    log.commit()
    faults.point("approval.K7")
    return pending


def _field(raw: Any, name: str) -> Any:
    return raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` or the first of its causes that is a ``kind`` (the SDK wraps a tool's exception
    in ``UserError``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _end(opened: Opened, exc: BaseException) -> None:
    """Leave the run as the failure says (module docstring); never hide ``exc``."""
    if not isinstance(exc, Exception) or _cause(exc, UncertainEffect) is not None \
            or _cause(exc, JournalError) is not None:
        return  # cancelled, uncertain (journaled: needs_human), or the journal itself: leave it open
    over = _cause(exc, BudgetExceeded)
    if isinstance(over, BudgetExceeded):  # as cuaderno's runner ends it
        opened.fail("budget", **ended_fields(over))
        return
    bug = _cause(exc, BodyBug)
    if isinstance(bug, BodyBug):
        opened.log.commit()  # the bug's result is staged: journal it, then end the run
        opened.fail(f"tool raised {type(bug.cause).__name__}: {bug.cause}"[:500])
        return
    if _cause(exc, GatewayError) is not None:
        # Journaled by the model-call protocol (error.N); left open as the runner leaves it: the
        # next run sends the step again with its key.
        return
    opened.fail(f"{type(exc).__name__}: {exc}"[:500])


def _answered(opened: Opened, agent: Agent[Any]) -> DurableResult:
    """A run that had ended: its final output from the journal (nothing runs)."""
    cp = opened.checkpoint
    outcome = cp.outcome or {}
    if cp.status != "completed":  # failed: its reason is in the journal (cuaderno show)
        raise RunClosed(opened.run_id, cp.status)
    value = outcome.get("structured", outcome.get("output"))
    output_type = agent.output_type
    if isinstance(output_type, AgentOutputSchemaBase):
        value = output_type.validate_json(json.dumps(value))
    elif output_type is not None and output_type is not str and value is not None:
        value = TypeAdapter(output_type).validate_python(value)
    return DurableResult(opened.run_id, "completed", value)
