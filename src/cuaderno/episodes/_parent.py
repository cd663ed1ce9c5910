"""The parent's walk (:class:`_ParentRun`): one process's pass through an episode's parent run,
replaying what its journal holds and doing the rest: open (or re-attach to) the run, run each child
pass through the runner, decide, apply through the effect protocol, close. The step ids it writes
are listed in :mod:`cuaderno.episodes.episode`."""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, TypedDict

from cuaderno import faults
from cuaderno.cancellation import finalize
from cuaderno.checkpoint import Checkpoint
from cuaderno.durable.effect import Effect, effect_key
from cuaderno.durable.log import JournalLog
from cuaderno.durable.opening import open_run
from cuaderno.episodes._children import ChildPass, ChildRunner
from cuaderno.episodes._records import (
    Apply,
    Decide,
    Decision,
    EpisodeResult,
    Lookup,
    PassRecord,
    T,
    _PassTotals,
)
from cuaderno.errors import (
    CuadernoError,
    DrainOnOldWorker,
    ReplayDivergence,
    RunCancelled,
    ToolResultInvalid,
    UsageError,
    VersionMismatch,
)
from cuaderno.events import StepEvent
from cuaderno.events.payloads import PassDecision, PassIntent, PassResult, ToolResult, view
from cuaderno.fingerprint import fingerprint
from cuaderno.loop import Session
from cuaderno.loop.versions import Migration
from cuaderno.plainjson import journalable

if TYPE_CHECKING:
    from cuaderno.episodes.episode import Episode

_KIND = "episode"
_EPISODE_BUDGET = {"max_turns": "turns_per_pass"}
"""A child loop's bound under the name of the episode's bound it comes from (the others keep
their loop names: a child that ran out of, say, ``repairs`` ended on its loop's budget)."""


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _Totals(TypedDict):
    """What a parent's end record says of all its passes (read back by people and ``show``; the
    parent's own result comes from its passes' results, not from these)."""

    passes: int
    turns: int
    rejected: int
    cost_usd: float


@dataclass(kw_only=True, slots=True)
class _Tally(_PassTotals):
    passes: list[PassRecord] = field(default_factory=list[PassRecord])


class _ParentRun(Generic[T]):
    """One parent process's walk through the episode: replay what is journaled, do the rest."""

    def __init__(self, episode: Episode[T], task: str, session: Session, runner: ChildRunner, decide: Decide[T],
                 apply: Apply[T] | None, lookup: Lookup[T] | None) -> None:
        self.e, self.task, self.s, self.runner = episode, task, session, runner
        self.decide_fn, self.apply_fn, self.lookup_fn = decide, apply, lookup
        self.run_id = session.run_id
        self.store = session.store
        self.journal: dict[tuple[str, str], StepEvent] = {}
        self.epoch = 0
        self.tally = _Tally()
        self.proposal: T | None = None
        self.cancel_requested = False

    # -- opening ----------------------------------------------------------------------------------

    async def run(self) -> EpisodeResult[T]:
        closed = self._open()
        if closed is not None:
            return closed
        try:
            if self.cancel_requested:
                self._finalize_cancel()
            try:
                return await self._walk()
            except RunCancelled:  # refused at an intent or the final answer: close the run now
                self._finalize_cancel()
        finally:
            self.s.ownership.release(self.store, self.run_id, self.epoch)

    def _finalize_cancel(self) -> NoReturn:
        """A cancellation was asked: no new pass, decision or apply starts. Close the parent with
        the cancellation record (an apply in flight is listed in it, as the loop lists a tool),
        and ask the child pass in flight, if any, to stop too."""
        for n in range(1, self.e.budgets.passes + 1):
            if self._ev(self._pass_id(n), "intent") is None or self._ev(self._pass_id(n), "result") is not None:
                continue
            self.runner.cancel(self._child_id(n), f"its parent {self.run_id!r} was cancelled", by=self.s.owner)
        finalize(self.store, self.run_id, self.epoch)

    def _open(self) -> EpisodeResult[T] | None:
        # The runner's opening (durable.opening): start or check the journaled run, then take it
        # over through the session's ownership (under Temporal the workflow owns it: no process
        # holds).
        opened = open_run(self.store, self.run_id, task=self.task,
                          task_fingerprint=fingerprint({"task": self.task, "episode": self.e.name}),
                          versions=self.e.versions(), tenant=self.s.tenant, owner=self.s.owner, name=self.e.name,
                          start={"episode": self.e.name}, on_version_mismatch=self._version_mismatch,
                          holding=self.s.ownership, force=self.s.force_takeover)
        self.journal = opened.log.index
        if opened.closed:
            return self._closed(opened.checkpoint)
        assert opened.epoch is not None
        self.epoch = opened.epoch
        self.cancel_requested = opened.checkpoint.cancel_requested is not None
        return None

    def _version_mismatch(self, recorded: Mapping[str, object], current: Mapping[str, object]) -> NoReturn:
        """The parent was started under other versions: ``session.on_version_mismatch`` says what
        to do, before anything is written. An episode refuses (``"refuse"``) or leaves the run to
        a worker of its versions (``"drain"``); going on under other code (``"resume"``,
        ``"cancel"``, a migration) is not supported for an episode's parent and is refused as a
        usage error, never ignored."""
        choice = self.s.on_version_mismatch
        if choice == "refuse":
            raise VersionMismatch(self.run_id, recorded, current)
        if choice == "drain":
            raise DrainOnOldWorker(self.run_id, recorded, current)
        named = f"Migration {choice.name!r}" if isinstance(choice, Migration) else repr(choice)
        raise UsageError(f"run {self.run_id!r}: an episode's parent supports on_version_mismatch='refuse' or "
                         f"'drain', not {named}; it was started under {recorded}, this code is {current}; "
                         "nothing was written")

    def _closed(self, cp: Checkpoint) -> EpisodeResult[T]:
        """A closed parent answers from its journal: nothing runs, nothing is written."""
        outcome = cp.outcome or {}
        for n in range(1, self.e.budgets.passes + 1):
            if self._ev(self._pass_id(n), "result") is None:
                break
            self._record_pass(n)
        proposal = outcome.get("proposal")
        return EpisodeResult(status=outcome.get("episode_status", "failed"), reason=str(outcome.get("reason", "")),
                             proposal=self.e.output.model_validate(proposal) if proposal is not None else None,
                             receipt=outcome.get("receipt"), passes=tuple(self.tally.passes), replayed=True)

    # -- the walk ---------------------------------------------------------------------------------

    async def _walk(self) -> EpisodeResult[T]:
        feedback = ""
        budgets = self.e.budgets
        for n in range(1, budgets.passes + 1):
            result = self._ev(self._pass_id(n), "result") or await self._run_child(n, feedback)
            record = self._record_pass(n)
            faults.point("episode.P1")  # the child's outcome is journaled, the decision not yet
            payload = view(result, PassResult)
            if record.outcome == "ended":
                budget = str(payload.get("budget") or "")
                if payload.get("reason") == "budget" and budget:
                    name = _EPISODE_BUDGET.get(budget, budget)
                    return self._end_exhausted(name, result.payload)
                why = "child_cancelled" if payload.get("child_status") == "cancelled" else "child_failed"
                return self._end("failed", why, {"child": payload.get("child_outcome")})
            if self.tally.rejected > budgets.rejected_responses:
                return self._end_exhausted("rejected_responses", result.payload)
            decision = self._decision_of(n)
            if decision is None:
                if record.outcome == "rejected":
                    decision = Decision.another_pass(str(payload.get("errors", "")))
                else:
                    assert self.proposal is not None
                    cp = self.store.checkpoint(self.run_id)
                    if cp is not None and cp.cancel_requested is not None:
                        raise RunCancelled(self.run_id, cp.cancel_requested)  # not even a check on a copy
                    decision = await self._decide(self.proposal)
                self._append(StepEvent(run_id=self.run_id, step_id=self._pass_id(n), phase="decision", kind=_KIND,
                                       decision=decision.action, payload=dict(PassDecision(reason=decision.reason))))
                self.tally.passes[-1] = _with_decision(record, decision)
                faults.point("episode.D1")  # decided, nothing applied yet
            if decision.action == "apply":
                assert self.proposal is not None
                try:
                    receipt = await self._apply(n, self.proposal)
                except _ApplyFailed as exc:  # refused, known not to have happened: nothing applied
                    return self._end("failed", "apply_failed", {"error": exc.args[0] if exc.args else None})
                return self._final("applied", decision.reason, receipt)
            if decision.action == "discard":
                return self._final("discarded", decision.reason, None)
            feedback = decision.reason
        return self._end_exhausted("passes", {"limit": budgets.passes})

    async def _decide(self, proposal: T) -> Decision:
        decision = await _maybe_await(self.decide_fn(proposal))
        if not isinstance(decision, Decision):
            raise UsageError(f"decide must return a Decision (Decision.apply/discard/another_pass), "
                             f"got {decision!r:.80}; nothing was journaled")
        if decision.action == "apply" and self.apply_fn is None:
            raise UsageError("decide chose to apply, but the episode was given no apply callback; nothing was journaled")
        return decision

    def _decision_of(self, n: int) -> Decision | None:
        ev = self._ev(self._pass_id(n), "decision")
        if ev is None:
            return None
        action = ev.decision
        if action not in ("apply", "discard", "another_pass"):
            raise ReplayDivergence(self.run_id, self._pass_id(n), f"decision {action!r}", "apply, discard or another_pass")
        return Decision(action, str(view(ev, PassDecision).get("reason", "")))  # type: ignore[arg-type]

    # -- a child pass -----------------------------------------------------------------------------

    async def _run_child(self, n: int, feedback: str) -> StepEvent:
        """Run (or re-attach to) child pass ``n`` through the runner and journal how it ended."""
        step_id, child_id = self._pass_id(n), self._child_id(n)
        if self._ev(step_id, "intent") is None:
            self._append(StepEvent(run_id=self.run_id, step_id=step_id, phase="intent", kind=_KIND,
                                   payload=dict(PassIntent(child_run_id=child_id))))
        child = ChildPass(parent_run_id=self.run_id, step_id=step_id, run_id=child_id, number=n,
                          task=self.e.child_task(self.task, n, feedback),
                          rejected_left=max(self.e.budgets.rejected_responses - self.tally.rejected, 0))
        ended = await self.runner.run(self.e, child)
        counts = {"turns": ended.turns, "child_rejected": ended.rejected, "cost_usd": ended.cost_usd,
                  "unpriced_calls": ended.unpriced_calls, "possibly_billed_twice": ended.possibly_billed_twice,
                  "tool_errors": ended.tool_errors, "child_run_id": child_id}
        if ended.output is not None:
            proposal, errors = self.e.validate(ended.output)
            if proposal is not None:
                payload = {**counts, "outcome": "proposal", "proposal": proposal.model_dump(mode="json")}
            else:
                payload = {**counts, "outcome": "rejected", "errors": errors, "answer": ended.output[:2000]}
        else:
            outcome = ended.outcome
            payload = {**counts, "outcome": "ended", "reason": outcome.get("reason"), "budget": outcome.get("budget"),
                       "child_status": ended.status, "child_outcome": outcome}
        return self._append(StepEvent(run_id=self.run_id, step_id=step_id, phase="result", kind=_KIND,
                                      payload=payload))[0]

    def _record_pass(self, n: int) -> PassRecord:
        """Pass ``n`` as its journaled result (and decision, if any) say; sets the proposal."""
        ev = self._ev(self._pass_id(n), "result")
        assert ev is not None
        p = view(ev, PassResult)
        outcome = str(p.get("outcome"))
        rejected = int(p.get("child_rejected", 0)) + (1 if outcome == "rejected" else 0)
        if outcome == "proposal":
            self.proposal = self.e.output.model_validate(p["proposal"])
        decided = self._decision_of(n)
        budget = p.get("budget")
        ended = f"{_EPISODE_BUDGET.get(budget, budget)} ran out" if budget else str(p.get("reason") or "")
        reason = decided.reason if decided else str(p.get("errors") or ended)
        record = PassRecord(number=n, child_run_id=str(p.get("child_run_id")), outcome=outcome,
                            turns=int(p.get("turns", 0)), rejected=rejected, cost_usd=float(p.get("cost_usd", 0.0)),
                            unpriced_calls=int(p.get("unpriced_calls", 0)),
                            possibly_billed_twice=int(p.get("possibly_billed_twice", 0)),
                            tool_errors=int(p.get("tool_errors", 0)),
                            decision=decided.action if decided else None, reason=reason)
        self.tally.passes.append(record)
        return record

    # -- the apply effect -------------------------------------------------------------------------

    async def _apply(self, n: int, proposal: T) -> Any:
        """Apply at most once per journaled intent, through the effect protocol
        (:class:`~cuaderno.durable.effect.Effect`): its intent is durable before the callback runs,
        and an intent without a result is settled first (the lookup, or ``needs_human``)."""
        step_id = f"{self._pass_id(n)}.apply"
        done = self._ev(step_id, "result")
        if done is not None:  # applied, refused, or settled by a person: answered from the journal
            result = view(done, ToolResult)
            if result.get("outcome") != "ok":
                raise _ApplyFailed(result.get("error"))
            return result.get("value")
        apply_fn, lookup_fn = self.apply_fn, self.lookup_fn
        assert apply_fn is not None
        args = proposal.model_dump(mode="json")
        # The log writes into the parent's own index: ``_append`` and the effect see every write.
        log = JournalLog(self.store, self.run_id, epoch=self.epoch, index=self.journal)

        async def body(attempt: int) -> Any:
            faults.point("episode.A2")  # the intent is on disk, the effect has not run
            receipt = await _maybe_await(apply_fn(proposal, effect.key))
            faults.point("episode.A4")  # the effect happened, its result is not journaled yet
            try:
                return journalable(receipt, run_id=self.run_id, step_id=step_id, tool="apply")
            except ToolResultInvalid as exc:
                # The effect happened: it is recorded as applied (never applied again), with why
                # its receipt could not be kept instead of the receipt.
                return {"receipt_not_journalable": str(exc)}

        async def lookup(attempt: int) -> Any:
            assert lookup_fn is not None
            found = await _maybe_await(lookup_fn(proposal, effect.key))
            return journalable(found, run_id=self.run_id, step_id=step_id, tool="apply")  # a receipt it can hold

        # A new apply's key is derived as every effect key is (a started one keeps the key its
        # first intent holds: the Effect reads it back).
        key = effect_key(self.s.tenant, self.run_id, "apply", args, str(self.e.versions()["episode"]))
        effect = Effect(log=log, step_id=step_id, tool="apply", arguments=args,
                        fingerprint=fingerprint({"name": "apply", "arguments": args}), key=key, body=body,
                        lookup=lookup if lookup_fn is not None else None, idempotent=False, decision=None,
                        policy_version=None, retry=self.s.retry, sleep=self.s.runtime.sleep,
                        rng=self.s.runtime.random, tells_the_model=False, unclassified="uncertain")
        settled = await effect.run()
        log.commit()
        if settled.payload.get("outcome") != "ok":  # refused, known not to have happened
            raise _ApplyFailed(settled.error)
        return settled.value

    # -- closing ----------------------------------------------------------------------------------

    def _final(self, status: Literal["applied", "discarded"], reason: str, receipt: Any) -> EpisodeResult[T]:
        proposal = self.proposal.model_dump(mode="json") if self.proposal is not None else None
        output = json.dumps(proposal, sort_keys=True) if status == "applied" else ""
        self._append(StepEvent(run_id=self.run_id, step_id="final", phase="result", kind="final",
                               payload={"output": output, "episode_status": status, "reason": reason,
                                        "proposal": proposal, "receipt": receipt, **self._totals()}))
        return EpisodeResult(status=status, reason=reason, proposal=self.proposal, receipt=receipt,
                             passes=tuple(self.tally.passes))

    def _end_exhausted(self, budget: str, payload: Mapping[str, object]) -> EpisodeResult[T]:
        limits = {"turns_per_pass": self.e.budgets.turns_per_pass, "passes": self.e.budgets.passes,
                  "rejected_responses": self.e.budgets.rejected_responses}
        return self._end("exhausted", budget, {"reason": "budget", "budget": budget,
                                               "limit": limits.get(budget, payload.get("limit"))})

    def _end(self, status: Literal["exhausted", "failed"], reason: str, extra: Mapping[str, object]) -> EpisodeResult[T]:
        proposal = self.proposal.model_dump(mode="json") if self.proposal is not None else None
        self._append(StepEvent(run_id=self.run_id, step_id="run", phase="end", kind="run",
                               payload={"reason": reason, **extra, "status": "failed", "episode_status": status,
                                        "proposal": proposal, **self._totals()}))
        return EpisodeResult(status=status, reason=reason, proposal=self.proposal, passes=tuple(self.tally.passes))

    def _totals(self) -> _Totals:
        t = self.tally
        return {"passes": len(t.passes), "turns": t.turns, "rejected": t.rejected, "cost_usd": t.cost_usd}

    # -- the journal ------------------------------------------------------------------------------

    def _append(self, ev: StepEvent) -> list[StepEvent]:
        stored = self.store.append([ev], epoch=self.epoch)
        for s in stored:
            self.journal[(s.step_id, s.phase)] = s
        return stored

    def _ev(self, step_id: str, phase: str) -> StepEvent | None:
        return self.journal.get((step_id, phase))

    def _pass_id(self, n: int) -> str:
        return f"{self.e.name}.pass{n:02d}"

    def _child_id(self, n: int) -> str:
        return f"{self.run_id}/{self._pass_id(n)}"


class _ApplyFailed(CuadernoError):
    """The apply callback refused (a classified, non-ambiguous ToolError): nothing was applied."""


def _with_decision(record: PassRecord, decision: Decision) -> PassRecord:
    return dataclasses.replace(record, decision=decision.action, reason=decision.reason)
