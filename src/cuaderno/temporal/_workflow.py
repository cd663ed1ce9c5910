"""``CuadernoWorkflow``: the unchanged runner, driven inside a workflow.

The loop's own bookkeeping lives in a :class:`~cuaderno.journal.memory.MemoryCheckpointer`
inside the workflow. It is never read from outside and needs no durability of its own: every
value it holds came from an activity result (in the history) or from a decision (an update or
signal, in the history), so replay rebuilds it event for event. The durable record is the journal
the activities write (:mod:`cuaderno.temporal._activities`).

The workflow runs without Temporal's sandbox (``sandboxed=False``): cuaderno's loop imports the
journal modules (sqlite3) that the sandbox would re-import per run, and every source of
non-determinism the loop uses goes through the session's seams (:mod:`cuaderno.temporal._seams`).
The only clock the loop still reads directly is ``created_at`` of the in-workflow journal's rows,
which nothing decides on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from cuaderno import harness
from cuaderno.cancellation import request_cancel
from cuaderno.errors import (
    ApprovalError,
    ApprovalMismatch,
    BudgetExceeded,
    CuadernoError,
    NotWaitingForApproval,
    RunCancelled,
    RunClosed,
    UncertainEffect,
    UsageError,
)
from cuaderno.events.payloads import PendingApproval
from cuaderno.journal.base import Checkpointer
from cuaderno.journal.memory import MemoryCheckpointer
from cuaderno.loop.agent import Agent, Session
from cuaderno.loop.agent import RetryPolicy as LoopRetry
from cuaderno.loop.steps import FinalStep
from cuaderno.temporal._activities import read_to_mark
from cuaderno.temporal._names import (
    JOURNAL_MARK,
    RECORD,
    REPLAY_RUN,
    WORKFLOW,
    EarlierSteps,
    GivenDecision,
    JournalMark,
    RecordInput,
    ReplayInput,
    RunInput,
    event_row,
)
from cuaderno.temporal._profiles import CODE, EffectPolicy
from cuaderno.temporal._seams import ActivityModelCaller, ActivityTools, WorkflowOwnership, WorkflowRuntime

__all__ = ["AGENTS", "CuadernoWorkflow", "Decision"]

AGENTS: dict[str, tuple[Agent, EffectPolicy]] = {}
"""The agents this worker process runs, by name, with their tools' profiles (filled by
:func:`cuaderno.temporal.build_worker`)."""


def gave_up(exc: CuadernoError) -> ApplicationError:
    """A typed error a run gives up with (a model call that kept failing, a replay divergence),
    as its workflow fails: with the error's type, not retried. Any other exception would fail
    only the workflow task, retried forever."""
    return ApplicationError(str(exc), type=type(exc).__name__, non_retryable=True)


def cancel_requested(store: Checkpointer, run_id: str) -> bool:
    """Temporal cancelled the workflow: write the same cancellation request a person's ``cancel``
    writes, so the run, opened again, closes with the local record (what completed, what is
    uncertain, which compensations are scheduled). ``False`` when the run has no journal yet:
    there is nothing to close, and the caller lets the cancellation stand."""
    if store.checkpoint(run_id) is None:
        return False
    request_cancel(store, run_id, "the Temporal workflow was cancelled", by="temporal", ownership=WorkflowOwnership())
    return True


class _NoGateway:
    """The workflow's session has no gateway: every send goes through the model activity."""

    async def complete(self, request: Any, *, idempotency_key: str) -> Any:
        raise AssertionError("the workflow sends model requests through the model activity only")


@dataclass
class Decision:
    """A person's decision on a waiting approval (update ``decide`` or signal ``decide``).

    ``step_id`` names the approval as ``cuaderno approve`` does: its tool step (``t0000.tool00``)
    or the approval step itself (``t0000.tool00.approval``), the form ``pending`` lists."""

    step_id: str
    approve: bool
    fingerprint: str | None = None
    approver: str | None = None
    reason: str | None = None


@workflow.defn(name=WORKFLOW, sandboxed=False)
class CuadernoWorkflow:
    """Runs (or continues) one cuaderno run; the run id is the workflow id."""

    def __init__(self) -> None:
        self.store = MemoryCheckpointer()
        self.run_id = ""
        self.decisions: dict[str, GivenDecision] = {}
        self.queued: list[Decision] = []
        self.cancel_reason: str | None = None
        self.cancel_by = "temporal"

    @workflow.run
    async def run(self, inp: RunInput) -> dict[str, Any]:
        known = AGENTS.get(inp.agent)
        if known is None:
            # An ApplicationError fails the workflow (any other exception would retry its task forever).
            raise ApplicationError(str(UsageError(f"this worker has no agent {inp.agent!r}; it runs "
                                                  f"{sorted(AGENTS)}")), type="UsageError", non_retryable=True)
        agent, policy = known
        retry = inp.retry or policy.retry or LoopRetry()
        self.run_id = workflow.info().workflow_id
        self.decisions = dict(inp.decisions)
        runtime = WorkflowRuntime()
        replayed = await self._earlier_steps(inp)
        task = self._task(inp, replayed)
        tools = ActivityTools(agent.name, agent.tools, policy, inp.tenant, replayed["tools"])
        session = Session(self.run_id, _NoGateway(), self.store, tenant=inp.tenant, runtime=runtime, retry=retry,
                          ownership=WorkflowOwnership(), owner=runtime.owner(), tools=tools,
                          model_caller=ActivityModelCaller(agent.name, inp.tenant, policy, replayed["model"], tools,
                                                           task))
        while True:
            try:
                async for step in agent.run(task, session=session):
                    if isinstance(step, FinalStep):
                        await self._record(inp)
                        return {"status": "completed", "output": step.output}
                    if self._history_full(inp):
                        await self._continue(inp, task, retry)
            except asyncio.CancelledError:
                # Temporal cancelled the workflow: the loop, opened again, closes the run.
                if not cancel_requested(self.store, self.run_id):
                    raise
                continue
            except RunCancelled as exc:
                await self._record(inp)
                return {"status": "cancelled", "record": exc.record}
            except (BudgetExceeded, RunClosed) as exc:
                await self._record(inp)
                cp = self.store.checkpoint(self.run_id)
                if cp is not None and cp.status == "cancelled":  # closed while it waited for a person
                    return {"status": "cancelled", "record": cp.outcome or {}}
                return {"status": "failed", "reason": str(exc)}
            except UncertainEffect as exc:
                await self._record(inp)
                return {"status": "needs_human", "reason": str(exc)}
            except CuadernoError as exc:
                # A typed error the loop gives up with fails the workflow (gave_up). The failure
                # the loop journaled (a model step's error with what it spent) goes to the
                # activities' journal first, as the local loop leaves it (behind a patch: older
                # failed histories replay).
                if workflow.patched("cuaderno.record-giveup"):
                    await self._record(inp)
                raise gave_up(exc) from None
            # The run stopped for a person: apply a decision carried over, or wait for one.
            await self._decide_pending()

    def _task(self, inp: RunInput, replayed: EarlierSteps) -> str:
        """The run's task: the input's, or the journal's run start row (a continue-as-new that
        carried the task by reference)."""
        if not inp.task_in_journal:
            return inp.task
        task = replayed.get("task")
        if not isinstance(task, str):
            raise ApplicationError(f"run {self.run_id!r}: the journal's rows up to the mark hold no task",
                                   type="JournalRolledBack", non_retryable=True)
        return task

    async def _continue(self, inp: RunInput, task: str, retry: LoopRetry) -> None:
        """Continue as new with the journal mark, the decisions so far and the run's retry bounds.
        With a mark, the task is the journal's run start row: not carried in every run's history."""
        mark = await self._mark(inp)
        by_ref = mark is not None and workflow.patched("cuaderno.task-ref")
        workflow.continue_as_new(RunInput(agent=inp.agent, task="" if by_ref else task, tenant=inp.tenant,
                                          decisions=self.decisions, max_history_events=inp.max_history_events,
                                          mark=mark, retry=retry, task_in_journal=by_ref))

    async def _record(self, inp: RunInput) -> None:
        """Copy what only the workflow journaled (approvals, the answer, an end or cancellation
        record) into the activities' journal, so ``cuaderno show`` reads the run's outcome there."""
        # Added after histories were recorded without it: a run recorded before replays without
        # the activity (workflow.patched), so no live history breaks.
        if self.store.checkpoint(self.run_id) is None or not workflow.patched("cuaderno.record"):
            return
        events = [event_row(e) for e in self.store.load(self.run_id)
                  if e.kind in ("final", "approval", "cancel") or (e.kind == "run" and e.phase != "start")
                  or (e.kind == "tool" and e.phase == "decision")
                  or (e.kind == "model" and e.phase.startswith("error"))]
        if events:
            await workflow.execute_activity(RECORD, RecordInput(agent=inp.agent, run_id=self.run_id, events=events),
                                            start_to_close_timeout=CODE.timeout,
                                            retry_policy=RetryPolicy(maximum_attempts=CODE.attempts))

    async def _earlier_steps(self, inp: RunInput) -> EarlierSteps:
        """What earlier runs of this workflow journaled (continue-as-new), by step: none on a first run."""
        if inp.mark is not None:
            # The journal up to the row the earlier run ended at (read here, deterministically),
            # not a result in this run's history.
            return read_to_mark(inp.agent, self.run_id, inp.mark)
        if workflow.info().continued_run_id is not None:
            # Continued before marks existed: one activity for everything the earlier runs journaled.
            replayed: EarlierSteps = await workflow.execute_activity(
                REPLAY_RUN, ReplayInput(agent=inp.agent, run_id=self.run_id), result_type=dict,
                start_to_close_timeout=CODE.timeout, retry_policy=RetryPolicy(maximum_attempts=CODE.attempts))
            return replayed
        return {"model": {}, "tools": {}}

    async def _mark(self, inp: RunInput) -> JournalMark | None:
        """The journal's last row of this run, for the next run (``None``: it asks replay_run).
        Behind a patch: a history that continued-as-new without asking it still replays."""
        if not workflow.patched("cuaderno.journal-mark"):
            return None
        mark: JournalMark | None = await workflow.execute_activity(
            JOURNAL_MARK, ReplayInput(agent=inp.agent, run_id=self.run_id), result_type=dict,
            start_to_close_timeout=CODE.timeout, retry_policy=RetryPolicy(maximum_attempts=CODE.attempts))
        return mark

    def _history_full(self, inp: RunInput) -> bool:
        info = workflow.info()
        if inp.max_history_events:
            return info.get_current_history_length() >= inp.max_history_events
        return info.is_continue_as_new_suggested()

    async def _decide_pending(self) -> None:
        while True:
            cp = self.store.checkpoint(self.run_id)
            assert cp is not None
            if cp.status == "cancelled" or not cp.pending:
                return
            for step_id in sorted(cp.pending):
                if step_id in self.decisions:
                    self._apply(step_id, self.decisions[step_id])
                    return
            if self.cancel_reason is not None:
                request_cancel(self.store, self.run_id, self.cancel_reason, by=self.cancel_by,
                               ownership=WorkflowOwnership())
                return
            await workflow.wait_condition(lambda: bool(self.queued) or self.cancel_reason is not None)
            while self.queued:
                d = self.queued.pop(0)
                step_id = self._approval_id(d.step_id)
                if step_id != d.step_id and not workflow.patched("cuaderno.tool-step-decision"):
                    step_id = d.step_id  # recorded when the tool step's id was refused: dropped below
                d = dataclasses.replace(d, step_id=step_id)
                try:
                    self._check_decision(d)
                except ApprovalError:
                    continue  # a signal's stale decision is dropped (an update is refused instead)
                self.decisions[d.step_id] = {"approve": d.approve, "fingerprint": d.fingerprint,
                                             "approver": d.approver, "reason": d.reason}

    def _apply(self, step_id: str, d: GivenDecision) -> None:
        decide = harness.approve if d["approve"] else harness.deny
        decide(self.store, self.run_id, step_id, fingerprint=d.get("fingerprint"), approver=d.get("approver"),
               reason=d.get("reason"))

    def _pending(self) -> dict[str, PendingApproval]:
        cp = self.store.checkpoint(self.run_id) if self.run_id else None
        return cp.pending if cp is not None else {}

    def _approval_id(self, step_id: str) -> str:
        """The waiting approval ``step_id`` names: itself, or the approval of the tool step it names."""
        pending = self._pending()
        if step_id not in pending and f"{step_id}.approval" in pending:
            return f"{step_id}.approval"
        return step_id

    def _check_decision(self, d: Decision) -> None:
        pending = self._pending()
        if d.step_id not in pending:
            raise NotWaitingForApproval(f"run {self.run_id!r} is not waiting for approval {d.step_id!r}")
        want = pending[d.step_id].get("fingerprint")
        if d.fingerprint is not None and d.fingerprint != want:
            raise ApprovalMismatch(f"approval {d.step_id!r}: {harness.fingerprint_mismatch(d.fingerprint, str(want))}")

    @workflow.update(name="decide")
    async def decide(self, d: Decision) -> str:
        """A person's decision: refused by the validator when stale or when nothing waits. Returns
        the approval step decided (the approval's own id, whichever form named it)."""
        d = dataclasses.replace(d, step_id=self._approval_id(d.step_id))
        self.queued.append(d)
        return d.step_id

    @decide.validator
    def _validate(self, d: Decision) -> None:
        self._check_decision(dataclasses.replace(d, step_id=self._approval_id(d.step_id)))

    @workflow.signal(name="decide")
    async def decide_signal(self, d: Decision) -> None:
        self.queued.append(d)

    @workflow.signal(name="cancel")
    async def cancel(self, reason: str, by: str | None = None) -> None:
        """Ask to cancel: the loop stops at its next step and writes the same record as locally.
        ``by`` (added later, optional: signals sent with the reason alone still replay) is who asked."""
        self.cancel_reason, self.cancel_by = reason, by or "temporal"
        if self.run_id:
            request_cancel(self.store, self.run_id, reason, by=self.cancel_by, ownership=WorkflowOwnership())

    @workflow.query(name="pending")
    def pending(self) -> dict[str, dict[str, Any]]:
        # Plain dicts across the query: the converter would read a TypedDict's hints, whose
        # ``ReadOnly`` exists only for the type checker.
        cp = self.store.checkpoint(self.run_id) if self.run_id else None
        return {step: dict(entry) for step, entry in cp.pending.items()} if cp is not None else {}
