"""The loop and its replay rules, in one process (the crash tests in tests/crash kill real ones)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cuaderno import (
    Agent,
    ApprovalMismatch,
    ApprovalStep,
    ErrorClass,
    FencedOut,
    FinalStep,
    GatewayError,
    IdempotencyKeyReuse,
    MemoryCheckpointer,
    ModelRequest,
    ModelResponse,
    ModelStep,
    NotWaitingForApproval,
    Policy,
    PolicyDecision,
    ReplayDivergence,
    RetryPolicy,
    RunBusy,
    RunCancelled,
    RunClosed,
    RunNotFound,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    StepEvent,
    ToolCall,
    ToolContext,
    ToolError,
    ToolStep,
    UncertainEffect,
    UsageError,
    VersionMismatch,
    approve,
    cancel,
    deny,
    resolve,
    tool,
)
from cuaderno.fingerprint import fingerprint, idempotency_key
from cuaderno.gateway.base import assistant_message


class World:
    """Counts what the tools did, independently of the journal."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.transfers: list[dict[str, Any]] = []

    def tools(self) -> list[Any]:
        @tool(idempotent=True)
        def read_file(path: str) -> str:
            """Read a file."""
            self.reads.append(path)
            return f"contents of {path}"

        @tool
        def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
            """Move money."""
            self.transfers.append({"to": to, "amount": amount, "key": ctx.effect_key})
            return {"ok": True, "receipt": len(self.transfers)}

        return [read_file, transfer]


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        yield MemoryCheckpointer()
    else:
        s = SqliteCheckpointer(tmp_path / "runs.db")
        yield s
        s.close()


async def collect(agent: Agent, task: str, session: Session) -> list[Any]:
    return [step async for step in agent.run(task, session=session)]


async def test_run_then_closed_run_returns_without_calls(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    gw = ScriptedGateway([ScriptedGateway.call("read_file", path="/x"), ScriptedGateway.text("42")])
    steps = await collect(agent, "lee /x", Session("r1", gw, store))
    assert [type(s) for s in steps] == [ModelStep, ToolStep, ModelStep, FinalStep]
    assert gw.calls == 2 and world.reads == ["/x"]
    gw2 = ScriptedGateway([ScriptedGateway.text("other")])
    again = await collect(agent, "lee /x", Session("r1", gw2, store))
    assert len(again) == 1 and isinstance(again[0], FinalStep) and again[0].replayed and again[0].output == "42"
    assert again[0].data == steps[-1].data == {"output": "42", "turn": 1}  # the same record, first time and replayed
    assert gw2.calls == 0 and world.reads == ["/x"]
    cp = store.checkpoint("r1")
    assert cp.status == "completed" and cp.count("model_calls") == 2 and cp.count("tool_calls") == 1


async def test_keys_are_stable_and_derived_from_run_step_and_body(store: Any) -> None:
    agent = Agent(instructions="i")
    gw = ScriptedGateway([ScriptedGateway.text("hi")])
    steps = await collect(agent, "t", Session("r-key", gw, store))
    model = steps[0]
    assert isinstance(model, ModelStep)
    intent = next(e for e in store.load("r-key") if e.phase == "intent")
    assert model.idempotency_key == idempotency_key("r-key", "t0000.model", intent.fingerprint)
    assert gw.keys == [model.idempotency_key]


async def test_interrupted_model_call_is_resent_with_same_key_and_counted(store: Any) -> None:
    agent = Agent(instructions="i")
    gw = ScriptedGateway([ScriptedGateway.text("hi")])
    await collect(agent, "t", Session("r2", gw, store))
    # Rebuild the state "intent committed, process died before the result" in another run.
    events = store.load("r2")
    for ev in events[:2]:  # run start + model intent
        store.append([StepEvent(run_id="r3", step_id=ev.step_id, phase=ev.phase, kind=ev.kind, name=ev.name,
                                fingerprint=ev.fingerprint, payload=ev.payload)])
    gw3 = ScriptedGateway([ScriptedGateway.text("hi")])
    steps = await collect(agent, "t", Session("r3", gw3, store))
    assert isinstance(steps[-1], FinalStep)
    assert gw3.calls == 1
    cp = store.checkpoint("r3")
    assert cp.count("possibly_billed_twice") == 1 and cp.count("model_sends") == 2 and cp.count("model_calls") == 1
    phases = [e.phase for e in store.load("r3") if e.step_id == "t0000.model"]
    assert phases == ["intent", "intent.2", "result"]


async def _run_and_cut_after_the_transfer_intent(agent: Agent, store: Any, script: list[Any]) -> None:
    """Run ``full`` to its end, then copy it as ``cut`` up to the first tool intent: a process
    that died inside the tool body."""
    await collect(agent, "pay", Session("full", ScriptedGateway(script), store))
    events = store.load("full")
    _copy_prefix(store, "full", "cut", next(i for i, e in enumerate(events)
                                            if e.step_id == "t0000.tool00" and e.phase == "intent") + 1)


def _copy_prefix(store: Any, src: str, dst: str, upto: int) -> None:
    for ev in store.load(src)[:upto]:
        store.append([StepEvent(run_id=dst, step_id=ev.step_id, phase=ev.phase, kind=ev.kind, name=ev.name,
                                decision=ev.decision, fingerprint=ev.fingerprint, payload=ev.payload)])


async def test_intent_without_result_non_idempotent_is_uncertain_and_not_rerun(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    script = [ScriptedGateway.call("transfer", to="bob", amount=5), ScriptedGateway.text("done")]
    await _run_and_cut_after_the_transfer_intent(agent, store, script)
    world.transfers.clear()
    gw = ScriptedGateway(script)
    with pytest.raises(UncertainEffect) as info:
        await collect(agent, "pay", Session("cut", gw, store))
    assert world.transfers == [] and gw.calls == 0
    assert info.value.evidence["tool"] == "transfer" and info.value.evidence["effect_key"].startswith("eff-")
    cp = store.checkpoint("cut")
    assert cp.status == "needs_human" and "t0000.tool00" in cp.uncertain
    rows = len(store.load("cut"))
    with pytest.raises(UncertainEffect):  # asking again changes nothing
        await collect(agent, "pay", Session("cut", gw, store))
    assert len(store.load("cut")) == rows and world.transfers == []


async def _cut_transfer_with_lookup(store: Any, lookup: Any) -> tuple[Agent, list[ModelResponse], list[ToolContext]]:
    """An agent with one transfer tool that has ``lookup``, its run cut right after the transfer's
    intent (what a process killed in the tool body leaves); returns the agent, its script, and the
    list that every later run of the body appends its context to."""
    sent: list[ToolContext] = []

    @tool(lookup=lookup)
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money."""
        sent.append(ctx)
        return {"ok": True}

    agent = Agent(instructions="i", tools=[transfer])
    script = [ScriptedGateway.call("transfer", to="bob", amount=5), ScriptedGateway.text("done")]
    await _run_and_cut_after_the_transfer_intent(agent, store, script)
    sent.clear()
    return agent, script, sent


@pytest.mark.parametrize("meanwhile", ["cancelled", "taken over"])
async def test_a_re_send_after_a_lookup_commits_its_own_intent_first(store: Any, meanwhile: str) -> None:
    """A lookup proves the effect absent, so the body is sent again. If, while the lookup ran,
    another process cancelled the run or took it over, that re-send must be refused before the
    body runs: its intent goes through the same transaction checks as the first one."""

    def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        if meanwhile == "cancelled":
            cancel(store, "cut", "stop", by="another process")
        else:
            store.acquire("cut", "another process")
        return None  # absence proven

    agent, script, sent = await _cut_transfer_with_lookup(store, lookup)
    with pytest.raises(RunCancelled if meanwhile == "cancelled" else FencedOut):
        await collect(agent, "pay", Session("cut", ScriptedGateway(script), store))
    assert sent == []  # the body did not run a second time
    assert not any(e.step_id == "t0000.tool00" and e.phase != "intent" for e in store.load("cut"))


async def test_every_re_send_of_a_tool_body_is_journaled_before_it_runs(store: Any) -> None:
    sent: list[int] = []
    seen_at_send: list[list[str]] = []

    @tool(lookup=lambda ctx, arguments: None)
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money."""
        if ctx.run_id != "cut":
            return {"ok": True}
        seen_at_send.append([e.phase for e in store.load("cut") if e.step_id == "t0000.tool00"])
        sent.append(ctx.attempt)
        if len(sent) == 1:
            raise ToolError("timed out after sending", error_class=ErrorClass.AMBIGUOUS)
        return {"ok": True}

    agent = Agent(instructions="i", tools=[transfer])
    script = [ScriptedGateway.call("transfer", to="bob", amount=5), ScriptedGateway.text("done")]
    await _run_and_cut_after_the_transfer_intent(agent, store, script)
    sent.clear()
    seen_at_send.clear()
    steps = await collect(agent, "pay", Session("cut", ScriptedGateway(script), store,
                                                retry=RetryPolicy(max_resends=2, base_delay=0.0)))
    assert isinstance(steps[-1], FinalStep)
    # Resume: intent found, lookup says absent -> intent.2, send (ambiguous) -> lookup absent ->
    # intent.3, send (ok). Each send saw its own intent already committed.
    assert seen_at_send == [["intent", "intent.2"], ["intent", "intent.2", "intent.3"]]
    intents = [e for e in store.load("cut") if e.step_id == "t0000.tool00" and e.phase.startswith("intent.")]
    assert [(e.payload["after"], e.payload["effect_key"]) for e in intents] == [
        ("absent", intents[0].payload["effect_key"])] * 2


@pytest.mark.parametrize("found", [{"receipt": "r-1"}, None])
async def test_the_re_send_bound_never_keeps_a_lookup_from_settling_the_step(store: Any, found: Any) -> None:
    """With no re-send allowed (max_resends=0), the lookup is still asked: a receipt it finds
    settles the step; a proven absence stops the run uncertain instead of sending again. Before,
    the bound stopped the run before the lookup was asked."""
    asked: list[str] = []

    def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        asked.append(ctx.effect_key)
        return found

    agent, script, sent = await _cut_transfer_with_lookup(store, lookup)
    session = Session("cut", ScriptedGateway(script), store, retry=RetryPolicy(max_resends=0))
    if found is not None:
        steps = await collect(agent, "pay", session)
        assert isinstance(steps[-1], FinalStep)
        result = next(e for e in store.load("cut") if e.step_id == "t0000.tool00" and e.phase == "result")
        assert result.payload["value"] == found
    else:
        with pytest.raises(UncertainEffect) as info:
            await collect(agent, "pay", session)
        assert info.value.evidence["reason"] == "re-send bound reached"
        assert info.value.evidence["lookup"] == "found no effect"
    assert len(asked) == 1 and sent == []


async def test_intent_without_result_idempotent_is_executed_again(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    script = [ScriptedGateway.call("read_file", path="/y"), ScriptedGateway.text("done")]
    await collect(agent, "read", Session("full", ScriptedGateway(script), store))
    events = store.load("full")
    cut = next(i for i, e in enumerate(events) if e.step_id == "t0000.tool00" and e.phase == "intent") + 1
    _copy_prefix(store, "full", "cut", cut)
    world.reads.clear()
    gw = ScriptedGateway(script)
    steps = await collect(agent, "read", Session("cut", gw, store))
    assert world.reads == ["/y"] and gw.calls == 1 and isinstance(steps[-1], FinalStep)


async def test_policy_deny_is_a_known_outcome_told_to_the_model(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools(), policy=Policy({"transfer": "deny"}, version="p1"))
    gw = ScriptedGateway([ScriptedGateway.call("transfer", to="eve", amount=9), ScriptedGateway.text("ok")])
    steps = await collect(agent, "pay", Session("d", gw, store))
    tool_step = next(s for s in steps if isinstance(s, ToolStep))
    assert tool_step.decision == "deny" and tool_step.outcome == "denied" and world.transfers == []
    told = gw.requests[1].messages[-1]
    assert told["role"] == "tool" and told["content"].startswith("denied") and told["is_error"]
    result = next(e for e in store.load("d") if e.step_id == "t0000.tool00")
    assert result.phase == "result" and result.decision == "deny"
    assert result.payload["policy_version"] == "p1"  # the rules that decided it, as on an intent
    assert store.checkpoint("d").count("tool_denied") == 1


@pytest.mark.parametrize("verdict", ["require-approval", "ALLOW", "", None])
async def test_a_policy_decision_that_is_no_verdict_never_lets_the_tool_run(store: Any, verdict: Any) -> None:
    """Before, PolicyDecision(decision="require-approval") was taken as allow and the tool ran."""
    world = World()
    with pytest.raises(UsageError, match="PolicyDecision.decision must be one of"):
        PolicyDecision(decision=verdict)
    agent = Agent(instructions="i", tools=world.tools(),
                  policy=Policy({"transfer": lambda name, args: PolicyDecision(decision=verdict)}))
    gw = ScriptedGateway([ScriptedGateway.call("transfer", to="eve", amount=9), ScriptedGateway.text("ok")])
    with pytest.raises(UsageError):
        await collect(agent, "pay", Session("typo", gw, store))
    assert world.transfers == []
    assert not any(e.kind == "tool" for e in store.load("typo"))


async def test_approval_suspends_on_disk_and_runs_exactly_once(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools(), policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="bob", amount=100), ScriptedGateway.text("paid")]
    steps = await collect(agent, "pay", Session("a", ScriptedGateway(script), store))
    assert [type(s) for s in steps] == [ModelStep, ToolStep, ApprovalStep]
    pending = steps[-1]
    assert isinstance(pending, ApprovalStep) and pending.status == "pending"
    assert store.checkpoint("a").status == "suspended" and world.transfers == []
    # resuming while still waiting does nothing
    gw = ScriptedGateway(script)
    again = await collect(agent, "pay", Session("a", gw, store))
    assert [type(s) for s in again] == [ApprovalStep] and gw.calls == 0 and world.transfers == []
    with pytest.raises(ApprovalMismatch):
        approve(store, "a", pending.step_id, fingerprint="0" * 64)
    approve(store, "a", pending.tool_step_id, fingerprint=pending.fingerprint, approver="ana")
    with pytest.raises(NotWaitingForApproval):
        approve(store, "a", pending.step_id)
    gw2 = ScriptedGateway(script)
    done = await collect(agent, "pay", Session("a", gw2, store))
    assert isinstance(done[-1], FinalStep) and gw2.calls == 1
    assert len(world.transfers) == 1
    await collect(agent, "pay", Session("a", ScriptedGateway(script), store))
    assert len(world.transfers) == 1
    with pytest.raises(RunClosed):
        approve(store, "a", pending.step_id)


async def test_rejection_is_told_to_the_model(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools(), policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="bob", amount=100), ScriptedGateway.text("not paid")]
    steps = await collect(agent, "pay", Session("rj", ScriptedGateway(script), store))
    deny(store, "rj", steps[-1].step_id, reason="too much")
    gw = ScriptedGateway(script)
    done = await collect(agent, "pay", Session("rj", gw, store))
    tool_step = next(s for s in done if isinstance(s, ToolStep))
    assert tool_step.decision == "rejected" and world.transfers == []
    assert "too much" in gw.requests[0].messages[-1]["content"]


async def test_bad_approvals_are_typed_errors_and_write_nothing(store: Any) -> None:
    with pytest.raises(RunNotFound):
        approve(store, "nope", "t0000.tool00")
    agent = Agent(instructions="i")
    await collect(agent, "t", Session("closed", ScriptedGateway([ScriptedGateway.text("x")]), store))
    n = len(store.load("closed"))
    with pytest.raises(RunClosed):
        approve(store, "closed", "t0000.tool00")
    assert len(store.load("closed")) == n


async def test_invalid_arguments_and_unknown_tools_never_run(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    gw = ScriptedGateway([ScriptedGateway.parallel(("transfer", {"to": "bob", "amount": "lots"}),
                                                   ("rm_rf", {"path": "/"})),
                          ScriptedGateway.text("sorry")])
    steps = await collect(agent, "pay", Session("bad", gw, store))
    tool_steps = [s for s in steps if isinstance(s, ToolStep)]
    assert [s.outcome for s in tool_steps] == ["error", "error"]
    assert all(s.error and s.error["error_class"] == ErrorClass.INVALID_INPUT for s in tool_steps)
    assert world.transfers == []
    assert store.checkpoint("bad").count("repairs") == 2


async def test_changed_instructions_or_task_diverge(store: Any) -> None:
    agent = Agent(instructions="v1", tools=World().tools(), policy=Policy({"transfer": "require_approval"}))
    script = [ScriptedGateway.call("transfer", to="bob", amount=1), ScriptedGateway.text("x")]
    await collect(agent, "pay", Session("v", ScriptedGateway(script), store))
    other = Agent(instructions="v2", tools=World().tools(), policy=Policy({"transfer": "require_approval"}))
    with pytest.raises(VersionMismatch):
        await collect(other, "pay", Session("v", ScriptedGateway(script), store))
    with pytest.raises(ReplayDivergence):
        await collect(other, "pay", Session("v", ScriptedGateway(script), store, on_version_mismatch="resume"))
    with pytest.raises(ReplayDivergence):
        await collect(agent, "another task", Session("v", ScriptedGateway(script), store))


async def test_stripe_semantics_of_the_scripted_gateway() -> None:
    gw = ScriptedGateway([ScriptedGateway.text("a")], stripe=True)
    req = ModelRequest(instructions="i", messages=({"role": "user", "content": "x"},))
    first = await gw.complete(req, idempotency_key="k")
    again = await gw.complete(req, idempotency_key="k")
    assert first == again and gw.billed == 1 and gw.replayed == 1
    other = ModelRequest(instructions="changed", messages=req.messages)
    with pytest.raises(IdempotencyKeyReuse):
        await gw.complete(other, idempotency_key="k")


async def test_fencing_stops_the_older_owner(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    script = [ScriptedGateway.call("read_file", path="/a"), ScriptedGateway.text("done")]
    first = agent.run("t", session=Session("f", ScriptedGateway(script), store))
    step = await first.__anext__()  # owner 1 is mid-run
    assert isinstance(step, ModelStep)
    store.acquire("f", "someone-else")  # another process takes the run over
    with pytest.raises(FencedOut):
        async for _ in first:
            pass


async def test_two_loops_of_one_process_never_run_one_step_twice(store: Any) -> None:
    """A double click on "resume": while one task's tool body is in flight, another task of the
    same process resuming the same run is refused, instead of finding the step's intent without
    a result and sending it again."""
    inside, release = asyncio.Event(), asyncio.Event()
    sent: list[str] = []

    @tool
    async def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money."""
        inside.set()
        await release.wait()
        sent.append(ctx.effect_key)
        return {"ok": True}

    agent = Agent(instructions="i", tools=[transfer])
    script = [ScriptedGateway.call("transfer", to="bob", amount=5), ScriptedGateway.text("done")]
    first = asyncio.ensure_future(collect(agent, "pay", Session("r", ScriptedGateway(script), store)))
    await inside.wait()
    gw = ScriptedGateway(script)
    with pytest.raises(RunBusy):
        await collect(agent, "pay", Session("r", gw, store))
    assert gw.calls == 0 and sent == []
    release.set()
    assert isinstance((await first)[-1], FinalStep)
    steps = await collect(agent, "pay", Session("r", gw, store))  # the first loop let go of the run
    assert isinstance(steps[-1], FinalStep) and steps[-1].replayed and gw.calls == 0 and len(sent) == 1


async def test_a_loop_paused_at_a_yielded_step_can_be_taken_over_in_the_same_process(store: Any) -> None:
    """A caller that stops iterating does not lock the run: another loop of the process takes it
    over at once. The transfer's result, still waiting for the next commit, is committed first,
    so the new holder replays it instead of calling it uncertain, and the old loop stops."""
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    script = [ScriptedGateway.call("transfer", to="bob", amount=5), ScriptedGateway.text("done")]
    first = agent.run("t", session=Session("p", ScriptedGateway(script), store))
    assert isinstance(await first.__anext__(), ModelStep)  # the transfer ran; its result is not yet committed
    assert len(world.transfers) == 1
    gw = ScriptedGateway(script)
    steps = await collect(agent, "t", Session("p", gw, store))
    assert isinstance(steps[-1], FinalStep) and len(world.transfers) == 1 and gw.calls == 1
    with pytest.raises(FencedOut):
        async for _ in first:  # the old loop lost the run: it stops before doing anything
            pass
    assert len(world.transfers) == 1 and store.checkpoint("p").status == "completed"


class Killed(BaseException):
    """Stands in for SIGKILL inside a tool body: nothing after it runs, no result is journaled."""


async def test_a_re_send_after_a_resolution_that_ends_unknown_is_not_sent_again(store: Any) -> None:
    sent: list[int] = []
    crash_in_body = [False]

    @tool
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money."""
        if ctx.run_id == "cut":
            sent.append(ctx.attempt)
            if crash_in_body[0]:
                raise Killed  # the receiver took it; the process died before the result
        return {"ok": True}

    agent = Agent(instructions="i", tools=[transfer])
    script = [ScriptedGateway.call("transfer", to="bob", amount=5), ScriptedGateway.text("done")]
    await _run_and_cut_after_the_transfer_intent(agent, store, script)
    with pytest.raises(UncertainEffect):
        await collect(agent, "pay", Session("cut", ScriptedGateway(script), store))
    resolve(store, "cut", "t0000.tool00", happened=False, by="ops")  # the first send did not happen
    crash_in_body[0] = True
    with pytest.raises(Killed):
        await collect(agent, "pay", Session("cut", ScriptedGateway(script), store))
    assert sent == [2]
    crash_in_body[0] = False
    with pytest.raises(UncertainEffect):  # that re-send's fate is unknown: asked, never re-sent blindly
        await collect(agent, "pay", Session("cut", ScriptedGateway(script), store))
    assert sent == [2]
    resolve(store, "cut", "t0000.tool00", happened=False, by="ops")  # settled again, as its own event
    steps = await collect(agent, "pay", Session("cut", ScriptedGateway(script), store))
    assert isinstance(steps[-1], FinalStep) and sent == [2, 2]
    phases = [e.phase for e in store.load("cut") if e.step_id == "t0000.tool00"]
    assert phases == ["intent", "uncertain", "resolution", "intent.2", "uncertain.2", "resolution.2", "intent.3",
                      "result"]


async def test_a_failed_takeover_leaves_the_paused_loop_its_run(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    script = [ScriptedGateway.call("read_file", path="/a"), ScriptedGateway.text("done")]
    first = agent.run("t", session=Session("p", ScriptedGateway(script), store))
    assert isinstance(await first.__anext__(), ModelStep)
    with pytest.raises(ReplayDivergence):  # another task: refused before it took the run over
        await collect(agent, "another task", Session("p", ScriptedGateway(script), store))
    rest = [step async for step in first]
    assert isinstance(rest[-1], FinalStep) and world.reads == ["/a"]


class Flaky:
    """Fails with the given errors first, then answers."""

    def __init__(self, errors: list[GatewayError]) -> None:
        self.errors = errors
        self.calls = 0
        self.keys: list[str] = []

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        self.calls += 1
        self.keys.append(idempotency_key)
        if self.errors:
            raise self.errors.pop(0)
        return ScriptedGateway.text("ok", cost=0.01)


async def test_transient_errors_retry_with_the_same_key_and_are_counted(store: Any) -> None:
    waits: list[float] = []

    async def sleep(s: float) -> None:
        waits.append(s)

    gw = Flaky([GatewayError("429", error_class=ErrorClass.TRANSIENT, sent=True, retry_after=2.0),
                GatewayError("refused", error_class=ErrorClass.TRANSIENT, sent=False)])
    steps = await collect(Agent(instructions="i"), "t", Session("tr", gw, store, sleep=sleep, seed=1))
    assert isinstance(steps[-1], FinalStep) and gw.calls == 3 and len(set(gw.keys)) == 1
    assert waits[0] == 2.0 and 0 <= waits[1] <= 1.0
    cp = store.checkpoint("tr")
    assert cp.count("retries") == 2 and cp.count("possibly_billed_twice") == 0


async def test_ambiguous_errors_resend_once_and_count_possibly_billed_twice(store: Any) -> None:
    async def sleep(s: float) -> None:
        pass

    gw = Flaky([GatewayError("timeout after send", error_class=ErrorClass.AMBIGUOUS, sent=True)])
    await collect(Agent(instructions="i"), "t", Session("amb", gw, store, sleep=sleep))
    cp = store.checkpoint("amb")
    assert gw.calls == 2 and len(set(gw.keys)) == 1 and cp.count("possibly_billed_twice") == 1


async def test_permanent_errors_stop_without_retry_and_leave_the_run_resumable(store: Any) -> None:
    gw = Flaky([GatewayError("bad key", error_class=ErrorClass.PERMANENT, sent=True, status=401)])
    with pytest.raises(GatewayError):
        await collect(Agent(instructions="i"), "t", Session("perm", gw, store, retry=RetryPolicy(max_retries=5)))
    assert gw.calls == 1
    assert store.checkpoint("perm").status == "running"
    steps = await collect(Agent(instructions="i"), "t", Session("perm", gw, store))
    assert isinstance(steps[-1], FinalStep)
    assert store.checkpoint("perm").count("possibly_billed_twice") == 0  # the failure was journaled as known


async def test_a_tool_name_the_journal_cannot_hold_is_refused_not_crashed(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    gw = ScriptedGateway([ScriptedGateway.parallel(("x" * 5000, {}), ("a\x00b", {}), ("\ud800", {})),
                          ScriptedGateway.text("ok")])
    steps = await collect(agent, "t", Session("names", gw, store))
    tool_steps = [s for s in steps if isinstance(s, ToolStep)]
    assert [s.outcome for s in tool_steps] == ["error"] * 3
    assert all(s.tool.startswith("invalid-name-") for s in tool_steps)
    again = await collect(agent, "t", Session("names", ScriptedGateway([]), store))
    assert again[-1].replayed


async def test_stopping_iteration_keeps_the_results_of_steps_that_happened(store: Any) -> None:
    world = World()
    agent = Agent(instructions="i", tools=world.tools())
    script = [ScriptedGateway.call("transfer", to="bob", amount=3), ScriptedGateway.text("done")]
    gen = agent.run("pay", session=Session("stop", ScriptedGateway(script), store))
    async for step in gen:
        if isinstance(step, ModelStep):
            break  # the transfer already ran; its result waits for the next commit
    await gen.aclose()
    assert len(world.transfers) == 1
    gw = ScriptedGateway(script)
    steps = await collect(agent, "pay", Session("stop", gw, store))  # no UncertainEffect: the result was kept
    assert isinstance(steps[-1], FinalStep) and len(world.transfers) == 1 and gw.calls == 1


async def test_a_failed_strong_tier_keeps_the_cheap_call_in_the_accounting(store: Any) -> None:
    from cuaderno import TieredGateway

    class Down:
        calls = 0

        async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
            Down.calls += 1
            raise GatewayError("503", error_class=ErrorClass.TRANSIENT, sent=True)

    async def sleep(s: float) -> None:
        pass

    cheap = ScriptedGateway([ScriptedGateway.empty()])
    tiered = TieredGateway(cheap, Down())
    with pytest.raises(GatewayError):
        await collect(Agent(instructions="i"), "t", Session("tier", tiered, store, sleep=sleep,
                                                               retry=RetryPolicy(max_retries=2)))
    cp = store.checkpoint("tier")
    assert cheap.calls == 1 and Down.calls == 3  # retries go to the strong tier, never back to the cheap one
    assert cp.count("escalations") == 1 and cp.count("unpriced_calls") == 1 and cp.count("retries") == 2


# -- replay from every prefix -------------------------------------------------------------------------


def _sweep_script() -> Any:
    """A run through every kind of turn replay must rebuild: two reads in one turn, an empty
    response (rejected, and asked again), a call whose arguments did not parse, a denied call, a
    transfer, then the answer. Returns a factory of gateways told whether the empty response was
    already given (it is given once per run, so a resume past it must not see it again)."""
    broken = ModelResponse(tool_calls=(ToolCall(id="c_bad", name="read_file", arguments={},
                                                arguments_error="not JSON", raw_arguments='{"path": '),),
                           finish_reason="tool_calls")
    turns = [ScriptedGateway.parallel(("read_file", {"path": "/a"}), ("read_file", {"path": "/b"})),
             broken,
             ScriptedGateway.call("delete", path="/a"),
             ScriptedGateway.call("transfer", to="bob", amount=3),
             ScriptedGateway.text("done")]

    def gateway(empty_given: bool) -> ScriptedGateway:
        state = {"empty_given": empty_given}

        def answer(request: ModelRequest) -> ModelResponse:
            turn = sum(1 for m in request.messages if m.get("role") == "assistant")
            if turn == 1 and not state["empty_given"]:
                state["empty_given"] = True
                return ScriptedGateway.empty()
            return turns[turn]

        return ScriptedGateway(answer)

    return gateway


@pytest.mark.parametrize("verify_replay", [False, True])
async def test_a_resume_from_every_prefix_sends_what_the_uninterrupted_run_sent(store: Any,
                                                                                  verify_replay: bool) -> None:
    """Cut a finished run after each of its events and resume the copy: whatever the cut, the
    resumed process sends exactly the requests the uninterrupted run sent from there on (so the
    conversation it rebuilt from the journal is the same, message for message), runs only the
    tools whose results were not journaled, and never runs the transfer twice."""
    world = World()

    @tool
    def delete(path: str) -> str:
        """Delete a file."""
        raise AssertionError("denied by policy: never runs")

    agent = Agent(instructions="i", tools=[*world.tools(), delete], policy=Policy({"delete": "deny"}))
    gateway = _sweep_script()
    full_gw = gateway(False)
    steps = await collect(agent, "go", Session("full", full_gw, store, verify_replay=verify_replay))
    assert isinstance(steps[-1], FinalStep) and steps[-1].output == "done"
    assert world.reads == ["/a", "/b"] and len(world.transfers) == 1
    assert store.checkpoint("full").count("rejected_responses") == 1
    sent = [fingerprint(r.body()) for r in full_gw.requests]
    assert len(sent) == 6 and sent[1] == sent[2]  # the empty response's request is asked again as it was
    events = store.load("full")
    outcomes = {"completed": 0, "uncertain": 0}
    for cut in range(1, len(events)):
        run = f"cut{cut}"
        _copy_prefix(store, "full", run, cut)
        prefix = events[:cut]
        results = {e.step_id for e in prefix if e.phase == "result"}
        empty_given = any(e.kind == "model" and e.phase == "result" and e.payload.get("verdict", {}).get("outcome")
                          not in (None, "ok") for e in prefix)
        world.reads.clear()
        world.transfers.clear()
        gw = gateway(empty_given)
        transfer_started = any(e.step_id == "t0004.tool00" and e.phase == "intent" for e in prefix)
        if transfer_started and "t0004.tool00" not in results:
            with pytest.raises(UncertainEffect):  # intent without result: never guessed, never run again
                await collect(agent, "go", Session(run, gw, store, verify_replay=verify_replay))
            assert gw.calls == 0 and world.transfers == []
            outcomes["uncertain"] += 1
            continue
        steps = await collect(agent, "go", Session(run, gw, store, verify_replay=verify_replay))
        assert isinstance(steps[-1], FinalStep) and steps[-1].output == "done", f"cut after event {cut}"
        resent = [fingerprint(r.body()) for r in gw.requests]
        assert resent == sent[len(sent) - len(resent):], f"cut after event {cut}: another conversation was sent"
        assert len(resent) == 6 - sum(1 for e in prefix if e.kind == "model" and e.phase == "result")
        assert world.reads == [p for p, step in (("/a", "t0000.tool00"), ("/b", "t0000.tool01"))
                               if step not in results], f"cut after event {cut}"
        assert len(world.transfers) == (0 if "t0004.tool00" in results else 1), f"cut after event {cut}"
        final = [(e.step_id, e.phase, e.fingerprint) for e in store.load(run) if e.phase == "result"]
        assert final == [(e.step_id, e.phase, e.fingerprint) for e in events if e.phase == "result"]
        outcomes["completed"] += 1
    assert outcomes["uncertain"] >= 1 and outcomes["completed"] >= len(events) - 3


def test_the_assistant_message_is_built_from_the_journaled_response() -> None:
    """A made call and its replay add the same message because both build it from the journaled
    form: what the message shows is exactly what the journal holds."""
    good = ToolCall(id="c1", name="read_file", arguments={"path": "/x"})
    broken = ToolCall(id="c2", name="read_file", arguments={}, arguments_error="not JSON", raw_arguments="{bad")
    # A gateway that keeps raw text without saying it failed to parse: not journaled, so not shown.
    stray = ToolCall(id="c3", name="read_file", arguments={"path": "/y"}, raw_arguments='{"path": "/y"}')
    response = ModelResponse(text="let me look", tool_calls=(good, broken, stray), finish_reason="tool_calls")
    message = response.assistant_message()
    assert message == assistant_message(ModelResponse.from_json(response.to_json()).to_json())
    assert message == {"role": "assistant", "content": "let me look", "tool_calls": [
        {"id": "c1", "name": "read_file", "arguments": {"path": "/x"}},
        {"id": "c2", "name": "read_file", "arguments": {}, "raw_arguments": "{bad"},
        {"id": "c3", "name": "read_file", "arguments": {"path": "/y"}}]}
    assert ModelResponse().assistant_message() == {"role": "assistant", "content": ""}
