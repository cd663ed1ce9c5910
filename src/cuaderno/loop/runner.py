"""The loop: next step -> replay it from the journal, or execute it -> record it.

For every step the runner asks the journal first (the index loaded at start). Replay rules, seed
000's table:

=================================  ============================================================
in the journal                     what replay does
=================================  ============================================================
intent and result                  skip the step, use the recorded result
neither                            execute it
intent, no result, non-idempotent  reconcile through the tool's lookup, or ``UncertainEffect``
intent, no result, idempotent      execute it again (same effect key)
=================================  ============================================================

A model call is repeatable: an intent without a result is re-sent with the same idempotency key,
and the re-send is journaled (``intent.2``) so the checkpoint counts it as possibly billed twice.

Writes are batched without weakening any rule: a step's result waits in ``pending`` and commits
in the same transaction as the *next* intent, which must be on disk before the next action
anyway. So each step costs one synced commit, and nothing leaves the process (a request, a tool
body) before everything it depends on is durable. Steps are yielded only after their commit.

A resume replays the turns after the run's latest snapshot (:mod:`._snapshots`; every turn when
there is none, or the run is not simply running) through the same loop as a live run, so it is
ready for its next step in a time that does not grow with the run's length; the first model call
rebuilds the conversation before the snapshot from the whole journal. Two shortcuts were measured on
a 1000-turn resume and not adopted: replaying whole turns in a synchronous pre-pass, without a
coroutine per step, took 3% *more* instructions (it looks each result up twice to know a turn is
whole); pausing the cyclic garbage collector while the journal is opened moved no median (the
first collection afterwards walks the same objects).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import NoReturn

from cuaderno import faults, telemetry
from cuaderno.cancellation import cancel, finalize, in_flight
from cuaderno.checkpoint import Checkpoint, verified
from cuaderno.durable.opening import check_reopened
from cuaderno.errors import (
    BudgetExceeded,
    DrainOnOldWorker,
    FencedOut,
    JournalError,
    MigrationFailed,
    ReplayDivergence,
    RunCancelled,
    RunClosed,
    ToolError,
    UncertainEffect,
    VersionMismatch,
)
from cuaderno.events import RESTORE_STEP, StepEvent, call_arguments, model_step_id
from cuaderno.events.payloads import ModelIntent, RunMigrate, RunStart, view
from cuaderno.fingerprint import fingerprint
from cuaderno.loop import _snapshots
from cuaderno.loop._log import RunLog
from cuaderno.loop._model_steps import ModelSteps
from cuaderno.loop._state import effect_key, new_state, tool_message
from cuaderno.loop._tool_steps import ToolSteps
from cuaderno.loop.agent import Agent, Session
from cuaderno.loop.steps import FinalStep, Step, VersionChange
from cuaderno.loop.versions import Migration
from cuaderno.plainjson import JSONObject

__all__ = ["Runner", "effect_key", "tool_message"]


class Runner:
    """Drives one run of one agent through one session: opens the run, then walks its turns
    through its collaborators, which all receive the same :class:`~._state.RunState`:
    :class:`~._log.RunLog` (the journal as the steps write it), :class:`~._model_steps.ModelSteps`,
    :class:`~._tool_steps.ToolSteps` and :mod:`._snapshots`. The runner writes the state's opening
    fields (``journal``, ``unvisited``, ``epoch``, ``where``, ``pass_span``, ``pass_marker``,
    ``migrated``, ``migrate_seq``, ``rebase_turn``, ``spent``, ``cancel_found``)."""

    def __init__(self, agent: Agent, task: str, session: Session) -> None:
        self.state = state = new_state(agent, task, session)
        self.run_id = state.run_id
        self.log = log = RunLog(state)
        self.models = ModelSteps(state, log)
        self.tool_steps = ToolSteps(state, log)

    @property
    def agent(self) -> Agent:
        return self.state.agent

    def _add_task(self) -> None:
        """Add the run's first message, its task (a conversation's message run puts the earlier
        exchanges before it: ``cuaderno.loop.conversation``)."""
        self.log.add_message({"role": "user", "content": self.state.task})

    # -- opening ----------------------------------------------------------------------------------

    def _open(self, cp: Checkpoint | None) -> FinalStep | None:
        faults.point("recovery.R0")
        task_fp = fingerprint({"task": self.state.task})
        versions = self.state.agent.versions()
        events: list[StepEvent] | None = None
        if cp is None:
            start: RunStart = {"task": self.state.task, "versions": versions, "tenant": self.state.s.tenant}
            self.state.store.append([StepEvent(run_id=self.run_id, step_id="run", phase="start", kind="run",
                                         name=self.state.agent.name, fingerprint=task_fp, payload=dict(start))])
            cp = Checkpoint(run_id=self.run_id, task_fingerprint=task_fp, versions=versions)
        else:
            # From the latest snapshot and the rows after it when there is a usable one (checked
            # as the whole journal would be; :mod:`._snapshots`), else from the whole journal.
            tail = _snapshots.tail_open(self.state, cp, versions)
            checked = tail if tail is not None and self._check_resumable(tail[0], task_fp, versions) is None \
                else self._checked(task_fp, versions)
            if isinstance(checked, FinalStep):
                return checked
            cp, events = checked
        faults.point("recovery.R2")
        # Once the run is taken over, anything a previous owner tries to commit is refused. Every
        # check that can refuse the resume ran above, so a refused resume has written nothing (not
        # even the takeover). A run that ended since it was read (another process finished it) is
        # not taken over (``open_only``, checked in the takeover's transaction): it is answered
        # as the closed run it now is.
        try:
            s = self.state.s
            self.state.epoch = s.ownership.acquire(self.state.store, self.run_id, s.owner, force=s.force_takeover,
                                                   open_only=True)
        except RunClosed:
            cp, _ = verified(self.state.store, self.run_id)
            closed = self._check_resumable(cp, task_fp, versions)
            if closed is not None:
                return closed
            raise  # ended for the store, open for its journal: a damaged status column, refused
        self.state.s.ownership.took(self.state.where, self)
        faults.point("recovery.R3")
        # What was committed before the takeover must all be in the events replayed: read once
        # more, and if the journal grew since it was checked (a forced takeover's previous owner,
        # a person's decision, the version choice above), check it again.
        latest = self.state.store.checkpoint(self.run_id)
        if not events or latest is None or (latest.last_seq, latest.last_hash) != (events[-1].seq, events[-1].row_hash):
            cp, events = verified(self.state.store, self.run_id)
        migrate_seq = 0
        for ev in events:
            self.state.journal[(ev.step_id, ev.phase)] = ev
            if ev.kind in ("model", "tool", "final") and ev.step_id != RESTORE_STEP:
                # A restore's record is no turn's step: while it stands unsettled the opening
                # refuses (UncertainEffect); settled, it is nothing to reach.
                self.state.unvisited.setdefault(ev.step_id, ev.seq)
            elif ev.kind == "run" and ev.phase.startswith("migrate"):
                migrate_seq = ev.seq
        _snapshots.opened(self.state, events)
        # The pass's span links to the previous pass's; its own marker rides on its first write.
        self.state.pass_marker = self.state.pass_span.opened(self.state.journal)
        if migrate_seq:
            self.state.migrate_seq = migrate_seq
            self._after_migration(events, migrate_seq)
        # The counters (budgets already spent) and a cancellation that committed while this
        # process was opening the run come from the summary checked against these events.
        # Charged, not just copied: a bound the journal already exceeds (the process died after
        # committing the step that exceeded it, before the run's end) fails the run before any
        # new call, instead of after one more.
        self.state.spent = {}
        self.log.charge(cp.counters)
        self.state.cancel_found = cp.cancel_requested is not None
        if not self.state.messages:  # not added yet by the first request's check
            self._add_task()
        return None

    def _checked(self, task_fp: str, versions: Mapping[str, object]) -> tuple[Checkpoint, list[StepEvent]] | FinalStep:
        """Everything that can refuse to resume an existing run, before anything is written: the
        run's summary and journal (checked against each other), or the answer of a closed run.

        Everything decided here (closed or not, the versions, the budgets already spent) is read
        from the summary row, which sits beside the hash chain, not in it: it must be the
        projection of the chain-checked journal, or the run is refused (JournalCorrupt). The
        events are replayed after the takeover: only their rebuild is extra (about 3 ms for a
        1000-turn run).
        """
        cp, events = verified(self.state.store, self.run_id)
        closed = self._check_resumable(cp, task_fp, versions)
        if closed is not None:
            return closed
        if cp.cancel_requested is not None:
            return cp, events  # closed on opening, as a cancellation: nothing is replayed
        if cp.versions != versions and self._version_choice(cp, versions, events):
            return cp, events
        self._check_first_request(events)
        self._check_turns(cp, events)
        return cp, events

    def _check_first_request(self, events: list[StepEvent]) -> None:
        """The first request must be the recorded one (the loop checks it again on replay).

        It depends only on the agent's configuration and the task, so a resume under other
        instructions or tools (``on_version_mismatch="resume"``) is refused here, before the run
        is taken over, instead of at its first replayed turn. After a migration the recorded
        turns stand as they were sent: nothing to compare.
        """
        if not self.state.messages:
            self._add_task()
        fp = self.log.request_fingerprint()  # the loop's turn 0 finds it computed (the same chain)
        step_id = model_step_id(0)
        for ev in events:
            if ev.kind in ("model", "tool", "final") and ev.step_id != step_id:
                break  # turn 0's model call is the first step the loop writes
            if ev.step_id == step_id and ev.phase in ("intent", "result") and ev.fingerprint is not None \
                    and ev.fingerprint != fp:
                if any(e.kind == "run" and e.phase.startswith("migrate") for e in events):
                    return  # looked for only now: it reads the whole journal
                raise ReplayDivergence(self.run_id, step_id, f"model request {ev.fingerprint[:12]}",
                                       f"model request {fp[:12]}")

    def _check_turns(self, cp: Checkpoint, events: list[StepEvent]) -> None:
        """A journal with turns at or past ``max_turns`` (lowered since): the loop would end the
        run without reaching them, which it refuses (``_diverged``) after replaying the turns
        below it. Refused here instead, the same way, before the run is taken over. Not when a
        bound is already exceeded: the loop fails that run (a record) before replaying anything.
        """
        beyond = model_step_id(self.state.agent.max_turns)
        seen = next((e for e in events if e.step_id == beyond), None)
        if seen is None:
            return
        budgets = self.state.agent.budgets
        if any((limit := budgets.limit(name)) is not None and n > limit for name, n in cp.counters.items()):
            return
        name = f" ({seen.name})" if seen.name else ""
        raise ReplayDivergence(self.run_id, beyond, f"{seen.kind} step {beyond}{name} ({seen.phase}) at this point",
                               f"the end of the run at max_turns={self.state.agent.max_turns} without reaching it")

    def _check_resumable(self, cp: Checkpoint, task_fp: str, versions: Mapping[str, object]) -> FinalStep | None:
        # Before anything is written (a migration, a cancel request); the schema before any
        # version choice (not even "resume" may replay events of a newer schema).
        check_reopened(cp, self.run_id, task_fingerprint=task_fp, tenant=self.state.s.tenant)
        if cp.status == "completed":
            return self._closed_answer(cp, versions)
        if cp.status in ("failed", "cancelled"):
            raise RunClosed(self.run_id, cp.status)
        if cp.status == "needs_human" and cp.uncertain and cp.cancel_requested is None:
            # Resume only if something can settle an uncertain step now (a lookup, or a receiver
            # that deduplicates); otherwise say so again without touching the journal.
            for step_id, evidence in cp.uncertain.items():
                info = self.state.tools.info(str(evidence.get("tool")))
                if info is None or (not info.has_lookup and not info.idempotent):
                    raise UncertainEffect(self.run_id, step_id, evidence)
        return None

    def _closed_answer(self, cp: Checkpoint, versions: Mapping[str, object]) -> FinalStep:
        """The answer of a completed run (``cp`` was checked against the journal), under the
        same version rule as an open run; nothing is written either way.

        ``"refuse"`` raises :class:`VersionMismatch` and ``"drain"`` :class:`DrainOnOldWorker`,
        as for an open run. The choices that would go on with an open run (``"resume"``,
        ``"cancel"``, a :class:`Migration`) return the recorded answer with
        ``FinalStep.version_mismatch`` set: there is nothing left to continue, cancel or migrate
        (no record is written, the migration function is not called), but the caller learns the
        answer came from other code.
        """
        mismatch: VersionChange | None = None
        if cp.versions != versions:
            choice = self.state.s.on_version_mismatch
            if choice == "refuse":
                raise VersionMismatch(self.run_id, cp.versions, versions)
            if choice == "drain":
                raise DrainOnOldWorker(self.run_id, cp.versions, versions)
            mismatch = VersionChange(recorded=cp.versions, current=versions)
        outcome = cp.outcome or {}
        return FinalStep(step_id="final", output=str(outcome.get("output", "")), replayed=True, data=outcome,
                         version_mismatch=mismatch)

    def _version_choice(self, cp: Checkpoint, versions: Mapping[str, object], events: list[StepEvent]) -> bool:
        """Apply ``on_version_mismatch``; ``events`` is the journal ``cp`` was checked against.
        Returns whether the recorded turns are left uncompared: the run was migrated (they stand
        as they were sent), or its cancellation was requested (nothing is replayed)."""
        choice = self.state.s.on_version_mismatch
        if choice == "resume":
            return False
        if choice == "drain":
            raise DrainOnOldWorker(self.run_id, cp.versions, versions)
        if choice == "cancel":
            cancel(self.state.store, self.run_id, f"version mismatch: {cp.versions} -> {versions}; start a new run",
                   by=self.state.s.owner, runtime=self.state.s.runtime, ownership=self.state.s.ownership)
            return True  # finalized below, like any cancellation found on opening
        if isinstance(choice, Migration):
            for started in in_flight(events):
                problem = self._refuses(str(started.get("tool")), call_arguments(events, started["step_id"]))
                if problem is not None:
                    # Refused before the migration is recorded: the run would be left migrated
                    # to an agent that cannot settle an effect that may have happened.
                    raise ReplayDivergence(self.run_id, started["step_id"],
                                           f"tool {started['tool']!r} started and not finished",
                                           f"an agent that refuses that call ({problem}); the migration was "
                                           "not recorded")
            self._check_turns(cp, events)  # the migrated run would diverge as well: refused unrecorded
            try:
                record = choice.migrate(dict(cp.versions), dict(versions), events)
            except Exception as exc:
                raise MigrationFailed(self.run_id, cp.versions, versions) from exc
            n = sum(1 for e in events if e.kind == "run" and e.phase.startswith("migrate")) + 1
            migrated: RunMigrate = {"from": cp.versions, "to": versions, "name": choice.name, "record": record}
            self.state.store.append([StepEvent(run_id=self.run_id, step_id="run", phase=f"migrate.{n}", kind="run",
                                         name=choice.name, payload=dict(migrated))])
            return True
        raise VersionMismatch(self.run_id, cp.versions, versions)

    def _refuses(self, name: str, arguments: JSONObject | None) -> str | None:
        """Why this agent would refuse a call it must settle (``None``: it accepts it)."""
        if self.state.tools.info(name) is None:
            return f"no tool {name!r}"
        if arguments is None:
            return None  # the journal does not say (a custom history): the loop checks it on replay
        try:
            self.state.tools.check(name, arguments)
        except ToolError as exc:
            return str(exc)
        return None

    def _after_migration(self, events: list[StepEvent], migrate_seq: int) -> None:
        """Recorded turns stand as decided; the first turn after the migration carries a marker."""
        self.state.migrated = True
        # Any send after the migration (a re-send of a turn in flight across it, ``intent.N``, too).
        after = [e for e in events if e.kind == "model" and e.phase.startswith("intent") and e.seq > migrate_seq]
        self.state.rebase_turn = min((int(view(e, ModelIntent).get("turn", 0)) for e in after), default=None)

    # -- the loop ---------------------------------------------------------------------------------

    async def steps(self) -> AsyncIterator[Step]:
        """The async iterator behind :meth:`Agent.run`.

        Registers the loop with the other loops of this process (:mod:`cuaderno.loop._holds`): it
        is busy on the run except while its caller holds a yielded step, and if another loop took
        the run over meanwhile, it stops (``FencedOut``) instead of going on.
        """
        own = self.state.s.ownership
        where = self.state.where = own.key(self.state.store, self.run_id)
        own.start(where, self, force=self.state.s.force_takeover)
        agent = self.state.agent
        self.state.pass_span = telemetry.agent_pass(agent.name, run_id=self.run_id, model=agent.model,
                                              gateway=self.state.s.gateway)
        inner = self.state.pass_span.drive(self._steps())
        try:
            async for step in inner:
                own.pause(where, self)
                yield step
                if not own.resume(where, self):
                    cp = self.state.store.checkpoint(self.run_id)
                    raise FencedOut(self.run_id, self.state.epoch, cp.epoch if cp is not None else self.state.epoch)
        finally:
            # Busy again (if it still holds the run) while the inner loop's clean-up commits the
            # results of finished steps: no other loop may take the run over in between.
            own.resume(where, self)
            try:
                await inner.aclose()
            finally:
                own.stop(where, self)

    async def _steps(self) -> AsyncGenerator[Step, None]:
        closed = await self._opening()
        if closed is not None:
            yield closed
            return
        # Bound once: these run on every step.
        model_turn, finish = self.models.turn, self.models.finish
        # ToolSteps.call, inline: replay, else run the step (one coroutine less per tool step)
        tool_replay, tool_step = self.tool_steps.replay, self.tool_steps.step
        drain = self.log.drain
        try:
            if self.state.cancel_found:
                self._finalize_cancel()
            self._enforce_budgets()
            for turn in range(self.state.snaps.start_turn, self.state.agent.max_turns):
                response = await model_turn(turn)
                for s in drain():
                    yield s
                self._enforce_budgets()
                if response is None:
                    continue  # rejected (empty or refused): counted, and the turn is asked again
                if not response.tool_calls:
                    finish(turn, response)
                    for s in drain():
                        yield s
                    return
                for index, call in enumerate(response.tool_calls):
                    unrecorded = tool_replay(turn, index, call)
                    suspended = False if unrecorded is None else await tool_step(*unrecorded)
                    for s in drain():
                        yield s
                    self._enforce_budgets()
                    if suspended:
                        self._stop_for_a_person()
                        return
            self.log.commit()
            for s in drain():
                yield s
            # Recorded steps past the last turn (max_turns lowered since): the journal holds a
            # path this code does not take; ending the run would bury them (an intent among them
            # may have taken effect).
            self.log.diverged(f"the end of the run at max_turns={self.state.agent.max_turns}")
            self.state.spent["max_turns"] = self.state.agent.max_turns
            self._end_failed("max_turns", self.state.agent.max_turns)
        except RunCancelled:
            self._finalize_cancel()
        except UncertainEffect:
            self._stop_for_a_person()
            raise
        except (GeneratorExit, asyncio.CancelledError):
            # The caller stopped iterating (or the task was cancelled) while results of steps
            # that already happened wait for the next commit: commit them now, or a tool that
            # ran would look unfinished on resume. Only results: nothing new is started.
            self._flush_results()
            raise
        finally:
            self._release()

    def _stop_for_a_person(self) -> None:
        """The run now waits for a person. A cancellation that came while this loop held the run
        could only write its request (the loop was in the middle of a step): close the run now,
        or it would wait for a decision nobody may take any more."""
        cp = self.state.store.checkpoint(self.run_id)
        if cp is not None and cp.cancel_requested is not None and cp.status != "cancelled":
            self._finalize_cancel()

    async def _opening(self) -> FinalStep | None:
        """Open the run (see :meth:`_open`); a new run first asks the gateway's preflight."""
        cp = self.state.store.checkpoint(self.run_id)
        preflight = getattr(self.state.s.gateway, "preflight", None)
        if preflight is not None and cp is None:
            await preflight()  # an unreachable endpoint fails a new run before its first journal write
        try:
            return self._open(cp)
        except BaseException:
            self._release()  # it may have taken the run over before it failed
            raise

    def _release(self) -> None:
        """Let the next process take the run over at once: this loop stopped running it."""
        if not self.state.epoch:
            return  # it never took the run over
        try:
            self.state.s.ownership.release(self.state.store, self.run_id, self.state.epoch)
        except JournalError:
            pass  # the hold then ends with this process (a resumer checks that it is alive)

    def hand_over(self) -> None:
        """Another loop of this process takes the run while this one waits at a yielded step:
        commit the results of what already happened, so the new holder replays them (if this
        fails, the other loop is refused: a model call would be billed again, a tool body would
        look uncertain)."""
        self._flush_results()

    def _flush_results(self) -> None:
        """Commit what is pending except anything that would start new work."""
        self.log.flush_results()

    def _enforce_budgets(self) -> None:
        if self.state.over_budget is not None:
            self.log.commit()
            self._end_failed(*self.state.over_budget)

    def _end_failed(self, budget: str, limit: int) -> None:
        payload: dict[str, object] = {"status": "failed", "reason": "budget", "budget": budget, "limit": limit,
                                      "spent": self.state.spent.get(budget)}
        # A bound can be found exceeded on opening (lowered since the run started) while a tool
        # step is in flight: the failure record names it, as a cancellation's does.
        uncertain = in_flight(self.state.store.load(self.run_id))
        if uncertain:
            payload["uncertain"] = uncertain
        self.state.store.append([StepEvent(run_id=self.run_id, step_id="run", phase="end", kind="run",
                                           payload=payload)], epoch=self.state.epoch)
        raise BudgetExceeded(self.run_id, budget, limit)

    def _finalize_cancel(self) -> NoReturn:
        """Stop for good: journal what was in flight, reconcile what can be, write the record."""
        self._flush_results()  # results of effects that completed before the cancellation still land
        finalize(self.state.store, self.run_id, self.state.epoch)

