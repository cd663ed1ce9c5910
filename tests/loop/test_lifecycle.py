"""Budgets, rejected generations, cancellation, compensation and version choices (seed 001)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cuaderno import (
    Agent,
    BudgetExceeded,
    Budgets,
    Compensation,
    DrainOnOldWorker,
    ErrorClass,
    FinalStep,
    Migration,
    MigrationFailed,
    ModelResponse,
    NotUncertain,
    Policy,
    ReplayDivergence,
    RunBusy,
    RunCancelled,
    RunClosed,
    RunNotFound,
    SchemaTooNew,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    StepEvent,
    ToolContext,
    ToolError,
    ToolStep,
    UncertainEffect,
    UsageError,
    VersionMismatch,
    approve,
    cancel,
    compensate,
    deny,
    resolve,
    tool,
)
from cuaderno.journal import EVENT_SCHEMA_VERSION
from cuaderno.loop import holds as _holds


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = SqliteCheckpointer(tmp_path / "runs.db")
    yield s
    s.close()


async def collect(agent: Agent, task: str, session: Session) -> list[Any]:
    return [step async for step in agent.run(task, session=session)]


class Bank:
    def __init__(self) -> None:
        self.moves: list[tuple[str, int]] = []

    def tools(self) -> list[Any]:
        @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"], "amount": args["amount"]}))
        def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
            """Move money."""
            self.moves.append((to, amount))
            return {"ok": True}

        @tool
        def refund(to: str, amount: int) -> dict[str, Any]:
            """Give money back."""
            self.moves.append((to, -amount))
            return {"refunded": amount}

        @tool
        def update(version: int) -> str:
            """Update a record (may conflict)."""
            raise ToolError("stale version", error_class=ErrorClass.CONFLICT)

        return [transfer, refund, update]


# -- budgets -------------------------------------------------------------------------------------


async def test_each_kind_has_its_own_bound_and_the_run_fails_when_one_is_spent(store: Any) -> None:
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools(), budgets=Budgets(replans=2))
    gw = ScriptedGateway([ScriptedGateway.call("update", version=1)] * 5)
    with pytest.raises(BudgetExceeded) as info:
        await collect(agent, "t", Session("b", gw, store))
    assert info.value.budget == "replans" and info.value.limit == 2
    cp = store.checkpoint("b")
    assert cp.status == "failed" and cp.count("replans") == 3 and cp.count("repairs") == 0
    assert gw.calls == 3  # stopped at the third conflict, not at max_turns
    with pytest.raises(RunClosed):
        await collect(agent, "t", Session("b", gw, store))


async def test_crash_points_name_one_transaction_only(store: Any) -> None:
    """The points a flush names (``tool.K6``...) are for its own transaction: a run-ending write
    appended directly afterwards (a bound exceeded) must not fire them, or a crash test armed at
    ``tool.K6`` would die inside the run's end and count it as a tool result."""
    from cuaderno.testing import crash

    crash.on("never.K0", lambda: None)  # arms the machinery without any kill
    fired: list[str] = []
    real_point = crash.point
    try:
        crash.point = lambda name: fired.append(name)  # type: ignore[assignment]
        agent = Agent(instructions="i", tools=Bank().tools(), budgets=Budgets(replans=1))
        with pytest.raises(BudgetExceeded):
            await collect(agent, "t", Session("pts", ScriptedGateway([ScriptedGateway.call("update", version=1)] * 5),
                                              store))
    finally:
        crash.point = real_point  # type: ignore[assignment]
        crash.on("never.K0", None)
    assert store.load("pts")[-1].phase == "end"
    assert crash._txn_points == ()
    # Two tool results, two commits holding one: K6 fired in each, not again in the end's.
    assert fired.count("tool.K6") == 2, fired


async def test_budgets_survive_a_resume(store: Any) -> None:
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools(), budgets=Budgets(repairs=1),
                  policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="x", amount="many"), ScriptedGateway.call("transfer", to="x", amount=1),
              ScriptedGateway.call("transfer", to="x", amount="again")]
    await collect(agent, "t", Session("bs", ScriptedGateway(script), store))  # one repair, then waits
    assert store.checkpoint("bs").count("repairs") == 1
    from cuaderno import approve

    approve(store, "bs", "t0001.tool00")
    with pytest.raises(BudgetExceeded):  # the second repair, in another session, exceeds the bound of 1
        await collect(agent, "t", Session("bs", ScriptedGateway(script), store))


async def test_a_bound_exceeded_before_a_crash_fails_the_resume_before_any_new_call(store: Any) -> None:
    """The step that exceeds a bound commits, then the run's end does; a process killed between
    the two leaves a run that is still open. Its resume must fail at once, not make one more call."""
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools(), budgets=Budgets(replans=1))
    with pytest.raises(BudgetExceeded):
        await collect(agent, "t", Session("full", ScriptedGateway([ScriptedGateway.call("update", version=1)] * 5),
                                          store))
    events = store.load("full")
    assert events[-1].step_id == "run" and events[-1].phase == "end"
    for ev in events[:-1]:  # everything but the end: the state the kill leaves
        store.append([StepEvent(run_id="cut", step_id=ev.step_id, phase=ev.phase, kind=ev.kind, name=ev.name,
                                decision=ev.decision, fingerprint=ev.fingerprint, payload=ev.payload)])
    assert store.checkpoint("cut").status != "failed" and store.checkpoint("cut").count("replans") == 2
    gw = ScriptedGateway([ScriptedGateway.call("update", version=1)] * 5)
    with pytest.raises(BudgetExceeded) as info:
        await collect(agent, "t", Session("cut", gw, store))
    assert info.value.budget == "replans" and gw.calls == 0
    cp = store.checkpoint("cut")
    assert cp.status == "failed" and cp.count("replans") == 2


# -- empty generations ---------------------------------------------------------------------------


async def test_empty_turns_are_rejected_counted_and_capped_per_episode(store: Any) -> None:
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools(), require_tool=True, budgets=Budgets(rejected_responses=2))
    calls: list[int] = []

    def script(request: Any) -> ModelResponse:
        calls.append(len(request.messages))
        return ScriptedGateway.empty()

    with pytest.raises(BudgetExceeded) as info:
        await collect(agent, "t", Session("e", ScriptedGateway(script), store))
    assert info.value.budget == "rejected_responses"
    assert calls == [1, 1, 1]  # the same conversation asked again: an empty turn adds nothing to it
    cp = store.checkpoint("e")
    assert cp.count("rejected_responses") == 3 and cp.count("unpriced_calls") == 3


async def test_an_empty_turn_then_an_answer_completes(store: Any) -> None:
    gw = ScriptedGateway(lambda r: ScriptedGateway.empty() if not gw.calls or gw.calls == 1 else ScriptedGateway.text("ok"))
    steps = await collect(Agent(instructions="i"), "t", Session("e2", gw, store))
    assert isinstance(steps[-1], FinalStep) and steps[-1].output == "ok"
    assert store.checkpoint("e2").count("rejected_responses") == 1
    # replay: the rejected turn is not re-asked and not part of the context
    gw2 = ScriptedGateway([ScriptedGateway.text("never")])
    again = await collect(Agent(instructions="i"), "t", Session("e2", gw2, store))
    assert again[-1].replayed and gw2.calls == 0


# -- cancellation --------------------------------------------------------------------------------


async def test_cancel_a_waiting_run_closes_it_at_once_with_its_record(store: Any) -> None:
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="a", amount=1), ScriptedGateway.text("x")]
    await collect(agent, "t", Session("c1", ScriptedGateway(script), store))
    cp = cancel(store, "c1", "changed my mind", by="ana")
    assert cp.status == "cancelled" and cp.outcome is not None
    assert cp.outcome["not_started"] == ["t0000.tool00.approval"] and cp.outcome["completed"] == []
    assert cancel(store, "c1", "again").status == "cancelled"  # idempotent
    gw = ScriptedGateway(script)
    with pytest.raises(RunClosed):
        await collect(agent, "t", Session("c1", gw, store))
    assert gw.calls == 0 and bank.moves == []


async def test_cancel_while_running_admits_no_new_step_and_keeps_the_effect_in_flight(store: Any) -> None:
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools())

    @tool
    def slow_transfer(to: str, amount: int) -> str:
        """A transfer during which someone cancels the run."""
        cancel(store, "c2", "stop", by="ops")  # the cancellation commits while the effect is in flight
        bank.moves.append((to, amount))
        return "sent"

    agent = Agent(instructions="i", tools=[*bank.tools(), slow_transfer])
    gw = ScriptedGateway([ScriptedGateway.call("slow_transfer", to="b", amount=7), ScriptedGateway.text("never")])
    with pytest.raises(RunCancelled) as info:
        await collect(agent, "t", Session("c2", gw, store))
    record = info.value.record
    assert bank.moves == [("b", 7)] and gw.calls == 1  # the next model call was never sent
    assert [c["step_id"] for c in record["completed"]] == ["t0000.tool00"] and record["uncertain"] == []
    cp = store.checkpoint("c2")
    assert cp.status == "cancelled"
    result = next(e for e in store.load("c2") if e.step_id == "t0000.tool00" and e.phase == "result")
    assert result.payload["value"] == "sent"  # the effect in flight was journaled, not lost
    assert not any(e.step_id == "t0001.model" for e in store.load("c2"))


async def test_cancel_errors(store: Any) -> None:
    with pytest.raises(RunNotFound):
        cancel(store, "nope", "x")
    await collect(Agent(instructions="i"), "t", Session("done", ScriptedGateway([ScriptedGateway.text("x")]), store))
    n = len(store.load("done"))
    with pytest.raises(RunClosed):
        cancel(store, "done", "too late")
    assert len(store.load("done")) == n


class Meanwhile:
    """The store as one process sees it, while another process writes at the worst moment: right
    before this process's first append (after its checks) or right after its first load."""

    def __init__(self, store: Any, *, before_append: Any = None, after_load: Any = None, load: int = 1) -> None:
        self.store, self.before_append, self.after_load = store, before_append, after_load
        self.loads_left = load  # the hook runs after this load (1: the first)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def append(self, events: Any, **kwargs: Any) -> Any:
        hook, self.before_append = self.before_append, None
        if hook is not None:
            hook()
        return self.store.append(events, **kwargs)

    def load(self, run_id: str) -> Any:
        events = self.store.load(run_id)
        self.loads_left -= 1
        if self.loads_left:
            return events
        hook, self.after_load = self.after_load, None
        if hook is not None:
            hook()
        return events


async def _waiting_for_approval(store: Any, run_id: str) -> Agent:
    agent = Agent(instructions="i", tools=Bank().tools(), policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="a", amount=1), ScriptedGateway.text("x")]
    await collect(agent, "t", Session(run_id, ScriptedGateway(script), store))
    return agent


@pytest.mark.parametrize("decide", [approve, deny])
async def test_a_decision_racing_a_cancellation_is_refused_in_its_own_write(store: Any, decide: Any) -> None:
    await _waiting_for_approval(store, "r1")
    racing = Meanwhile(store, before_append=lambda: cancel(store, "r1", "stop", by="another process"))
    with pytest.raises(RunClosed):
        decide(racing, "r1", "t0000.tool00")  # its checks passed; the cancellation committed first
    cp = store.checkpoint("r1")
    assert cp.status == "cancelled" and cp.outcome["not_started"] == ["t0000.tool00.approval"]
    assert not any(e.kind == "approval" and e.phase == "decision" for e in store.load("r1"))


async def test_a_cancellation_never_closes_a_run_that_completed_while_it_was_deciding(store: Any) -> None:
    await _waiting_for_approval(store, "r2")

    def another_process_finishes_the_run() -> None:
        approve(store, "r2", "t0000.tool00")
        store.append([StepEvent(run_id="r2", step_id="final", phase="result", kind="final",
                                payload={"output": "done elsewhere", "turn": 1})])

    racing = Meanwhile(store, after_load=another_process_finishes_the_run)
    with pytest.raises(RunClosed):
        cancel(racing, "r2", "stop")  # it read "suspended" and computed a record from that journal
    cp = store.checkpoint("r2")
    assert cp.status == "completed" and cp.outcome == {"output": "done elsewhere", "turn": 1}
    assert not any(e.kind == "cancel" or (e.kind == "run" and e.phase == "end") for e in store.load("r2"))


async def test_a_cancellation_record_lists_what_happened_while_it_was_being_computed(store: Any) -> None:
    await _waiting_for_approval(store, "r3")
    # cancel reads the journal (1) to decide, then again (2) after taking the run over.
    racing = Meanwhile(store, after_load=lambda: approve(store, "r3", "t0000.tool00"), load=2)
    cp = cancel(racing, "r3", "stop")
    # The approval landed after the record's read: the record's write is refused (compare-and-set),
    # and read again the run is running, so the request waits for its loop (a record computed
    # from the stale read would have listed the call as not started).
    assert cp.status == "running" and cp.cancel_requested is not None and cp.outcome is None


async def test_an_approval_landing_before_the_takeover_is_in_the_cancellation_record(store: Any) -> None:
    await _waiting_for_approval(store, "r3b")
    racing = Meanwhile(store, after_load=lambda: approve(store, "r3b", "t0000.tool00"), load=1)
    cp = cancel(racing, "r3b", "stop")
    # Decided from a read taken before the approval, closed from one taken after it: the record
    # lists the approved call as not started, as the next resume's would have.
    assert cp.status == "cancelled" and cp.outcome is not None
    assert cp.outcome["not_started"] == ["t0000.tool00.approval"] and cp.outcome["completed"] == []
    decision = next(e for e in store.load("r3b") if e.kind == "approval" and e.phase == "decision")
    assert decision.decision == "approved"


async def test_a_decision_landing_while_a_resume_opens_the_run_is_replayed_not_missed(store: Any) -> None:
    """A resume checks the journal, then takes the run over: whatever committed in between (here
    a person's approval; after a forced takeover, the previous owner's last results) must be in
    the journal it replays. Read only once, the approval would be missed and the run would
    suspend again with the approved call not run."""
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="a", amount=1), ScriptedGateway.text("sent")]
    await collect(agent, "t", Session("r5", ScriptedGateway(script), store))
    assert bank.moves == [] and store.checkpoint("r5").status == "suspended"
    racing = Meanwhile(store, after_load=lambda: approve(store, "r5", "t0000.tool00"), load=1)
    gw = ScriptedGateway(script[1:])
    steps = await collect(agent, "t", Session("r5", gw, racing))
    assert bank.moves == [("a", 1)] and gw.calls == 1
    assert isinstance(steps[-1], FinalStep) and store.checkpoint("r5").status == "completed"


async def test_an_approved_call_that_never_started_is_listed_as_not_started(store: Any) -> None:
    agent = await _waiting_for_approval(store, "r4")
    approve(store, "r4", "t0000.tool00")
    assert cancel(store, "r4", "stop").status == "running"  # approved: the next resume closes it
    gw = ScriptedGateway([ScriptedGateway.text("never")])
    with pytest.raises(RunCancelled) as info:
        await collect(agent, "t", Session("r4", gw, store))
    assert info.value.record["not_started"] == ["t0000.tool00.approval"] and info.value.record["completed"] == []
    assert gw.calls == 0 and not any(e.phase == "intent" and e.kind == "tool" for e in store.load("r4"))


HOLDER = """
import sys
from cuaderno.journal import _lease
assert _lease.lock(sys.argv[1], sys.argv[2]) is True
print("holding", flush=True)
sys.stdin.read()  # until the test lets go
"""


async def test_cancel_leaves_a_waiting_run_that_a_live_process_is_resuming_to_that_process(store: Any) -> None:
    agent = await _waiting_for_approval(store, "r5")
    # Another live process holds the run (say a resumer settling it right now).
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, store.path, "r5"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        epoch = store.checkpoint("r5").epoch
        cp = cancel(store, "r5", "stop")
        # Only the request: the holder's loop closes the run at its next step (closing it here
        # would list its step in flight as not started while it runs).
        assert cp.status == "suspended" and cp.cancel_requested is not None and cp.outcome is None
        with pytest.raises(RunBusy):
            await collect(agent, "t", Session("r5", ScriptedGateway([]), store))
        assert store.checkpoint("r5").epoch == epoch
    finally:
        holder.communicate("")
    # The holder is gone (killed or done): the run is taken over at once and closed.
    with pytest.raises(RunCancelled):
        await collect(agent, "t", Session("r5", ScriptedGateway([]), store))
    assert store.checkpoint("r5").status == "cancelled"


async def test_a_cancel_landing_as_the_loop_stops_for_a_person_still_closes_the_run(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop looks for a cancellation request, finds none, and stops for a person; a request
    commits before it lets the run go. The canceller could not take the run over (held), and the
    loop will not look again: cancel() keeps trying while the holder stops, then closes the run."""
    import threading
    import time

    from cuaderno.loop.runner import Runner

    answers: list[Any] = []
    threads: list[threading.Thread] = []
    real_release = Runner._release

    def late_cancel_then_release(self: Runner) -> None:
        def go() -> None:
            with SqliteCheckpointer(store.path) as other:
                answers.append(cancel(other, self.run_id, "late", by="ops"))
        threads.append(threading.Thread(target=go))
        threads[0].start()
        # Let go only once the request has committed, while this loop still holds the run.
        deadline = time.monotonic() + 60
        while store.checkpoint(self.run_id).cancel_requested is None:
            assert time.monotonic() < deadline and threads[0].is_alive(), "the cancellation request never committed"
            time.sleep(0.01)
        real_release(self)

    monkeypatch.setattr(Runner, "_release", late_cancel_then_release)
    await _waiting_for_approval(store, "late")
    threads[0].join(10)
    assert store.checkpoint("late").status == "cancelled"
    assert answers[0].status == "cancelled"


async def test_cancel_is_a_request_then_a_wait_for_the_holder(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two halves of cancel(): request_cancel writes the request and returns at once, even
    while the loop that stops for a person still holds the run; wait_for_holder, once that loop
    let go, closes it (what a workflow does with its own timer instead of a blocking wait)."""
    from cuaderno.cancellation import request_cancel, wait_for_holder
    from cuaderno.loop.runner import Runner

    seen: list[Any] = []
    real_release = Runner._release

    def request_then_release(self: Runner) -> None:
        seen.append(request_cancel(store, self.run_id, "late", by="ops"))  # held: only the request
        real_release(self)

    monkeypatch.setattr(Runner, "_release", request_then_release)
    await _waiting_for_approval(store, "split")
    assert seen[0].status == "suspended" and seen[0].cancel_requested == {"reason": "late", "by": "ops"}
    cp = wait_for_holder(store, "split")
    assert cp.status == "cancelled" and cp.outcome["not_started"] == ["t0000.tool00.approval"]
    assert wait_for_holder(store, "split").status == "cancelled"  # closed: nothing more to do


async def test_cancel_from_this_process_leaves_a_loop_in_the_middle_of_a_step_its_run(store: Any) -> None:
    """An uncertain run (``needs_human``) is being settled by a loop of this very process when
    cancel() comes: the loop keeps the run (only the request is written), and closes it once the
    effect in flight landed, so the record lists it as completed with its refund."""
    moves: list[int] = []
    state = {"phase": "first"}

    def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        if state["phase"] == "first":
            raise ConnectionError("the bank does not answer")  # -> uncertain, needs a person
        return None  # absence proven: send again

    @tool(lookup=lookup,
          compensation=Compensation("refund", lambda args, result: {"to": args["to"], "amount": args["amount"]}))
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money."""
        if state["phase"] == "first":
            raise ToolError("timed out after sending", error_class=ErrorClass.AMBIGUOUS)
        state["cancel"] = cancel(store, "c3", "user clicked cancel")  # clicked while the transfer is in flight
        moves.append(amount)
        return {"ok": True}

    @tool
    def refund(to: str, amount: int) -> dict[str, Any]:
        """Give money back."""
        return {"refunded": amount}

    agent = Agent(instructions="i", tools=[transfer, refund])
    script = [ScriptedGateway.call("transfer", to="a", amount=3), ScriptedGateway.text("never")]
    with pytest.raises(UncertainEffect):
        await collect(agent, "t", Session("c3", ScriptedGateway(script), store))
    assert store.checkpoint("c3").status == "needs_human"
    state["phase"] = "second"
    gw = ScriptedGateway(script)
    with pytest.raises(RunCancelled) as info:
        await collect(agent, "t", Session("c3", gw, store))
    assert state["cancel"].outcome is None  # cancel() did not close the run under the loop
    assert moves == [3] and gw.calls == 0
    record = info.value.record
    assert [c["step_id"] for c in record["completed"]] == ["t0000.tool00"] and record["uncertain"] == []
    assert record["cleanup"] and record["cleanup"][0]["tool"] == "refund"


async def test_closing_the_store_before_the_loop_releases_the_run(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with SqliteCheckpointer(path) as store:
        agent = await _waiting_for_approval(store, "c4")
    with SqliteCheckpointer(path) as store:
        approve(store, "c4", "t0000.tool00")
    with SqliteCheckpointer(path) as store:
        steps = agent.run("t", session=Session("c4", ScriptedGateway([ScriptedGateway.text("ok")]), store))
        assert isinstance(await steps.__anext__(), ToolStep)  # the caller returns here: the loop is not closed
    with SqliteCheckpointer(path) as store:
        holder = json.loads(store._db.execute("SELECT owner FROM cuaderno_runs WHERE run_id='c4'").fetchone()[0])
    assert holder["held"] is False  # another process may resume it while this one lives on
    with contextlib.suppress(UsageError):  # its store is closed: what it still held is lost
        await steps.aclose()


def test_a_forked_child_does_not_inherit_the_loops_of_its_parent(tmp_path: Path) -> None:
    async def paused() -> Any:
        store = SqliteCheckpointer(tmp_path / "runs.db")
        agent = Agent(instructions="i", tools=Bank().tools())
        gen = agent.run("t", session=Session("f", ScriptedGateway([ScriptedGateway.call("update", version=1),
                                                                     ScriptedGateway.text("x")]), store))
        await gen.__anext__()
        return gen

    loop = asyncio.new_event_loop()
    gen = loop.run_until_complete(paused())
    assert _holds._holder
    pid = os.fork()
    if pid == 0:  # the child: nothing of the parent's loops, nor of their connections
        os._exit(0 if not _holds._holder and not _holds._busy else 1)
    _, status = os.waitpid(pid, 0)
    loop.run_until_complete(gen.aclose())
    loop.close()
    assert os.waitstatus_to_exitcode(status) == 0


async def test_compensation_is_scheduled_on_cancel_and_runs_once_with_its_own_identity(store: Any) -> None:
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools(), policy=Policy({"refund": "allow", "transfer": "allow"}))

    script = [ScriptedGateway.call("transfer", to="c", amount=5), ScriptedGateway.call("transfer", to="d", amount=6)]
    steps = agent.run("t", session=Session("c3", ScriptedGateway(script), store))
    with pytest.raises(RunCancelled):
        async for step in steps:
            if getattr(step, "tool", None) == "transfer":
                cancel(store, "c3", "abort")
    cp = store.checkpoint("c3")
    assert cp.status == "cancelled" and [c["step_id"] for c in cp.outcome["completed"]] == ["t0000.tool00"]
    assert cp.outcome["cleanup"] == [{"for_step": "t0000.tool00", "tool": "refund",
                                      "arguments": {"to": "c", "amount": 5}, "status": "scheduled"}]
    results = await compensate(agent, store, "c3")
    assert bank.moves == [("c", 5), ("c", -5)] and results[0]["outcome"] == "ok"
    assert results[0]["effect_key"] != cp.outcome["completed"][0]["effect_key"]
    await compensate(agent, store, "c3")
    assert bank.moves == [("c", 5), ("c", -5)]


async def test_a_compensation_needs_its_own_permission(store: Any) -> None:
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools(), policy=Policy({"refund": "deny"}))
    steps = agent.run("t", session=Session("c4", ScriptedGateway([ScriptedGateway.call("transfer", to="e", amount=1),
                                                                  ScriptedGateway.text("x")]), store))
    with pytest.raises(RunCancelled):
        async for step in steps:
            if getattr(step, "tool", None) == "transfer":
                cancel(store, "c4", "abort")
    results = await compensate(agent, store, "c4")
    assert results[0]["outcome"] == "denied" and bank.moves == [("e", 1)]


# -- versions ------------------------------------------------------------------------------------


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def _suspended_run(store: Any, instructions: str) -> tuple[Bank, list[ModelResponse]]:
    bank = Bank()
    agent = Agent(instructions=instructions, tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="f", amount=3), ScriptedGateway.text("done")]
    await collect(agent, "t", Session("v", ScriptedGateway(script), store))
    return bank, script


async def test_version_mismatch_choices(store: Any, tmp_path: Path) -> None:
    bank, script = await _suspended_run(store, "v1")
    v2 = Agent(instructions="v2", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    rows = len(store.load("v"))
    with pytest.raises(VersionMismatch) as info:
        await collect(v2, "t", Session("v", ScriptedGateway(script), store))
    assert info.value.recorded["agent"] != info.value.current["agent"]
    with pytest.raises(DrainOnOldWorker):
        await collect(v2, "t", Session("v", ScriptedGateway(script), store, on_version_mismatch="drain"))
    assert len(store.load("v")) == rows
    with pytest.raises(ReplayDivergence):  # "resume unchanged" still refuses another request at turn 0
        await collect(v2, "t", Session("v", ScriptedGateway(script), store, on_version_mismatch="resume"))
    with pytest.raises(RunCancelled):
        await collect(v2, "t", Session("v", ScriptedGateway(script), store, on_version_mismatch="cancel"))
    assert store.checkpoint("v").status == "cancelled"


@pytest.mark.parametrize("choice", ["refuse", "resume", "drain", "cancel", "migrate"])
async def test_a_run_of_a_newer_event_schema_is_refused_whatever_the_version_choice(store: Any, choice: str) -> None:
    """Events of a newer schema may not mean what this code reads in them: no choice replays
    them. Before, on_version_mismatch="resume" replayed such a run to completion."""
    bank, script = await _suspended_run(store, "v1")
    agent = Agent(instructions="v1", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    start = store.load("v")[0]
    newer = {**start.payload, "versions": {**start.payload["versions"], "schema": EVENT_SCHEMA_VERSION + 1}}
    store.append([StepEvent(run_id="n", step_id="run", phase="start", kind="run", name=start.name,
                            fingerprint=start.fingerprint, payload=newer)])
    before = store.load("n")
    on_mismatch: Any = Migration(name="m", migrate=lambda old, new, events: {}) if choice == "migrate" else choice
    gw = ScriptedGateway(script)
    with pytest.raises(SchemaTooNew, match=f"event schema version {EVENT_SCHEMA_VERSION + 1} is newer"):
        await collect(agent, "t", Session("n", gw, store, on_version_mismatch=on_mismatch))
    assert store.load("n") == before and gw.calls == 0 and bank.moves == []


def _cut(store: Any, source: str, run_id: str, until: tuple[str, str]) -> None:
    """Copy ``source``'s events up to and including ``until`` into ``run_id``: the journal a
    process killed right after committing ``until`` leaves."""
    for ev in store.load(source):
        store.append([StepEvent(run_id=run_id, step_id=ev.step_id, phase=ev.phase, kind=ev.kind, name=ev.name,
                                decision=ev.decision, fingerprint=ev.fingerprint, payload=ev.payload)])
        if (ev.step_id, ev.phase) == until:
            return
    raise AssertionError(f"{until} is not in {source}")


async def test_a_migration_over_a_model_call_in_flight_sends_it_again_with_the_new_body(store: Any) -> None:
    """Killed while turn 1's request was out (intent, no response), then migrated: the call is
    sent again under the new configuration (another body, another key), counted as possibly
    billed twice. It used to be refused for good: the intent's fingerprint predates the migration."""
    bank = Bank()
    v1 = Agent(instructions="v1", tools=bank.tools())
    script = [ScriptedGateway.call("transfer", to="f", amount=3), ScriptedGateway.text("done")]
    await collect(v1, "t", Session("full", ScriptedGateway(script), store))
    _cut(store, "full", "v", ("t0001.model", "intent"))
    v2 = Agent(instructions="v2", tools=bank.tools())
    gw = ScriptedGateway(script[1:])
    migration = Migration(name="reword", migrate=lambda old, new, events: {"note": "reworded"})
    steps = await collect(v2, "t", Session("v", gw, store, on_version_mismatch=migration))
    assert isinstance(steps[-1], FinalStep) and gw.calls == 1 and gw.requests[0].instructions == "v2"
    phases = [(e.step_id, e.phase) for e in store.load("v")]
    assert phases.index(("run", "migrate.1")) < phases.index(("t0001.model", "intent.2"))
    assert store.checkpoint("v").count("possibly_billed_twice") == 1
    gw2 = ScriptedGateway(script)
    again = await collect(v2, "t", Session("v", gw2, store))
    assert again[-1].replayed and gw2.calls == 0


async def _transfer_in_flight(store: Any, run_id: str) -> Bank:
    """A run whose transfer was started (intent committed) and never recorded: the journal a
    process killed in the transfer's body leaves. Returns the bank (one move: it happened)."""
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools())
    await collect(agent, "t", Session(f"{run_id}-full", ScriptedGateway(
        [ScriptedGateway.call("transfer", to="f", amount=3), ScriptedGateway.text("done")]), store))
    _cut(store, f"{run_id}-full", run_id, ("t0000.tool00", "intent"))
    return bank


async def test_a_started_call_the_agent_now_refuses_is_a_divergence(store: Any) -> None:
    """A transfer was started (intent, no result); the agent resumed without that tool. An
    "unknown tool" error recorded now would hide a transfer that may have happened."""
    bank = await _transfer_in_flight(store, "gone")
    rows = len(store.load("gone"))
    without = Agent(instructions="i", tools=[t for t in bank.tools() if t.name != "transfer"])
    with pytest.raises(ReplayDivergence, match="'transfer' started and not finished"):
        await collect(without, "t", Session("gone", ScriptedGateway([ScriptedGateway.text("x")]), store,
                                            on_version_mismatch=Migration(name="drop transfer",
                                                                          migrate=lambda old, new, events: {})))
    assert len(store.load("gone")) == rows and bank.moves == [("f", 3)]  # not even the migration's record


async def test_a_run_failed_on_a_bound_names_the_effect_in_flight(store: Any) -> None:
    """A bound lowered since the run started is found exceeded on opening, while a transfer is
    in flight (intent, no result). The failure record names it, as a cancellation's would."""
    bank = Bank()
    script = [ScriptedGateway.call("update", version=1), ScriptedGateway.call("update", version=2),
              ScriptedGateway.call("transfer", to="f", amount=3), ScriptedGateway.text("done")]
    roomy = Agent(instructions="i", tools=bank.tools(), budgets=Budgets(replans=5))
    await collect(roomy, "t", Session("full", ScriptedGateway(script), store))
    _cut(store, "full", "b", ("t0002.tool00", "intent"))
    tight = Agent(instructions="i", tools=bank.tools(), budgets=Budgets(replans=1))
    gw = ScriptedGateway(script)
    with pytest.raises(BudgetExceeded):
        await collect(tight, "t", Session("b", gw, store, on_version_mismatch="resume"))
    cp = store.checkpoint("b")
    assert cp.status == "failed" and gw.calls == 0
    assert [u["step_id"] for u in cp.outcome["uncertain"]] == ["t0002.tool00"]
    assert cp.outcome["uncertain"][0]["effect_key"].startswith("eff-")
    # Still an open question a person can settle, and `cuaderno show` lists it.
    assert list(cp.uncertain) == ["t0002.tool00"]
    resolve(store, "b", "t0002.tool00", happened=False, by="ops")
    assert store.checkpoint("b").uncertain == {} and store.checkpoint("b").status == "failed"


async def test_a_transfer_a_person_confirmed_is_compensated_on_cancel(store: Any) -> None:
    """Killed with the transfer in flight, no lookup: a person confirms it happened. Its result
    is written without the agent, so a later cancellation must still schedule its refund."""
    bank = Bank()
    agent = Agent(instructions="i", tools=bank.tools())
    script = [ScriptedGateway.call("transfer", to="c", amount=5), ScriptedGateway.call("transfer", to="d", amount=1),
              ScriptedGateway.text("done")]
    await collect(agent, "t", Session("full", ScriptedGateway(script), store))
    _cut(store, "full", "conf", ("t0000.tool00", "intent"))
    with pytest.raises(UncertainEffect):
        await collect(agent, "t", Session("conf", ScriptedGateway(script), store))
    resolve(store, "conf", "t0000.tool00", happened=True, result={"ok": True}, by="ops")
    with pytest.raises(RunCancelled):
        async for step in agent.run("t", session=Session("conf", ScriptedGateway(script), store)):
            if getattr(step, "tool", None) == "transfer":
                cancel(store, "conf", "abort")
    bank.moves.clear()
    results = await compensate(agent, store, "conf")
    assert [r["outcome"] for r in results] == ["ok", "ok"] and sorted(bank.moves) == [("c", -5), ("d", -1)]


async def test_a_confirmed_effect_of_a_tool_without_compensation_needs_no_cleanup(store: Any) -> None:
    @tool
    def notify(text: str) -> str:
        """Send a message (nothing to undo)."""
        return "sent"

    agent = Agent(instructions="i", tools=[notify])
    script = [ScriptedGateway.call("notify", text="hi"), ScriptedGateway.call("notify", text="again"),
              ScriptedGateway.text("done")]
    await collect(agent, "t", Session("full", ScriptedGateway(script), store))
    _cut(store, "full", "nt", ("t0000.tool00", "intent"))
    with pytest.raises(UncertainEffect):
        await collect(agent, "t", Session("nt", ScriptedGateway(script), store))
    resolve(store, "nt", "t0000.tool00", happened=True, by="ops")
    cancel(store, "nt", "abort")  # running, with no loop: its next resume closes it
    with pytest.raises(RunCancelled):
        await collect(agent, "t", Session("nt", ScriptedGateway(script), store))
    results = await compensate(agent, store, "nt")
    assert [r["outcome"] for r in results] == ["nothing_to_do"]
    cp = store.checkpoint("nt")
    assert cp.count("tool_errors") == 0 and store.load("nt")[-1].name == "notify"


async def test_a_compensation_whose_reply_is_lost_is_reconciled_not_recorded_as_an_error(store: Any) -> None:
    receipts: list[str] = []
    lost = [True]

    def body(ctx: ToolContext) -> str:  # the first reply is lost after the refund went through
        receipts.append(ctx.effect_key)
        if lost:
            lost.pop()
            raise ToolError("reply lost", error_class=ErrorClass.AMBIGUOUS, sent=True)
        return "refunded"

    agent = _refund_agent(body, lookup=lambda ctx, arguments: {"key": ctx.effect_key}
                          if ctx.effect_key in receipts else None)
    await _cancelled_after_a_transfer(agent, store, "amb")
    results = await compensate(agent, store, "amb")
    assert results[0]["outcome"] == "ok" and results[0]["counters"] == {"reconciled": 1}
    assert len(receipts) == 1  # found by the lookup, not sent again


async def test_an_unsettleable_compensation_asked_again_writes_nothing(store: Any) -> None:
    def body(ctx: ToolContext) -> str:  # no lookup, and its reply is always lost
        raise ToolError("reply lost", error_class=ErrorClass.AMBIGUOUS, sent=True)

    agent = _refund_agent(body)
    await _cancelled_after_a_transfer(agent, store, "uns")
    with pytest.raises(UncertainEffect):
        await compensate(agent, store, "uns")
    rows = len(store.load("uns"))
    for _ in range(3):  # a cron retrying it: the same answer, and the journal does not grow
        with pytest.raises(UncertainEffect):
            await compensate(agent, store, "uns")
    assert len(store.load("uns")) == rows and store.checkpoint("uns").count("uncertain") == 1


def _refund_agent(refund_body: Any, *, lookup: Any = None, policy: Policy | None = None) -> Agent:
    @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"], "amount": args["amount"]}))
    def transfer(to: str, amount: int) -> str:
        """Move money."""
        return "moved"

    @tool(lookup=lookup)
    def refund(to: str, amount: int, ctx: ToolContext) -> str:
        """Give money back."""
        return str(refund_body(ctx))

    return Agent(instructions="i", tools=[transfer, refund], policy=policy)


async def _cancelled_after_a_transfer(agent: Agent, store: Any, run_id: str) -> None:
    with pytest.raises(RunCancelled):
        async for step in agent.run("t", session=Session(run_id, ScriptedGateway(
                [ScriptedGateway.call("transfer", to="c", amount=5), ScriptedGateway.text("x")]), store)):
            if getattr(step, "tool", None) == "transfer":
                cancel(store, run_id, "abort")


async def test_compensate_refuses_what_it_cannot_run_and_writes_nothing(store: Any) -> None:
    refunds: list[str] = []
    agent = _refund_agent(lambda ctx: refunds.append(ctx.effect_key))
    await _cancelled_after_a_transfer(agent, store, "cw")
    rows = len(store.load("cw"))
    without = Agent(instructions="i", tools=[t for t in agent.tools.values() if t.name != "refund"])
    with pytest.raises(UsageError, match="does not have"):
        await compensate(without, store, "cw")
    asks = Agent(instructions="i", tools=list(agent.tools.values()), policy=Policy({"refund": "require_approval"}))
    with pytest.raises(UsageError, match="approve"):
        await compensate(asks, store, "cw")
    assert len(store.load("cw")) == rows and refunds == []
    assert [r["outcome"] for r in await compensate(agent, store, "cw")] == ["ok"] and len(refunds) == 1


async def test_a_compensation_refused_before_it_was_sent_is_retried(store: Any) -> None:
    refunds: list[str] = []
    refused = [True]

    def body(ctx: ToolContext) -> str:
        if refused:
            refused.pop()
            raise ToolError("429", error_class=ErrorClass.TRANSIENT, sent=False)
        refunds.append(ctx.effect_key)
        return "refunded"

    agent = _refund_agent(body)
    await _cancelled_after_a_transfer(agent, store, "tr")
    results = await compensate(agent, store, "tr")
    assert results[0]["outcome"] == "ok" and results[0]["counters"] == {"retries": 1} and len(refunds) == 1


async def test_a_compensation_backs_off_like_any_tool_step(store: Any) -> None:
    """Refused before it was sent (429), twice, a compensation waits as the loop's tool steps do:
    the session retry policy's jittered delay, drawn from the runtime's random source and waited
    on its sleep (it had its own fixed ``asyncio.sleep(0.1 * 2 ** n)``); each send its own intent."""
    import random

    from cuaderno import RetryPolicy
    from cuaderno.loop.runtime import Runtime

    refused = [True, True]

    def body(ctx: ToolContext) -> str:
        if refused:
            refused.pop()
            raise ToolError("429", error_class=ErrorClass.TRANSIENT, sent=False)
        return "refunded"

    agent = _refund_agent(body)
    await _cancelled_after_a_transfer(agent, store, "bo")
    slept: list[float] = []

    async def note(seconds: float) -> None:
        slept.append(seconds)

    results = await compensate(agent, store, "bo", runtime=Runtime(seed=7, sleep=note))
    assert results[0]["outcome"] == "ok" and results[0]["counters"] == {"retries": 2}
    same = random.Random(7)
    assert slept == [RetryPolicy().delay(1, None, same), RetryPolicy().delay(2, None, same)]
    sends = [e.phase for e in store.load("bo") if e.step_id == "cleanup00" and e.phase.startswith("intent")]
    assert sends == ["intent", "intent.2", "intent.3"]


async def test_a_re_send_in_flight_cannot_be_settled_by_a_person(store: Any) -> None:
    """The lookup proved the transfer absent and the loop sends it again; a person who still sees
    the old evidence must not be able to say "did not happen" now: the next resume would send it
    a third time."""
    sends: list[int] = []
    lookups = [RuntimeError("bank down")]
    refused: list[str] = []

    def find(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        if lookups:
            raise lookups.pop()
        return None

    @tool(lookup=find)
    def transfer(to: str, amount: int, ctx: ToolContext) -> str:
        """Move money; the person acts while it is in flight."""
        sends.append(ctx.attempt)
        if ctx.attempt > 1:
            with pytest.raises(NotUncertain):
                resolve(store, "inf", "t0000.tool00", happened=False, by="ops")
            refused.append("refused")
        return "moved"

    agent = Agent(instructions="i", tools=[transfer])
    script = [ScriptedGateway.call("transfer", to="c", amount=5), ScriptedGateway.text("done")]
    await collect(agent, "t", Session("full", ScriptedGateway(script), store))
    _cut(store, "full", "inf", ("t0000.tool00", "intent"))
    with pytest.raises(UncertainEffect):  # the lookup failed: nobody knows yet
        await collect(agent, "t", Session("inf", ScriptedGateway(script), store))
    await collect(agent, "t", Session("inf", ScriptedGateway(script), store))  # absent: sent again
    assert refused == ["refused"] and store.checkpoint("inf").status == "completed"


async def test_settled_effects_of_a_cancelled_run(store: Any) -> None:
    """An effect in flight when the run was cancelled: a person confirms it later (its refund is
    scheduled then), or established before the cancel that it did not happen (not listed again)."""
    refunds: list[str] = []
    agent = _refund_agent(lambda ctx: refunds.append(ctx.effect_key))
    script = [ScriptedGateway.call("transfer", to="c", amount=5), ScriptedGateway.text("done")]
    await collect(agent, "t", Session("full", ScriptedGateway(script), store))
    for run_id in ("late", "gone"):
        _cut(store, "full", run_id, ("t0000.tool00", "intent"))
    # late: cancelled with the transfer in flight, confirmed afterwards.
    cancel(store, "late", "abort")
    with pytest.raises(RunCancelled):
        await collect(agent, "t", Session("late", ScriptedGateway(script), store))
    assert list(store.checkpoint("late").uncertain) == ["t0000.tool00"]
    resolve(store, "late", "t0000.tool00", happened=True, by="ops")
    assert [r["outcome"] for r in await compensate(agent, store, "late")] == ["ok"] and len(refunds) == 1
    # gone: a person established it did not happen; then the run was cancelled.
    store.append([StepEvent(run_id="gone", step_id="t0000.tool00", phase="uncertain", kind="tool", name="transfer",
                            payload={"tool": "transfer", "arguments": {"to": "c", "amount": 5}})])
    resolve(store, "gone", "t0000.tool00", happened=False, by="ops")
    cancel(store, "gone", "abort")
    with pytest.raises(RunCancelled):
        await collect(agent, "t", Session("gone", ScriptedGateway(script), store))
    cp = store.checkpoint("gone")
    assert cp.uncertain == {} and cp.outcome["uncertain"] == [] and cp.outcome["cleanup"] == []


async def test_the_tenant_is_checked_before_anything_is_written(store: Any) -> None:
    bank = Bank()
    v1 = Agent(instructions="v1", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="f", amount=3), ScriptedGateway.text("done")]
    await collect(v1, "t", Session("ten", ScriptedGateway(script), store, tenant="acme"))
    rows = len(store.load("ten"))
    v2 = Agent(instructions="v2", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    for choice in (Migration(name="m", migrate=lambda old, new, events: {}), "cancel"):
        with pytest.raises(ReplayDivergence, match="tenant"):
            await collect(v2, "t", Session("ten", ScriptedGateway(script), store, tenant="other",
                                           on_version_mismatch=choice))
    assert len(store.load("ten")) == rows and store.checkpoint("ten").status == "suspended"
    cancel(store, "ten", "stop")
    with pytest.raises(ReplayDivergence, match="tenant"):
        await compensate(v1, store, "ten", tenant="other")
    assert len(store.load("ten")) == rows + 2  # the cancellation only (request and record)
    bank.moves.clear()
    await compensate(v1, store, "ten")  # the run's own tenant by default


async def test_cancel_on_a_version_mismatch_does_not_wait_for_its_own_loop(
        store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resuming loop asks for the cancellation itself while it holds the run: cancel() must
    not wait for a holder that is its own caller (it used to sleep 2 s, blocking the event loop)."""
    import cuaderno.loop.runtime

    bank, script = await _suspended_run(store, "v1")

    def no_sleep(seconds: float) -> None:
        raise AssertionError("cancel() waited for the loop that called it")

    monkeypatch.setattr(cuaderno.loop.runtime.time, "sleep", no_sleep)  # the default runtime's wait
    v2 = Agent(instructions="v2", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    with pytest.raises(RunCancelled):
        await collect(v2, "t", Session("v", ScriptedGateway(script), store, on_version_mismatch="cancel"))
    assert store.checkpoint("v").status == "cancelled"


async def test_a_migration_to_an_agent_that_refuses_a_started_call_is_not_recorded(store: Any) -> None:
    await _transfer_in_flight(store, "sch")
    rows = len(store.load("sch"))

    @tool
    def transfer(to: str, amount: int, currency: str) -> str:
        """Move money (now with a required currency)."""
        return "moved"

    v2 = Agent(instructions="i", tools=[transfer])
    with pytest.raises(ReplayDivergence, match="refuses that call"):
        await collect(v2, "t", Session("sch", ScriptedGateway([]), store,
                                       on_version_mismatch=Migration(name="m", migrate=lambda old, new, events: {})))
    assert len(store.load("sch")) == rows


async def test_a_failing_migration_leaves_the_journal_as_it_was(store: Any, tmp_path: Path) -> None:
    bank, script = await _suspended_run(store, "v1")
    v2 = Agent(instructions="v2", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    store.close()
    before = _file_digest(tmp_path / "runs.db")

    def refuse(old: dict[str, Any], new: dict[str, Any], events: list[Any]) -> dict[str, Any]:
        raise ValueError("cannot migrate runs with pending transfers")

    s2 = SqliteCheckpointer(tmp_path / "runs.db")
    with pytest.raises(MigrationFailed):
        await collect(v2, "t", Session("v", ScriptedGateway(script), s2, on_version_mismatch=Migration(name="m",
                                                                                                       migrate=refuse)))
    s2.close()
    assert _file_digest(tmp_path / "runs.db") == before


async def test_a_migration_moves_the_run_and_new_steps_use_the_new_agent(store: Any) -> None:
    bank, script = await _suspended_run(store, "v1")
    from cuaderno import approve

    approve(store, "v", "t0000.tool00")
    v2 = Agent(instructions="v2", tools=bank.tools(), policy=Policy({"transfer": "require_approval"}))
    seen: list[Any] = []

    def migrate(old: dict[str, Any], new: dict[str, Any], events: list[Any]) -> dict[str, Any]:
        seen.append((old["agent"], new["agent"], len(events)))
        return {"note": "instructions reworded; recorded steps stand"}

    gw = ScriptedGateway(script)
    steps = await collect(v2, "t", Session("v", gw, store, on_version_mismatch=Migration(name="reword", migrate=migrate)))
    assert isinstance(steps[-1], FinalStep) and bank.moves == [("f", 3)] and gw.calls == 1
    assert gw.requests[0].instructions == "v2"
    cp = store.checkpoint("v")
    assert cp.versions["agent"] == v2.versions()["agent"] and len(seen) == 1
    migrate_ev = next(e for e in store.load("v") if e.phase.startswith("migrate"))
    assert migrate_ev.payload["record"]["note"].startswith("instructions")
    # the migrated run replays under v2 with no call and no divergence
    gw2 = ScriptedGateway(script)
    again = await collect(v2, "t", Session("v", gw2, store))
    assert again[-1].replayed and gw2.calls == 0
