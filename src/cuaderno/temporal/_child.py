"""Child episodes under Temporal: the parent is a workflow, each child pass a child workflow.

The same code as in one process (:mod:`cuaderno.episodes.episode`): the parent's walk
(``Episode.run`` with its journal, budgets and decisions) runs inside :class:`EpisodeWorkflow`
with a :class:`TemporalChildRunner`; each pass runs :func:`~cuaderno.episodes.episode.run_child_pass`
over :meth:`~cuaderno.episodes.Episode.child_agent` inside :class:`EpisodeChildWorkflow`, whose
model turns and reads are the ordinary ``cuaderno.model_turn``/``cuaderno.tool_call`` activities
(:mod:`cuaderno.temporal._activities`). Nothing of the episode is written twice::

    worker = build_episode_worker(client, episode, task_queue="dev", snapshot="/srv/snapshot",
                                  decide=check_on_a_copy, apply=apply_patch, lookup=find_applied_patch,
                                  gateway_factory=make_gateway, journal_url="sqlite:///var/lib/agents/j.db")
    await client.execute_workflow(EpisodeWorkflow.run, EpisodeInput(episode="fix", task="..."),
                                  id="dev-42", task_queue="dev")

Ids: the parent's run id is its workflow id; pass ``n``'s child workflow id is the child run id
the local runner uses, ``f"{parent_run_id}/{name}.pass{n:02d}"`` (parent run id + step id). A
parent whose worker died is replayed by the next worker: the child workflow's completion is in
the parent's history, so the finished child's proposal is read back, never run again. A child
workflow started again under the same id (a parent started anew) replays from cuaderno's journal
(the model activity finds each journaled response by its key: 0 calls paid again).

Where the user's code runs (never in workflow code):

- ``decide`` in ``cuaderno.episode_decide`` (the ``code`` profile: a check on a copy, re-run if
  its worker dies before its answer is in the history);
- ``apply`` in ``cuaderno.episode_apply``: it writes the apply step's intent to cuaderno's
  journal before the effect and its receipt after it; a re-executed activity that finds an
  intent without a receipt asks ``lookup`` (a receipt: returned, not applied again; ``None``:
  applied again with the same effect key; no lookup or a lookup that fails: the parent stops
  ``needs_human``), exactly as a resumed local parent does. That activity also copies the
  parent's steps so far into cuaderno's journal, and ``cuaderno.episode_record`` copies the rest
  when the episode ends, so ``cuaderno show`` reads the parent there.

Names (workflows, activities) and input shapes are stable forever, like those of
:mod:`cuaderno.temporal._names`: ``tests/temporal/histories/episodes/`` replays recorded histories.
One worker runs one episode (its child agent's activities carry the usual names).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Final

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, ChildWorkflowError
from temporalio.worker import Worker

from cuaderno import faults
from cuaderno.durable.effect import Effect
from cuaderno.durable.log import JournalLog
from cuaderno.episodes.episode import (
    ChildOutcome,
    ChildPass,
    Decision,
    Episode,
    EpisodeResult,
    run_child_pass,
)
from cuaderno.errors import CuadernoError, ErrorClass, RunCancelled, RunClosed, ToolError, UncertainEffect, UsageError
from cuaderno.events import StepEvent
from cuaderno.events.payloads import ToolResult, view
from cuaderno.gateway.base import ModelGateway
from cuaderno.journal import open_journal
from cuaderno.journal.base import Checkpointer
from cuaderno.journal.memory import MemoryCheckpointer
from cuaderno.loop.agent import RetryPolicy as LoopRetry
from cuaderno.loop.agent import Session
from cuaderno.temporal._activities import CuadernoActivities, _heartbeating
from cuaderno.temporal._names import (
    APPLY,
    DECIDE,
    EPISODE_CHILD,
    EPISODE_LOAD,
    EPISODE_RECORD,
    EPISODE_WORKFLOW,
    RECORD,
    EventRow,
    RecordInput,
    event_row,
    row_event,
)
from cuaderno.temporal._profiles import CODE, EffectPolicy, load_effect_policy
from cuaderno.temporal._seams import ActivityModelCaller, ActivityTools, WorkflowOwnership, WorkflowRuntime
from cuaderno.temporal._workflow import _NoGateway, cancel_requested, gave_up
from cuaderno.tools.sandbox import ReadOnlyRoot

__all__ = ["APPLY", "DECIDE", "EPISODE_CHILD", "EPISODE_LOAD", "EPISODE_RECORD", "EPISODE_WORKFLOW", "EPISODES", "ApplyInput",
           "ChildInput", "DecideInput", "EpisodeActivities", "EpisodeChildWorkflow", "EpisodeInput",
           "EpisodeRecordInput", "EpisodeWorkflow", "TemporalChildRunner", "build_episode_worker", "register_episode"]

APPLY_TIMEOUT: Final = timedelta(seconds=120)
APPLY_ATTEMPTS: Final = 3
"""A re-executed apply activity reconciles through the journal and ``lookup`` before it applies
again (never a silent second effect), so the server may retry it after its worker died."""


@dataclass
class EpisodeInput:
    """The parent workflow's input; its workflow id is the parent's run id."""

    episode: str
    task: str
    tenant: str = "default"


@dataclass
class ChildInput:
    """One child pass (:class:`~cuaderno.episodes.episode.ChildPass`); its workflow id is the child's run id."""

    episode: str
    parent_run_id: str
    step_id: str
    number: int
    task: str
    rejected_left: int
    tenant: str = "default"


@dataclass
class DecideInput:
    episode: str
    run_id: str
    step_id: str
    proposal: dict[str, Any]


@dataclass
class ApplyInput:
    """The apply effect of ``step_id`` (``<name>.passNN.apply``) with its effect key, and the
    parent's steps so far (copied into cuaderno's journal before the intent)."""

    episode: str
    run_id: str
    step_id: str
    proposal: dict[str, Any]
    effect_key: str
    events: list[EventRow] = field(default_factory=list[EventRow])
    tenant: str = "default"


@dataclass
class EpisodeRecordInput:
    episode: str
    run_id: str
    events: list[EventRow]


@dataclass(frozen=True, slots=True)
class _Registered:
    episode: Episode[Any]
    policy: EffectPolicy
    root: ReadOnlyRoot
    """The worker's snapshot: its tools' declarations in the workflow; their bodies run only in
    the tool activity."""
    can_apply: bool


EPISODES: dict[str, _Registered] = {}
"""The episodes this worker process runs, by name (filled by :func:`register_episode`)."""


def register_episode(episode: Episode[Any], snapshot: str | os.PathLike[str], *, can_apply: bool = True,
                     effect_policy: str | os.PathLike[str] | None = None) -> None:
    """Make ``episode`` runnable by :class:`EpisodeWorkflow` in this process, without activities
    (what a :class:`~temporalio.worker.Replayer` needs); :func:`build_episode_worker` calls it."""
    root = ReadOnlyRoot(snapshot)  # held open for the worker's life: a rename later moves nothing
    agent = episode.child_agent(root, episode.budgets.rejected_responses)
    EPISODES[episode.name] = _Registered(episode, load_effect_policy(agent, effect_policy), root, can_apply)


def _registered(name: str) -> _Registered:
    known = EPISODES.get(name)
    if known is None:
        raise ApplicationError(str(UsageError(f"this worker has no episode {name!r}; it runs {sorted(EPISODES)}")),
                               type="UsageError", non_retryable=True)
    return known


def _events(store: Checkpointer, run_id: str) -> list[EventRow]:
    if store.checkpoint(run_id) is None:
        return []
    return [event_row(e) for e in store.load(run_id)]


# -- the workflows --------------------------------------------------------------------------------


class TemporalChildRunner:
    """Each child pass is a child workflow (:class:`EpisodeChildWorkflow`) whose id is the child's
    run id; its result (the :class:`ChildOutcome`) is in the parent's history."""

    def __init__(self, episode: str, tenant: str, record: Callable[[], Awaitable[None]] | None = None) -> None:
        self.episode, self.tenant, self.record = episode, tenant, record

    async def run(self, episode: Episode[Any], child: ChildPass) -> ChildOutcome:
        if self.record is not None:
            # The parent's steps so far (the previous pass's decision, whose feedback is in this
            # pass's task) reach cuaderno's journal before the pass starts: a parent started anew
            # reads them back instead of deciding again.
            await self.record()
        inp = ChildInput(episode=self.episode, parent_run_id=child.parent_run_id, step_id=child.step_id,
                         number=child.number, task=child.task, rejected_left=child.rejected_left, tenant=self.tenant)
        try:
            data = await workflow.execute_child_workflow(EPISODE_CHILD, inp, id=child.run_id, result_type=dict)
        except ChildWorkflowError as exc:
            if isinstance(exc.cause, CancelledError) and workflow.cancellation_reason() is not None:
                raise asyncio.CancelledError() from None
            raise
        if workflow.cancellation_reason() is not None:
            # The parent was cancelled while it waited: Temporal asked the child to stop and
            # waited for it (the child closed its run with the cancellation record). That is the
            # parent's cancellation, not a child cancelled alone (which ends the episode
            # ``child_cancelled``, as locally).
            raise asyncio.CancelledError()
        return ChildOutcome.from_json(data)

    def cancel(self, child_run_id: str, reason: str, *, by: str) -> None:
        """Nothing to do: Temporal cancels a child workflow with its parent."""


@workflow.defn(name=EPISODE_CHILD, sandboxed=False)
class EpisodeChildWorkflow:
    """One child pass: the episode's child agent on the ordinary activities (the in-workflow
    journal is rebuilt by replay; cuaderno's journal is written by the activities)."""

    @workflow.run
    async def run(self, inp: ChildInput) -> dict[str, Any]:
        known = _registered(inp.episode)
        run_id = workflow.info().workflow_id
        agent = known.episode.child_agent(known.root, inp.rejected_left)
        store = MemoryCheckpointer()
        runtime = WorkflowRuntime()
        tools = ActivityTools(agent.name, agent.tools, known.policy, inp.tenant)
        session = Session(run_id, _NoGateway(), store, tenant=inp.tenant, runtime=runtime,
                          ownership=WorkflowOwnership(), owner=runtime.owner(), tools=tools,
                          model_caller=ActivityModelCaller(agent.name, inp.tenant, known.policy, {}, tools))
        child = ChildPass(parent_run_id=inp.parent_run_id, step_id=inp.step_id, run_id=run_id, number=inp.number,
                          task=inp.task, rejected_left=inp.rejected_left)
        while True:
            try:
                outcome = await run_child_pass(agent, child, session)
                break
            except asyncio.CancelledError:
                # Cancelled (with its parent): the pass, run again, closes its run with the local
                # cancellation record.
                if not cancel_requested(store, run_id):
                    raise
            except CuadernoError as exc:
                raise gave_up(exc) from None
        faults.point("temporal.episode.C1")  # the child has its answer; its workflow has not completed
        events = [e for e in _events(store, run_id)
                  if e["kind"] in ("final", "cancel") or (e["kind"] == "run" and e["phase"] != "start")]
        if events:  # the answer or the end record, which only the workflow journaled
            await workflow.execute_activity(RECORD, RecordInput(agent=agent.name, run_id=run_id, events=events),
                                            start_to_close_timeout=CODE.timeout,
                                            retry_policy=RetryPolicy(maximum_attempts=CODE.attempts))
        return outcome.to_json()


def _activity_failure(exc: ActivityError) -> BaseException:
    """An apply or decide activity's failure as the episode's code expects it."""
    cause = exc.cause
    if isinstance(cause, CancelledError):  # the parent was cancelled: its walk closes it as locally
        return asyncio.CancelledError()
    if isinstance(cause, ApplicationError):
        detail = cause.details[0] if cause.details else None
        if cause.type == "ToolError" and isinstance(detail, dict):
            return ToolError(str(detail.get("message")), error_class=ErrorClass(detail["error_class"]),
                             sent=detail.get("sent"), data=detail.get("data") or {})
        if cause.type == "UsageError":
            return UsageError(cause.message)
    # Lost (its worker died on every attempt), or nobody can tell whether it happened: the
    # episode records the apply as uncertain and the parent stops needs_human.
    return RuntimeError(f"episode activity failed: {cause or exc}")


@workflow.defn(name=EPISODE_WORKFLOW, sandboxed=False)
class EpisodeWorkflow:
    """The parent of a child episode: ``Episode.run`` in the workflow, its passes as child workflows."""

    def __init__(self) -> None:
        self.store = MemoryCheckpointer()
        self.run_id = ""

    @workflow.run
    async def run(self, inp: EpisodeInput) -> dict[str, Any]:
        known = _registered(inp.episode)
        episode = known.episode
        self.run_id = workflow.info().workflow_id
        runtime = WorkflowRuntime()
        session = Session(self.run_id, _NoGateway(), self.store, tenant=inp.tenant, runtime=runtime,
                          ownership=WorkflowOwnership(), owner=runtime.owner())
        # What cuaderno's journal already holds of this run (a parent started again under its id
        # after it ended or was terminated): its passes, decisions and apply are read back, not
        # done again.
        loaded = await workflow.execute_activity(EPISODE_LOAD, EpisodeRecordInput(episode=inp.episode,
                                                                                  run_id=self.run_id, events=[]),
                                                 result_type=list, start_to_close_timeout=CODE.timeout,
                                                 retry_policy=RetryPolicy(maximum_attempts=CODE.attempts))
        if loaded:
            self.store.append([row_event(self.run_id, e) for e in loaded])
        runner = TemporalChildRunner(inp.episode, inp.tenant, record=lambda: self._record(inp))
        options: dict[str, Any] = {"heartbeat_timeout": known.policy.heartbeat}

        async def decide(proposal: Any) -> Decision:
            step_id = next(e.step_id for e in reversed(self.store.load(self.run_id))
                           if e.kind == "episode" and e.phase == "result")  # the pass being decided
            try:
                got = await workflow.execute_activity(
                    DECIDE, DecideInput(episode=inp.episode, run_id=self.run_id, step_id=step_id,
                                        proposal=proposal.model_dump(mode="json")),
                    result_type=dict, start_to_close_timeout=CODE.timeout,
                    retry_policy=RetryPolicy(maximum_attempts=CODE.attempts), **options)
            except ActivityError as exc:
                failure = _activity_failure(exc)
                if isinstance(failure, RuntimeError):
                    # decide raised on every attempt: as locally, the episode stops with that
                    # error (the workflow fails; a task failure would be retried forever).
                    raise ApplicationError(f"decide failed: {exc.cause or exc}", type="DecideFailed",
                                           non_retryable=True) from None
                raise failure from None
            return Decision(got["action"], str(got.get("reason", "")))

        async def apply(proposal: Any, key: str) -> Any:
            step_id = next(e.step_id for e in reversed(self.store.load(self.run_id))
                           if e.kind == "tool" and e.name == "apply")  # the intent just journaled
            try:
                return await workflow.execute_activity(
                    APPLY, ApplyInput(episode=inp.episode, run_id=self.run_id, step_id=step_id,
                                      proposal=proposal.model_dump(mode="json"), effect_key=key,
                                      events=_events(self.store, self.run_id), tenant=inp.tenant),
                    start_to_close_timeout=APPLY_TIMEOUT, retry_policy=RetryPolicy(maximum_attempts=APPLY_ATTEMPTS),
                    **options)
            except ActivityError as exc:
                raise _activity_failure(exc) from None

        while True:
            try:
                # The apply activity is its own lookup: it returns the receipt cuaderno's journal
                # or the receiver holds, or applies (once) what provably did not happen.
                result = await episode.run(inp.task, session=session, decide=decide,
                                           apply=apply if known.can_apply else None,
                                           lookup=apply if known.can_apply else None, runner=runner)
            except asyncio.CancelledError:
                # Temporal cancelled the parent: the walk, opened again, closes the run with the
                # local record.
                if not cancel_requested(self.store, self.run_id):
                    raise
                continue
            except (RunCancelled, RunClosed):
                await self._record(inp)
                cp = self.store.checkpoint(self.run_id)
                return {"status": "cancelled", "record": (cp.outcome if cp is not None else None) or {}}
            except UncertainEffect as exc:
                await self._record(inp)
                return {"status": "needs_human", "reason": str(exc), "step_id": exc.step_id}
            except CuadernoError as exc:
                raise gave_up(exc) from None
            await self._record(inp)
            return _summary(result)

    async def _record(self, inp: EpisodeInput) -> None:
        await workflow.execute_activity(EPISODE_RECORD, EpisodeRecordInput(episode=inp.episode, run_id=self.run_id,
                                                                           events=_events(self.store, self.run_id)),
                                        start_to_close_timeout=CODE.timeout,
                                        retry_policy=RetryPolicy(maximum_attempts=CODE.attempts))


def _summary(result: EpisodeResult[Any]) -> dict[str, Any]:
    return {"status": result.status, "reason": result.reason,
            "proposal": result.proposal.model_dump(mode="json") if result.proposal is not None else None,
            "receipt": result.receipt, "turns": result.turns, "rejected": result.rejected,
            "cost_usd": result.cost_usd, "unpriced_calls": result.unpriced_calls,
            "possibly_billed_twice": result.possibly_billed_twice,
            "passes": [dataclasses.asdict(p) for p in result.passes]}


# -- the activities -------------------------------------------------------------------------------


async def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """The user's callback, off the event loop (a check that runs a test would starve the
    heartbeats)."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    value = await asyncio.to_thread(fn, *args)
    return await value if inspect.isawaitable(value) else value


class EpisodeActivities:
    """``decide``, ``apply`` (with ``lookup``) and the parent's record, writing ``journal_url``."""

    def __init__(self, episode: Episode[Any], journal: str | Checkpointer, decide: Callable[..., Any],
                 apply: Callable[..., Any] | None, lookup: Callable[..., Any] | None) -> None:
        self.episode = episode
        self.decide_fn, self.apply_fn, self.lookup_fn = decide, apply, lookup
        # One journal per worker: the child agent's activities pass theirs (a second SQLite
        # connection of the same process opened on a killed worker's -wal cannot write).
        self.store: Checkpointer = journal if isinstance(journal, Checkpointer) else open_journal(journal)

    def activities(self) -> list[Callable[..., Any]]:
        return [self.decide, self.apply, self.record, self.load]

    def _check(self, name: str) -> None:
        if name != self.episode.name:
            raise ApplicationError(f"this worker runs episode {self.episode.name!r}, not {name!r}",
                                   type="UsageError", non_retryable=True)

    def _journal(self, run_id: str) -> dict[tuple[str, str], StepEvent]:
        if self.store.checkpoint(run_id) is None:
            return {}
        return {(e.step_id, e.phase): e for e in self.store.load(run_id)}

    def _copy(self, run_id: str, events: list[EventRow]) -> int:
        journal = self._journal(run_id)
        new = [row_event(run_id, e) for e in events if (e["step_id"], e["phase"]) not in journal]
        if new:
            self.store.append(new)
        return len(new)

    @activity.defn(name=DECIDE)
    async def decide(self, inp: DecideInput) -> dict[str, Any]:
        self._check(inp.episode)
        proposal = self.episode.output.model_validate(inp.proposal)
        async with _heartbeating():
            decision = await _call(self.decide_fn, proposal)
        if not isinstance(decision, Decision):
            raise ApplicationError(f"decide must return a Decision (Decision.apply/discard/another_pass), got "
                                   f"{decision!r:.80}; nothing was journaled", type="UsageError", non_retryable=True)
        faults.point("temporal.episode.decide.A1")  # decided, the answer not in the history yet
        return {"action": decision.action, "reason": decision.reason}

    @activity.defn(name=APPLY)
    async def apply(self, inp: ApplyInput) -> Any:
        """The apply effect, at most once per journaled intent (see the module's docstring)."""
        self._check(inp.episode)
        if self.apply_fn is None:
            raise ApplicationError("this worker's episode has no apply callback", type="UsageError",
                                   non_retryable=True)
        # The parent's steps before this one; the workflow's own record of this step (its intent,
        # journaled before it scheduled this activity) is not an earlier attempt's intent.
        self._copy(inp.run_id, [e for e in inp.events if e["step_id"] != inp.step_id])
        journal = self._journal(inp.run_id)
        step_id, key = inp.step_id, inp.effect_key
        done = journal.get((step_id, "result"))
        if done is not None:
            result = view(done, ToolResult)
            if result.get("outcome") == "error":
                err = result["error"]
                raise ApplicationError(str(err.get("message")), err, type="ToolError", non_retryable=True)
            return result.get("value")  # applied: never twice
        proposal = self.episode.output.model_validate(inp.proposal)

        apply_fn = self.apply_fn

        async def body(attempt: int) -> Any:
            faults.point("temporal.episode.apply.A1")  # the intent is on disk, the effect has not run
            try:
                async with _heartbeating():
                    receipt = await _call(apply_fn, proposal, key)
            except ToolError:
                raise
            except Exception as exc:
                # Not classified: it may have written half. The protocol asks the lookup (or stops
                # uncertain), as Temporal's retry of this activity used to make the next attempt do.
                raise ToolError(f"apply raised {exc!r:.300}", error_class=ErrorClass.AMBIGUOUS) from exc
            faults.point("temporal.episode.apply.A2")  # the effect happened, its receipt is not journaled yet
            return receipt

        async def lookup(attempt: int) -> Any:
            assert self.lookup_fn is not None
            async with _heartbeating():
                return await _call(self.lookup_fn, proposal, key)

        # The effect protocol, on cuaderno's journal: an earlier attempt that wrote its intent and
        # died (or timed out) before its receipt is settled by the receiver, as after a local crash.
        log = JournalLog(self.store, inp.run_id, index=journal)
        effect = Effect(log=log, step_id=step_id, tool="apply", arguments=inp.proposal, fingerprint=None, key=key,
                        body=body, lookup=lookup if self.lookup_fn is not None else None, retry=LoopRetry(),
                        sleep=asyncio.sleep, tells_the_model=False)
        try:
            settled = await effect.run()
        except UncertainEffect as exc:  # journaled, with its evidence, before it was raised
            raise ApplicationError(str(exc), type="UncertainEffect", non_retryable=True) from None
        log.commit()
        if settled.error is not None:  # refused: known not to have happened
            raise ApplicationError(str(settled.error.get("message")), settled.error, type="ToolError",
                                   non_retryable=True)
        return settled.value

    @activity.defn(name=EPISODE_LOAD)
    async def load(self, inp: EpisodeRecordInput) -> list[EventRow]:
        """The parent's steps cuaderno's journal holds (none for a new run)."""
        self._check(inp.episode)
        return _events(self.store, inp.run_id)

    @activity.defn(name=EPISODE_RECORD)
    async def record(self, inp: EpisodeRecordInput) -> int:
        """Copy the parent's steps into cuaderno's journal, once each. Returns how many were new."""
        self._check(inp.episode)
        return self._copy(inp.run_id, inp.events)


def build_episode_worker(client: Client, episode: Episode[Any], *, task_queue: str,
                         snapshot: str | os.PathLike[str], decide: Callable[..., Any],
                         gateway_factory: Callable[[], ModelGateway], journal_url: str,
                         apply: Callable[..., Any] | None = None, lookup: Callable[..., Any] | None = None,
                         effect_policy: str | os.PathLike[str] | None = None, **worker_options: Any) -> Worker:
    """A worker running ``episode``: its parent and child workflows, the child agent's activities
    over ``snapshot`` (read-only), and ``decide``/``apply``/``lookup`` as activities. The
    arguments mean what they mean in :meth:`Episode.run <cuaderno.episodes.Episode.run>`."""
    if not callable(decide) or (apply is not None and not callable(apply)) or (
            lookup is not None and not callable(lookup)):
        raise UsageError("decide, apply and lookup must be callables")
    register_episode(episode, snapshot, can_apply=apply is not None, effect_policy=effect_policy)
    known = EPISODES[episode.name]
    # The activities' agent has the episode's whole rejection cap; each child workflow's agent has
    # what is left of it. Only the workflow's loop counts rejections: the activities build requests
    # (instructions, tools, model: the same in both) and check the versions their own turn 0 wrote.
    agent = episode.child_agent(known.root, episode.budgets.rejected_responses)
    child = CuadernoActivities(agent, gateway_factory, journal_url)
    parent = EpisodeActivities(episode, child.store, decide, apply, lookup)
    return Worker(client, task_queue=task_queue, workflows=[EpisodeWorkflow, EpisodeChildWorkflow],
                  activities=[*child.activities(), *parent.activities()], **worker_options)
