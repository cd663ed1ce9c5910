"""What a workflow plugs into :class:`~cuaderno.loop.agent.Session`: runtime, ownership, model
caller and tool executor. Everything here runs inside workflow code: deterministic, no I/O.

- :class:`WorkflowRuntime`: ``workflow.now()``, ``workflow.random()`` (the same numbers on every
  replay), a workflow timer as ``sleep``, the workflow id as the owner.
- :class:`WorkflowOwnership`: the workflow is the single owner; no OS locks, no per-process
  holds (replay may run the workflow on any worker thread).
- :class:`ActivityModelCaller`: each send is one ``cuaderno.model_turn`` activity, given
  references and what is new since the last request.
- :class:`ActivityTools`: ``invoke`` and ``lookup`` are ``cuaderno.tool_call`` and
  ``cuaderno.tool_lookup`` activities; ``info``, ``check``, ``compensation`` read the agent's
  declarations in the workflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError, TimeoutType

from cuaderno.errors import ErrorClass, GatewayError, ToolError, UsageError
from cuaderno.gateway.base import ModelRequest, ModelResponse, assistant_message
from cuaderno.journal.base import Checkpointer
from cuaderno.loop.executor import AgentTools
from cuaderno.loop.holds import Loop, Where
from cuaderno.loop.runtime import Runtime
from cuaderno.plainjson import JSONObject, sorted_compact, sorted_compact_nan
from cuaderno.temporal._names import (
    LOOKUP,
    MODEL_TURN,
    TASK_REF,
    TOOL_CALL,
    WORKER_SHUTDOWN,
    ModelTurnInput,
    ReplayedModel,
    ReplayedTool,
    ToolCallInput,
    slim_input,
)
from cuaderno.temporal._profiles import CODE, MODEL, EffectPolicy, Profile
from cuaderno.tools.definition import ToolContext

__all__ = ["ActivityModelCaller", "ActivityTools", "WorkflowOwnership", "WorkflowRuntime"]


class WorkflowRuntime(Runtime):
    """The workflow's clock, random source, timer and name."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.random = workflow.random()

    def now(self) -> float:
        return workflow.now().timestamp()

    def monotonic(self) -> float:
        return workflow.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # a durable workflow timer

    def block(self, seconds: float) -> None:
        raise UsageError("a workflow cannot block: use cuaderno.temporal's signal or update instead of cancel()")

    def owner(self) -> str:
        return f"temporal:{workflow.info().workflow_id}"

    def process(self) -> int:
        return 0

    def thread(self) -> int:
        return 0


class WorkflowOwnership:
    """The workflow is the single owner of its run: the in-workflow journal's epoch, no holds."""

    def key(self, store: Checkpointer, run_id: str) -> Where:
        return ("temporal", run_id)

    def start(self, where: Where, loop: Loop, *, force: bool) -> None:
        pass

    def acquire(self, store: Checkpointer, run_id: str, owner: str, *, force: bool, open_only: bool = False) -> int:
        return store.acquire(run_id, owner, force=force, open_only=open_only)

    def took(self, where: Where, loop: Loop) -> None:
        pass

    def pause(self, where: Where, loop: Loop) -> None:
        pass

    def resume(self, where: Where, loop: Loop) -> bool:
        return True

    def stop(self, where: Where, loop: Loop) -> None:
        pass

    def release(self, store: Checkpointer, run_id: str, epoch: int) -> None:
        store.release(run_id, epoch)

    def busy_here(self, where: Where) -> bool:
        return False


REFUSALS = frozenset({"VersionMismatch", "ReplayDivergence", "UsageError"})
"""Activity failures that refuse the run rather than fail a send: they fail the workflow."""


def _options(profile: Profile, policy: EffectPolicy) -> dict[str, Any]:
    return {"start_to_close_timeout": profile.timeout, "heartbeat_timeout": policy.heartbeat,
            "retry_policy": RetryPolicy(maximum_attempts=profile.attempts)}


def _lost(exc: ActivityError) -> bool:
    """The activity may have run and its answer is lost (timed out: a worker died inside it)."""
    return isinstance(exc.cause, TimeoutError) or _worker_lost(exc)


def _worker_lost(exc: ActivityError) -> bool:
    """The activity was lost with its worker, not failed by the provider or the tool: the worker
    stopped heartbeating (killed, or its host gone), no worker started it in time, or the worker
    shut down under it. A start-to-close timeout is not one: the worker was alive and heartbeating
    while the call took longer than its profile allows, the same ambiguous timeout as locally."""
    cause = exc.cause
    if isinstance(cause, TimeoutError):
        return cause.type in (TimeoutType.HEARTBEAT, TimeoutType.SCHEDULE_TO_START)
    return isinstance(cause, ApplicationError) and cause.type == WORKER_SHUTDOWN


def _cancelled(exc: ActivityError) -> None:
    """The activity was cancelled because the workflow was: not a failed step but the workflow's
    cancellation, which the loop handles as such (results so far committed, nothing new started)."""
    if isinstance(exc.cause, CancelledError):
        raise asyncio.CancelledError() from None


def _details(exc: ActivityError, kind: str) -> Mapping[str, Any] | None:
    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.type == kind and cause.details:
        detail = cause.details[0]
        return detail if isinstance(detail, dict) else None
    return None


class ActivityModelCaller:
    """Each model send is one ``cuaderno.model_turn`` activity (the ``model`` profile).

    An activity lost with its worker (:func:`_worker_lost`) is sent again here, with the same
    key, not handed to the loop's retry layer: a worker restart is not the provider's failure and
    is not bounded by ``RetryPolicy.max_resends`` (the local loop does the same after a crash:
    its resume sends again whatever its bound). ``policy.max_worker_losses`` bounds it if set.
    The activity journals each re-send that may double a bill (:attr:`ModelTurnInput.lost`).
    Behind the patch ``cuaderno.worker-loss``: a history recorded before it replays the old way.
    """

    def __init__(self, agent: str, tenant: str, policy: EffectPolicy,
                 replayed: dict[str, ReplayedModel] | None = None, tools: ActivityTools | None = None,
                 task: str | None = None) -> None:
        self.agent, self.tenant, self.policy = agent, tenant, policy
        self.task = task
        """The run's task: its message is sent as :data:`TASK_REF` (the activity reads the task from
        the workflow's start event, then from the journal), not as a second copy of its text."""
        self.replayed: dict[str, ReplayedModel] = replayed or {}
        """Responses journaled by earlier runs of this workflow (continue-as-new), by step id."""
        self.tools = tools
        """Names the tool step whose journaled result a tool message holds (sent as a reference)."""
        self._sent = 0
        """Messages of the conversation the activities already know of (the previous request's)."""
        self._responses: dict[str, str] = {}
        """An accepted response's assistant message (its canonical JSON) -> its model step id."""
        self._failed: dict[str, list[ErrorClass]] = {}
        """A model step id -> the classes of its failed sends so far (retries and re-sends)."""
        self._lost: dict[str, int] = {}
        """A model step id -> its activities lost with their worker so far."""
        self._calls: dict[str, tuple[str, str]] = {}
        """A tool step id -> the (call id, tool name) of the response call it runs."""

    async def call(self, request: ModelRequest, *, run_id: str, step_id: str, idempotency_key: str) -> ModelResponse:
        messages = request.messages
        new: list[dict[str, Any] | str] = []
        for message in messages[self._sent:]:
            role = message.get("role")
            ref = self._responses.get(sorted_compact(message)) if role == "assistant" else None
            if ref is not None:
                new.append(ref)  # the bare step id: the journaled response's assistant message
            elif role == "tool" and self.tools is not None and (step := self.tools.journaled(message)) is not None:
                # The tool activity journaled this result: the model activity reads it from there.
                # The bare step id when its call id and name are those the activity will derive.
                if self._calls.get(step) == (message.get("tool_call_id"), message.get("name")):
                    new.append(step)
                else:
                    new.append({"role": "tool", "tool_call_id": message.get("tool_call_id"),
                                "name": message.get("name"), "ref": step})
            elif (role == "user" and self.task is not None and message.get("content") == self.task
                  and set(message) == {"role", "content"} and workflow.patched("cuaderno.task-ref")):
                new.append(dict(TASK_REF))
                self.task = None  # once: a later user message with the same text is sent as it is
            else:
                new.append(dict(message))
        failed = self._failed.get(step_id, [])
        inp = ModelTurnInput(agent=self.agent, run_id=run_id, step_id=step_id,
                             turn=int(step_id[1:5]), idempotency_key=idempotency_key,
                             new_messages=new, n_messages=len(messages), tenant=self.tenant,
                             send=1 + failed.count(ErrorClass.AMBIGUOUS),
                             retries=sum(1 for c in failed if c is not ErrorClass.AMBIGUOUS))
        known = self.replayed.get(step_id)
        # A journaled failure (no response) is no answer: the activity finds it and fails typed.
        if known is not None and known.get("key") == idempotency_key and known["response"] is not None:
            return self._answered(step_id, len(messages), known["response"])
        while True:
            inp.lost = self._lost.get(step_id, 0)
            try:
                data = await workflow.execute_activity(MODEL_TURN, slim_input(inp), result_type=dict,
                                                       **_options(MODEL, self.policy))
                break
            except ActivityError as exc:
                if self._send_again(step_id, exc):
                    continue
                failure = self._failure(exc)
                self._failed.setdefault(step_id, []).append(failure.error_class)
                raise failure from None
        return self._answered(step_id, len(messages), data)

    def _send_again(self, step_id: str, exc: ActivityError) -> bool:
        """Whether a failed model activity is a send lost with its worker, to be sent again now
        (counted in :attr:`_lost`), rather than a failure for the loop's retry layer."""
        if not _worker_lost(exc):
            return False
        bound = self.policy.max_worker_losses
        if bound is not None and self._lost.get(step_id, 0) >= bound:
            return False
        if not workflow.patched("cuaderno.worker-loss"):
            return False  # recorded before: the loss went to the retry layer (a timer, then a re-send)
        self._lost[step_id] = self._lost.get(step_id, 0) + 1
        return True

    @staticmethod
    def _failure(exc: ActivityError) -> GatewayError:
        """The activity's failure as the loop's retry layer sees it (a refusal fails the workflow)."""
        cause = exc.cause
        _cancelled(exc)
        if isinstance(cause, ApplicationError) and cause.type in REFUSALS:
            # Not a failed send: the worker refused the run (another agent, another journal).
            # The workflow fails with the typed error; nothing was journaled.
            raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from None
        if (err := _details(exc, "GatewayError")) is not None:
            failure = GatewayError(str(err.get("message")), error_class=ErrorClass(err["error_class"]),
                                   sent=bool(err.get("sent")), retry_after=err.get("retry_after"),
                                   status=err.get("status"))
            # Lower-tier calls made before it failed: counted where the loop journals the failure.
            failure.escalations = tuple(err.get("escalations") or ())
            return failure
        # The worker died or the call outlived its timeout: it may have been sent (and billed).
        # cuaderno's retry layer re-sends with the same key; the activity finds a journaled
        # response first and pays nothing.
        return GatewayError(f"model activity failed: {exc.cause or exc}", error_class=ErrorClass.AMBIGUOUS,
                            sent=True)

    def _answered(self, step_id: str, sent: int, data: Mapping[str, Any]) -> ModelResponse:
        """Remember what the activities now know: the messages sent, this response (as the loop
        will write its assistant message) and its tool calls, by the tool step each becomes."""
        response = ModelResponse.from_json(data)  # the result may omit defaults (slim_response)
        self._sent = sent
        self._responses[sorted_compact(assistant_message(response.to_json()))] = step_id
        for index, call in enumerate(response.tool_calls):
            self._calls[f"{step_id.removesuffix('.model')}.tool{index:02d}"] = (call.id, call.name)
        return response


class ActivityTools(AgentTools):
    """The agent's declarations in the workflow; tool bodies and lookups in activities."""

    def __init__(self, agent_name: str, tools: Any, policy: EffectPolicy, tenant: str,
                 replayed: dict[str, ReplayedTool] | None = None) -> None:
        super().__init__(tools)
        self.agent_name, self.policy, self.tenant = agent_name, policy, tenant
        self.replayed: dict[str, ReplayedTool] = replayed or {}
        """Tool outcomes journaled by earlier runs of this workflow (continue-as-new), by step id."""
        self._ran: dict[str, tuple[str, str] | None] = {}
        """The model's call id -> (tool step, canonical result) the tool activity journaled; ``None``
        when two calls of one turn share an id (then the message is sent as it is)."""

    def journaled(self, message: Mapping[str, Any]) -> str | None:
        """The tool step whose journaled result is exactly this tool message's content, or ``None``."""
        ran = self._ran.pop(str(message.get("tool_call_id")), None)
        if ran is None or message.get("is_error") or message.get("content") != ran[1]:
            return None
        return ran[0]

    def _journaled(self, ctx: ToolContext, value: Any) -> Any:
        if ctx.call_id is not None:
            self._ran[ctx.call_id] = None if ctx.call_id in self._ran else (ctx.step_id, sorted_compact_nan(value))
        return value

    def _input(self, name: str, arguments: JSONObject, ctx: ToolContext) -> ToolCallInput:
        return ToolCallInput(agent=self.agent_name, run_id=ctx.run_id, step_id=ctx.step_id, tool=name,
                             arguments=arguments, effect_key=ctx.effect_key, attempt=ctx.attempt,
                             tenant=ctx.tenant, data=dict(ctx.data), call_id=ctx.call_id)

    async def invoke(self, name: str, arguments: JSONObject, ctx: ToolContext) -> Any:
        self.check(name, arguments)
        known = self.replayed.get(ctx.step_id)
        if known is not None and known.get("effect_key") == ctx.effect_key:
            if known.get("outcome") == "error":
                err = known["error"]
                raise ToolError(str(err.get("message")), error_class=ErrorClass(err["error_class"]),
                                sent=err.get("sent"), data=err.get("data") or {})
            return self._journaled(ctx, known.get("value"))
        try:
            return self._journaled(ctx, await workflow.execute_activity(
                TOOL_CALL, slim_input(self._input(name, arguments, ctx)),
                **_options(self.policy.tools[name], self.policy)))
        except ActivityError as exc:
            raise self._tool_error(exc, "tool activity") from None

    async def lookup(self, name: str, arguments: JSONObject, ctx: ToolContext) -> Any:
        try:
            return await workflow.execute_activity(LOOKUP, slim_input(self._input(name, arguments, ctx)),
                                                   **_options(CODE, self.policy))
        except ActivityError as exc:
            raise self._tool_error(exc, "lookup activity") from None

    @staticmethod
    def _tool_error(exc: ActivityError, what: str) -> ToolError:
        cause = exc.cause
        _cancelled(exc)
        if isinstance(cause, ApplicationError) and cause.type in REFUSALS:
            raise ApplicationError(cause.message, type=cause.type, non_retryable=True) from None
        err = _details(exc, "ToolError")
        if err is not None:
            return ToolError(str(err.get("message")), error_class=ErrorClass(err["error_class"]),
                             sent=err.get("sent"), data=err.get("data") or {})
        if _lost(exc):
            # Killed or timed out inside the body: the effect may have happened. The loop
            # reconciles it (lookup, or a re-send of an idempotent tool), exactly as after a crash.
            return ToolError(f"{what} lost: {exc.cause}", error_class=ErrorClass.AMBIGUOUS, sent=True)
        return ToolError(f"{what} failed: {exc.cause or exc}", error_class=ErrorClass.AMBIGUOUS, sent=None)
