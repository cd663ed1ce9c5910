"""The activities: where model calls and tool bodies really run, and where cuaderno's journal
is written.

The durable journal is the one at ``journal_url`` (:func:`cuaderno.journal.open_journal`):
SQLite when every worker shares one host, Postgres when they do not. The run id in it is the
workflow id. Each activity writes, under the loop's own step ids:

- ``cuaderno.model_turn``: on turn 0 the run's ``start``; the model ``intent`` (before the send,
  with the references the request is re-derived from), then the ``result`` (the response) —
  so a re-executed activity (its worker killed after the send) finds the response and returns
  it without paying again; before the result, the provider's idempotency key (same key) is the
  second line.
- ``cuaderno.tool_call``: the tool ``intent`` before the body, the ``result`` after it. A
  re-executed activity that finds the result returns it without running the body again.
  Results larger than :data:`INLINE_BYTES` go back to the workflow as a reference (step id,
  sha256, size): the history holds each large tool output zero times; the model activity
  resolves the reference from the journal when it rebuilds the request.

A run's durable journal may hold the intent of a send that was never answered (its worker died
before the provider replied): the next send of the same step carries the same key and finds
that intent, which is not written twice.
- ``cuaderno.tool_lookup``: reads only the receiver (the tool's lookup).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Final

from temporalio import activity
from temporalio.exceptions import ApplicationError

from cuaderno import faults
from cuaderno.durable.effect import intent_event, result_payload, stage_result
from cuaderno.durable.log import JournalLog
from cuaderno.durable.model_call import ModelCall, Sent
from cuaderno.errors import GatewayError, ReplayDivergence, ToolError, UsageError, VersionMismatch
from cuaderno.events import StepEvent
from cuaderno.events.payloads import (
    ModelIntent,
    ModelResult,
    PayloadMalformed,
    Response,
    RunStart,
    ToolResult,
    check,
    view,
)
from cuaderno.fingerprint import fingerprint
from cuaderno.flow.ratelimit import RateGate, rate_gate
from cuaderno.gateway.base import Message, ModelGateway, ModelRequest, assistant_message
from cuaderno.journal import open_journal, parse_journal_url
from cuaderno.journal.base import Checkpointer
from cuaderno.loop.agent import Agent
from cuaderno.loop.executor import AgentTools, TracedTools
from cuaderno.loop.model_calls import TracedGateway
from cuaderno.plainjson import sorted_compact_nan
from cuaderno.temporal._names import (
    JOURNAL_MARK,
    LOOKUP,
    MODEL_TURN,
    RECORD,
    REPLAY_RUN,
    TASK_REF,
    TOOL_CALL,
    WORKER_SHUTDOWN,
    EarlierSteps,
    JournalMark,
    ModelTurnInput,
    RecordInput,
    Replayed,
    ReplayedModel,
    ReplayedTool,
    ReplayInput,
    RunInput,
    ToolCallInput,
    row_event,
)
from cuaderno.tools.definition import ToolContext

__all__ = ["INLINE_BYTES", "JOURNALS", "REF", "CuadernoActivities", "journal_kind", "read_to_mark", "replayed"]

INLINE_BYTES: Final = 512
"""Tool results up to this size (canonical JSON) travel in the history; larger ones by reference."""
REF: Final = "$cuaderno_ref"

log = logging.getLogger("cuaderno.temporal")

TOOL_STEP: Final = re.compile(r"(t\d{4,})\.tool(\d{2,})")

JOURNALS: dict[str, str] = {}
"""The journal URL of each agent this worker process runs (filled when its activities are built):
where a run continued-as-new reads its earlier steps, up to its mark."""


@asynccontextmanager
async def _heartbeating() -> AsyncIterator[None]:
    """Heartbeat from the activity's first line to its last (the journal reads and writes before
    the send included), so the server notices a dead worker after the policy's heartbeat timeout
    rather than after the whole start-to-close timeout, and a live worker still opening its
    journal or its gateway is not taken for a dead one (a re-send's activity once timed out 1.00 s
    after it started, its first heartbeat due only at the provider call).

    A worker shutting down under the activity (a deploy) fails it as :data:`WORKER_SHUTDOWN`:
    the workflow sends it again as a send lost with its worker, not as a failed send."""
    info = activity.info()
    every = (info.heartbeat_timeout.total_seconds() / 3) if info.heartbeat_timeout else None

    async def beat() -> None:
        while every:
            activity.heartbeat()
            await asyncio.sleep(every)

    if every:
        activity.heartbeat()  # at once: the first heartbeat leaves with the first await
    task = asyncio.create_task(beat())
    try:
        yield
    except asyncio.CancelledError:
        if activity.is_worker_shutdown():
            raise ApplicationError("the worker shut down during the activity", type=WORKER_SHUTDOWN,
                                   non_retryable=True) from None
        raise
    finally:
        task.cancel()


async def _started_task() -> str | None:
    """The task of the workflow run this activity belongs to, from its start event (the first
    model turn sends :data:`TASK_REF` instead of a second copy of the text in the history)."""
    info = activity.info()
    if info.workflow_id is None:
        return None
    client = activity.client()
    handle = client.get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id)
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if not payloads:
            return None
        [run] = await client.data_converter.decode(payloads[:1], [RunInput])
        return run.task if isinstance(run, RunInput) else None
    return None


def _failure(kind: str, err: GatewayError | ToolError) -> ApplicationError:
    # Classified failures are decisions of cuaderno's own retry layer (in the workflow), never
    # retried by the infrastructure: non-retryable.
    return ApplicationError(str(err), err.to_json(), type=kind, non_retryable=True)


CACHED_RUNS: Final = 64
"""Runs whose journal index a worker keeps (least recently used dropped first)."""


@dataclass(slots=True)
class _Cached:
    """A run's journal index as of its row ``seq`` (whose hash is ``row_hash``)."""

    index: dict[tuple[str, str], StepEvent]
    seq: int
    row_hash: str


class CuadernoActivities:
    """The activities of one agent, writing the journal at ``journal_url``."""

    def __init__(self, agent: Agent, gateway_factory: Callable[[], ModelGateway], journal_url: str) -> None:
        self.agent = agent
        self.gateway_factory = gateway_factory
        self.journal_url = journal_url
        self.where = journal_kind(journal_url)  # refused here, at worker start
        self.store: Checkpointer = open_journal(journal_url)  # refused here too, at worker start
        JOURNALS[agent.name] = journal_url
        log.info("cuaderno.temporal worker for agent %r: journal %s", agent.name, self.where)
        self._gateway: ModelGateway | None = None
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self.tools = TracedTools(AgentTools(agent.tools))

    def activities(self) -> list[Callable[..., Any]]:
        return [self.model_turn, self.tool_call, self.tool_lookup, self.replay_run, self.record, self.journal_mark]

    def _check(self, name: str) -> None:
        if name != self.agent.name:
            raise ApplicationError(f"this worker runs agent {self.agent.name!r}, not {name!r}",
                                   type="UsageError", non_retryable=True)

    def _events(self, run_id: str) -> dict[tuple[str, str], StepEvent]:
        """The run's journal by (step, phase): from this worker's cache while the journal's last
        row is still the one this worker last read or wrote (checked against the summary, one
        row), else loaded whole. Without the cache every activity loaded the whole run: a
        1000-turn run's last activities read ~3000 rows each."""
        cp = self.store.checkpoint(run_id)
        if cp is None:
            self._cache.pop(run_id, None)
            return {}
        hit = self._cache.get(run_id)
        if hit is None or (hit.seq, hit.row_hash) != (cp.last_seq, cp.last_hash):
            events = self.store.load(run_id)
            hit = _Cached({(e.step_id, e.phase): e for e in events}, events[-1].seq if events else 0,
                          events[-1].row_hash if events else "")
            self._cache[run_id] = hit
            while len(self._cache) > CACHED_RUNS:
                self._cache.popitem(last=False)
        self._cache.move_to_end(run_id)
        return dict(hit.index)  # the caller's copy: it adds what it writes to it

    def _append(self, run_id: str, events: list[StepEvent]) -> list[StepEvent]:
        """Append, and keep the cache when the rows written directly follow the ones cached
        (anything else, such as another worker's rows in between, drops it). Returns the events
        as stored (stamped)."""
        stored = self.store.append(events)
        hit = self._cache.get(run_id)
        if hit is None:
            return stored
        if stored and all(ev.seq == hit.seq + 1 + i for i, ev in enumerate(stored)):
            hit.index.update(((ev.step_id, ev.phase), ev) for ev in stored)
            hit.seq, hit.row_hash = stored[-1].seq, stored[-1].row_hash
        else:
            self._cache.pop(run_id, None)
        return stored

    def _log(self, run_id: str, journal: dict[tuple[str, str], StepEvent]) -> JournalLog:
        """The run's journal as the step protocols write it: every commit one append through
        :meth:`_append` (the cache kept in step), ``journal`` updated with what is written. No
        epoch: an activity is its workflow's only writer of the run."""
        return JournalLog(self.store, run_id, epoch=None, index=journal,
                          append=lambda events: self._append(run_id, events))

    # -- model ------------------------------------------------------------------------------------

    @activity.defn(name=MODEL_TURN)
    async def model_turn(self, inp: ModelTurnInput) -> dict[str, Any]:
        async with _heartbeating():
            return await self._model_turn(inp)

    async def _model_turn(self, inp: ModelTurnInput) -> dict[str, Any]:
        self._check(inp.agent)
        run_id, step_id = inp.run_id, inp.step_id
        journal = self._events(run_id)
        done = journal.get((step_id, "result"))
        if done is not None and view(done, ModelResult).get("key") == inp.idempotency_key:
            return slim_response(_response(done))  # journaled: a re-executed activity pays nothing
        start = journal.get(("run", "start"))
        if start is not None:
            recorded = view(start, RunStart).get("versions")
            if recorded != self.agent.versions():
                # Checked before anything is written: a worker whose agent differs from the one
                # that started the run (tools, instructions, policy) refuses it, journal untouched.
                raise ApplicationError(str(VersionMismatch(run_id, dict(recorded or {}), self.agent.versions())),
                                       type="VersionMismatch", non_retryable=True)
        steps = self._log(run_id, journal)
        if not journal:
            task = next((m.get("content") for m in inp.new_messages if isinstance(m, dict) and m.get("role") == "user"),
                        None)
            if task is None and TASK_REF in inp.new_messages:
                task = await _started_task()
            if not isinstance(task, str):
                raise ApplicationError("the first model turn of a run must carry its task", type="UsageError",
                                       non_retryable=True)
            begins: RunStart = {"task": task, "versions": self.agent.versions(), "tenant": inp.tenant,
                                "engine": "temporal"}
            begun = StepEvent(run_id=run_id, step_id="run", phase="start", kind="run", name=self.agent.name,
                              fingerprint=fingerprint({"task": task}), payload=dict(begins))
            steps.stage(begun)
            steps.commit()  # in ``journal`` now: the request's task message is read from it
        call = ModelCall(steps, step_id, key=inp.idempotency_key, turn=inp.turn, fingerprint=None)
        if self._gateway is None:
            self._gateway = self.gateway_factory()
        gate = self._rate_gate(run_id, step_id, journal, inp)
        if gate is not None:
            # The provider's shared limit: the turn is taken before this send's intent, as the
            # loop's ModelCall takes it (a first send may be refused for waiting past max_wait,
            # nothing written; a re-send's intent may already be there: it waits unbounded).
            await gate.admit(bounded=call.log.get(step_id, "intent") is None)
        try:
            return await self._model_send(inp, run_id, step_id, journal, call, gate)
        except BaseException:
            if gate is not None:
                gate.unsent()  # a probe's turn lost before its send ends its hold at once
            raise

    async def _model_send(self, inp: ModelTurnInput, run_id: str, step_id: str,
                          journal: dict[tuple[str, str], StepEvent], call: ModelCall,
                          gate: RateGate | None) -> dict[str, Any]:
        """The rest of :meth:`_model_turn` once the gate's turn is taken: the intent, the send, the result."""
        assert self._gateway is not None, "set by _model_turn"
        sends = self._journal_send(inp, call, journal)
        messages = self._conversation(run_id, step_id, journal)
        if len(messages) != inp.n_messages:
            raise ApplicationError(str(ReplayDivergence(run_id, step_id, f"{len(messages)} messages in the journal",
                                                        f"{inp.n_messages} in the workflow")),
                                   type="ReplayDivergence", non_retryable=True)
        if gate is not None:
            # The turn may have been overtaken while the intent was committed (a pause another
            # worker learned of): held here, after the intent, before the send, as the loop holds
            # it. Not bounded by max_wait: the intent is written, as for a re-send, and the
            # activity heartbeats while it waits.
            await gate.ready(bounded=False)
        a = self.agent
        request = ModelRequest(instructions=a.instructions, messages=tuple(messages), tools=a.tool_schemas,
                               model=a.model, require_tool=a.require_tool, max_output_tokens=a.max_output_tokens,
                               temperature=a.temperature)
        try:
            with gate.sending() if gate is not None else nullcontext():
                response = await TracedGateway(self._gateway).call(request, run_id=run_id, step_id=step_id,
                                                                   idempotency_key=inp.idempotency_key)
        except GatewayError as err:
            raise _failure("GatewayError", err) from None
        if gate is not None:
            gate.answered(response)
        faults.point("temporal.model.A1")  # billed, not journaled: the re-send carries the same key
        # The same verdict and counters the loop journals for the same response (empty
        # generations counted); the step's retries (failed sends the workflow tried again) come
        # with the input.
        payload = call.finish(Sent(response, sends, inp.retries), require_tool=a.require_tool)
        call.log.commit()
        faults.point("temporal.model.A2")  # journaled, not returned: the re-executed activity pays nothing
        journaled = payload["response"]
        assert journaled is not None, "a result staged from a response holds it"
        return slim_response(journaled)

    def _rate_gate(self, run_id: str, step_id: str, journal: dict[tuple[str, str], StepEvent],
                   inp: ModelTurnInput) -> RateGate | None:
        """The gate of the gateway's shared rate limit, if it declares one. Its token estimate is
        the request's conversation; before this step's intent is written, the conversation before
        the step plus the step's literal new messages (a reference to a journaled response or
        result is not counted then: the answer's usage sets the count right)."""
        if getattr(self._gateway, "rate_limit", None) is None:
            return None
        a = self.agent
        messages = self._conversation(run_id, step_id, journal)  # this step's part only once its intent is in
        if (step_id, "intent") not in journal:
            messages += [dict(m) for m in inp.new_messages if isinstance(m, dict) and "ref" not in m]
        estimate = ModelRequest(instructions=a.instructions, messages=tuple(messages), tools=a.tool_schemas,
                                model=a.model, max_output_tokens=a.max_output_tokens)
        return rate_gate(self.store, self._gateway, estimate)

    def _journal_send(self, inp: ModelTurnInput, call: ModelCall, journal: dict[tuple[str, str], StepEvent]) -> int:
        """Journal this send's intent, as the loop journals it locally; return the step's sends.

        The first send writes ``intent`` (with the references the request is re-derived from). A
        re-send after a send of unknown fate writes ``intent.N`` (counted as possibly billed
        twice). After sends lost with their worker (``inp.lost``), the journal says which of them
        may have reached the provider: each wrote its intent before sending, so this send is a
        re-send only if some intent of the step is there; a lost send that wrote none never
        left its worker and is not counted.
        """
        written = sum(1 for (s, phase) in journal if s == call.step_id and phase.split(".")[0] == "intent")
        if call.log.get(call.step_id, "intent") is None:
            call.intend(1, extra={"new": inp.new_messages, "n_messages": inp.n_messages})
            call.log.commit()
            if inp.lost or inp.send == 1:
                return 1
        elif inp.lost:
            self._resend(call, written + 1, "crash")
            return written + 1
        if inp.send > 1:
            self._resend(call, inp.send, "ambiguous")
        return inp.send

    @staticmethod
    def _resend(call: ModelCall, send: int, after: str) -> None:
        """Journal the intent of re-send ``send`` unless it is there (``after``: why the earlier
        send's fate is unknown, ``crash`` for a worker lost during it)."""
        if call.log.get(call.step_id, f"intent.{send}") is not None:
            return
        call.intend(send, after=after)
        call.log.commit()

    def _conversation(self, run_id: str, upto: str, journal: dict[tuple[str, str], StepEvent]) -> list[Message]:
        """The request's messages, rebuilt from the intents' new messages and the journaled
        responses and tool results (references resolved)."""
        out: list[Message] = []
        steps = sorted({s for (s, phase), ev in journal.items() if ev.kind == "model" and phase == "intent"
                        and s <= upto})
        for step in steps:
            for m in view(journal[(step, "intent")], ModelIntent).get("new") or ():
                if isinstance(m, str):  # a bare step id: the journaled response, or tool result
                    out.append(self._by_step(m, journal))
                elif m == TASK_REF:  # the task, written once: the run's start row
                    out.append({"role": "user", "content": view(journal[("run", "start")], RunStart).get("task")})
                elif m.get("role") == "assistant" and "ref" in m:
                    out.append(assistant_message(_response(journal[(str(m["ref"]), "result")])))
                elif m.get("role") == "tool":
                    out.append(self._resolved(dict(m), journal))
                else:
                    out.append(dict(m))
        return out

    @staticmethod
    def _by_step(step: str, journal: dict[tuple[str, str], StepEvent]) -> Message:
        """The message a bare step id stands for: ``tNNNN.model``, that response's assistant
        message; ``tNNNN.toolKK``, the ok result of call KK of ``tNNNN.model`` (its id and name
        from that response, as the loop builds the message: the workflow sends the bare id only
        when they match)."""
        if step.endswith(".model"):
            return assistant_message(_response(journal[(step, "result")]))
        found = TOOL_STEP.fullmatch(step)
        if found is None:
            raise ApplicationError(f"{step!r} names no model or tool step", type="UsageError", non_retryable=True)
        call = _response(journal[(f"{found[1]}.model", "result")])["tool_calls"][int(found[2])]
        value = view(journal[(step, "result")], ToolResult)["value"]
        return {"role": "tool", "tool_call_id": call["id"], "name": call["name"],
                "content": sorted_compact_nan(value), "is_error": False}

    @staticmethod
    def _resolved(message: Message, journal: dict[tuple[str, str], StepEvent]) -> Message:
        if "ref" in message:  # the whole result, journaled by the tool activity
            value = view(journal[(str(message["ref"]), "result")], ToolResult)["value"]
            return {"role": "tool", "tool_call_id": message.get("tool_call_id"), "name": message.get("name"),
                    "content": sorted_compact_nan(value), "is_error": False}
        content = message.get("content")
        if not isinstance(content, str) or REF not in content:
            return message
        try:
            ref = json.loads(content)
        except ValueError:
            return message
        if not isinstance(ref, dict) or set(ref) != {REF, "sha256", "bytes"}:
            return message
        value = view(journal[(str(ref[REF]), "result")], ToolResult)["value"]
        return {**message, "content": sorted_compact_nan(value)}

    # -- tools ------------------------------------------------------------------------------------

    def _context(self, inp: ToolCallInput) -> ToolContext:
        return ToolContext(run_id=inp.run_id, step_id=inp.step_id, tool=inp.tool, effect_key=inp.effect_key,
                           attempt=inp.attempt, tenant=inp.tenant, data=dict(inp.data), call_id=inp.call_id)

    @activity.defn(name=TOOL_CALL)
    async def tool_call(self, inp: ToolCallInput) -> Any:
        async with _heartbeating():
            return await self._tool_call(inp)

    async def _tool_call(self, inp: ToolCallInput) -> Any:
        self._check(inp.agent)
        if self.tools.info(inp.tool) is None:
            raise ApplicationError(f"agent {self.agent.name!r} has no tool {inp.tool!r}", type="UsageError",
                                   non_retryable=True)
        journal = self._events(inp.run_id)
        done = journal.get((inp.step_id, "result"))
        result = view(done, ToolResult) if done is not None else None
        if result is not None and result.get("effect_key") == inp.effect_key:
            if result["outcome"] == "error":
                raise ApplicationError(str(result["error"].get("message")), result["error"],
                                       type="ToolError", non_retryable=True)
            return returned(inp.step_id, result["value"])  # ran: never twice
        if not journal:
            raise ApplicationError(f"run {inp.run_id!r} has no journal at {self.journal_url!r}: a tool step "
                                   "comes after a model turn", type="UsageError", non_retryable=True)
        steps = self._log(inp.run_id, journal)
        intent = intent_event(steps, inp.step_id, inp.tool, inp.attempt,
                              {"effect_key": inp.effect_key, "arguments": inp.arguments})
        if steps.get(inp.step_id, intent.phase) is None:
            steps.stage(intent)
            steps.commit()
        try:
            self.tools.check(inp.tool, inp.arguments)
            value = await self.tools.invoke(inp.tool, inp.arguments, self._context(inp))
        except ToolError as err:
            # A classified failure is the step's outcome: journaled, so a run continued-as-new
            # gets it back instead of running the body again. Its payload has never carried the
            # repair the model is then asked for (tells_the_model=False: no counters).
            stage_result(steps, inp.step_id, inp.tool, result_payload("error", error=err.to_json(),
                                                                     effect_key=inp.effect_key,
                                                                     tells_the_model=False))
            steps.commit()
            raise _failure("ToolError", err) from None
        faults.point("temporal.tool.A1")  # the effect happened, nothing journaled: the loop reconciles
        stage_result(steps, inp.step_id, inp.tool, result_payload("ok", value, effect_key=inp.effect_key))
        steps.commit()
        faults.point("temporal.tool.A2")  # journaled, not returned
        return returned(inp.step_id, value)

    @activity.defn(name=LOOKUP)
    async def tool_lookup(self, inp: ToolCallInput) -> Any:
        self._check(inp.agent)
        info = self.tools.info(inp.tool)
        if info is None or not info.has_lookup:
            raise ApplicationError(f"tool {inp.tool!r} has no lookup", type="UsageError", non_retryable=True)
        try:
            return await self.tools.lookup(inp.tool, inp.arguments, self._context(inp))
        except ToolError as err:
            raise _failure("ToolError", err) from None


    @activity.defn(name=REPLAY_RUN)
    async def replay_run(self, inp: ReplayInput) -> Replayed:
        """Every journaled model response and tool outcome of the run, as the workflow received
        them (large tool values as references). Asked only by runs continued before journal
        marks existed (kept forever: their histories schedule it); a run continued now reads
        the journal up to its mark instead (:func:`read_to_mark`), so that result, which grows
        with the run, is not in its history."""
        self._check(inp.agent)
        return replayed(self.store.load(inp.run_id) if self.store.checkpoint(inp.run_id) is not None else [])

    @activity.defn(name=JOURNAL_MARK)
    async def journal_mark(self, inp: ReplayInput) -> JournalMark | None:
        """The run's last row in this journal (``{"seq", "hash"}``, ``None`` if it has none): what a
        continue-as-new carries, a few dozen bytes whatever the run's length.

        The rows up to it are read here, in the activity, and what the continued run needs of them
        is kept in this process (:func:`read_to_mark` takes it from there): the continued run's
        workflow task, usually on this worker, then reads no journal at all."""
        self._check(inp.agent)
        if self.store.checkpoint(inp.run_id) is None:
            return None
        events = self.store.load(inp.run_id)
        mark: JournalMark = {"seq": events[-1].seq, "hash": events[-1].row_hash}
        _keep(self.journal_url, inp.run_id, mark, _to_mark(events))
        return mark

    @activity.defn(name=RECORD)
    async def record(self, inp: RecordInput) -> int:
        """Append the workflow's own events (decisions, the final answer, an end record) to the
        journal, once: an event already there is not written again. Returns how many were new.

        They come in over Temporal's data converter, so each payload is held to its type first
        (:func:`~cuaderno.events.payloads.check`): a malformed one fails the activity, typed and
        not retried, with nothing written."""
        self._check(inp.agent)
        journal = self._events(inp.run_id)
        new = [row_event(inp.run_id, e) for e in inp.events if (e["step_id"], e["phase"]) not in journal]
        try:
            for ev in new:
                check(ev)
        except PayloadMalformed as exc:
            raise ApplicationError(str(exc), type="PayloadMalformed", non_retryable=True) from None
        if new:
            self._append(inp.run_id, new)
        return len(new)


def returned(step_id: str, value: Any) -> Any:
    """A tool value as the workflow receives it: inline up to :data:`INLINE_BYTES`, else a reference."""
    text = sorted_compact_nan(value)
    if len(text.encode()) <= INLINE_BYTES:
        return value
    # 16 hex digits of the sha256: the reference names a journaled row, the digest only lets a
    # reader check it is that row's value (it is not a security boundary), and it is sent twice
    # per step (the tool's result, the next model input).
    return {REF: step_id, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16], "bytes": len(text.encode())}


def replayed(events: list[StepEvent]) -> Replayed:
    """The journaled model responses and tool outcomes, by step id, exactly as the activities
    returned them to the workflow: what a continued run replays its earlier steps from."""
    model: dict[str, ReplayedModel] = {}
    tools: dict[str, ReplayedTool] = {}
    for ev in events:
        if ev.phase != "result":
            continue
        if ev.kind == "model":
            answer = view(ev, ModelResult)
            model[ev.step_id] = {"key": answer.get("key"), "response": answer.get("response")}
        elif ev.kind == "tool":
            result = view(ev, ToolResult)
            out: ReplayedTool = {"effect_key": result.get("effect_key"), "outcome": result.get("outcome")}
            if result.get("outcome") == "error":
                out["error"] = result["error"]  # an error outcome always journals its error
            else:
                out["value"] = returned(ev.step_id, result.get("value"))
            tools[ev.step_id] = out
    return {"model": model, "tools": tools}


def read_to_mark(agent: str, run_id: str, mark: JournalMark) -> EarlierSteps:
    """What :func:`replayed` gives for the run's rows up to ``mark``, and the run's task (its
    ``run start`` row), read in workflow code.

    Deterministic, so allowed in a workflow: rows up to the mark were committed before the
    earlier run continued-as-new, and the journal is append-only and hash-chained, so every
    replay of this run reads the same rows; the mark's hash is checked against the row at its
    seq (a journal restored from an older copy, or another journal, is refused). Rows after
    the mark (this run's own steps) are ignored: they come from this run's activity results.

    Usually no read at all: the ``journal_mark`` activity that ended the earlier run read those
    rows on this worker and kept the result (:func:`_kept`). Only a continued run whose first
    workflow task lands on another worker, or is replayed after the worker restarted, reads the
    journal here, in workflow code, on a handle of its own (workflow code runs on another thread
    than the activities): a blocking read of ~0.1 s per 1,000 earlier turns (SQLite 0.78 s,
    PostgreSQL 0.88-1.13 s at 10,000 turns, 5 KB tool outputs), under the 2 s deadlock
    detector. It stays out of the history on purpose: as an activity result the same data is
    ~400 B per earlier turn, over Temporal's 2 MB payload limit past ~5,000 turns, and in every
    continued run's history (``docs/guide/temporal.md``).
    """
    url = JOURNALS.get(agent)
    if url is None:
        raise ApplicationError(f"this worker has no journal for agent {agent!r}: build it with build_worker or "
                               "cuaderno_activities", type="UsageError", non_retryable=True)
    kept = _kept(url, run_id, mark)
    if kept is not None:
        return kept
    store = open_journal(url, create=False, readonly=True)
    try:
        events = store.load(run_id) if store.checkpoint(run_id) is not None else []
    finally:
        store.close()
    seq, want = int(mark["seq"]), str(mark["hash"])
    upto = [e for e in events if e.seq <= seq]
    if not upto or upto[-1].seq != seq or upto[-1].row_hash != want:
        found = f"row {upto[-1].seq} hash {upto[-1].row_hash[:12]}" if upto else "no rows"
        raise ApplicationError(f"run {run_id!r}: the journal at {url!r} does not hold the row the earlier run "
                               f"ended at (seq {seq}, hash {want[:12]}); it has {found}. Another journal, or an "
                               "older copy of this one: refused", type="JournalRolledBack", non_retryable=True)
    return _to_mark(upto)


def _to_mark(upto: list[StepEvent]) -> EarlierSteps:
    """What a continued run needs of the rows up to its mark: :func:`replayed`, and the task."""
    start = next((e for e in upto if e.step_id == "run" and e.phase == "start"), None)
    return {**replayed(upto), "task": None if start is None else view(start, RunStart).get("task")}


MARKS_KEPT: Final = 8
"""Continued runs whose earlier steps a worker keeps in memory for their first workflow task."""
_MARKS: OrderedDict[tuple[str, str, int, str], EarlierSteps] = OrderedDict()
_MARKS_LOCK = threading.Lock()  # the activities' thread writes, workflow threads read


def _keep(url: str, run_id: str, mark: JournalMark, value: EarlierSteps) -> None:
    with _MARKS_LOCK:
        _MARKS[(url, run_id, int(mark["seq"]), str(mark["hash"]))] = value
        while len(_MARKS) > MARKS_KEPT:
            _MARKS.popitem(last=False)


def _kept(url: str, run_id: str, mark: JournalMark) -> EarlierSteps | None:
    """What :func:`read_to_mark` would read, if the ``journal_mark`` activity of this worker read
    the same rows (same journal, run, seq and row hash: the hash chain makes them the same rows)."""
    with _MARKS_LOCK:
        found = _MARKS.get((url, run_id, int(mark["seq"]), str(mark["hash"])))
    return None if found is None else {**found, "model": dict(found["model"]), "tools": dict(found["tools"])}


def journal_kind(url: str) -> str:
    """Which store a worker's activities journal to, said in words (logged at worker start).

    Refuses a journal no other process can read (``memory://``, ``sqlite:///:memory:``): the
    activities of one run land on any worker, a continued run reads the journal from workflow
    code on another handle, and a killed worker would take the journal with it.
    """
    target = parse_journal_url(url)
    if target.scheme == "memory" or (target.scheme == "sqlite" and target.path == ":memory:"):
        raise UsageError(f"journal {target.url!r} lives in one process's memory: a worker under Temporal needs a "
                         "journal every worker reaches (a SQLite file on a host they share, or PostgreSQL)")
    if target.scheme == "sqlite":
        return (f"SQLite file {target.path!r} (every worker of this task queue must run on this host and "
                "open this same file)")
    return f"PostgreSQL {target.url} (shared by workers on any host)"


def _response(result: StepEvent) -> Response:
    """A journaled model result's response, as JSON (the gateway's helpers take it so).

    Raises:
        ApplicationError: the result holds none (a classified failure journaled as evidence): no
            conversation can be built on it.
    """
    response = view(result, ModelResult)["response"]
    if response is None:
        raise ApplicationError(f"step {result.step_id!r} has no journaled response", type="JournalCorrupt",
                               non_retryable=True)
    return response


def slim_response(data: Mapping[str, Any]) -> dict[str, Any]:
    """A response's JSON without what :meth:`ModelResponse.from_json` takes as default (null and
    empty fields, zero token counts): the same response to the workflow, ~150 bytes less in
    every model activity's result. ``cost`` absent is ``None``: unpriced, as before."""
    out = {k: v for k, v in data.items() if v is not None and v != "" and v != [] and v != {}}
    usage = {k: v for k, v in (data.get("usage") or {}).items() if v}
    if usage:
        out["usage"] = usage
    else:
        out.pop("usage", None)
    return out
