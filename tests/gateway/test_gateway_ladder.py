"""The empty-generation ladder (issue 25): each rung, its journal record, its key, its bounds."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest

from cuaderno import Agent, Budgets, MemoryCheckpointer, ScriptedGateway, Session, TieredGateway, tool
from cuaderno.errors import BudgetExceeded, LadderExhausted, RunClosed, UsageError
from cuaderno.gateway.base import ModelRequest, ModelResponse
from cuaderno.gateway.ladder import (
    DEFAULT_LADDER,
    Escalate,
    Exhausted,
    FittingTools,
    Ladder,
    NamedTool,
    Plan,
    RelaxToolChoice,
    Resend,
    keyword_fit,
)
from cuaderno.loop.steps import FinalStep, ModelStep

TIERS = ("cheap", "strong")


def schema(name: str) -> dict[str, Any]:
    return {"name": name, "description": "", "parameters": {"type": "object", "properties": {}}}


REQ = ModelRequest(instructions="i", messages=({"role": "user", "content": "What is the weather in Lima?"},),
                   tools=(schema("get_weather"), schema("get_time"), schema("translate_text")))


def plan(ladder: Ladder, request: ModelRequest = REQ, start: int = 0, tiers: tuple[str, ...] = TIERS) -> Plan:
    out = ladder.plan(request, start, tiers)
    assert isinstance(out, Plan), out
    return out


# -- each rung, as a pure function of the original request ------------------------------------------


def test_keyword_fit_reads_the_last_user_message() -> None:
    assert keyword_fit(REQ) == ["get_weather"]
    two = ModelRequest(instructions="i", messages=({"role": "user", "content": "the weather and the time?"},),
                       tools=REQ.tools)
    assert keyword_fit(two) == ["get_weather", "get_time"]
    stem = ModelRequest(instructions="i", messages=({"role": "user", "content": "a translation, please"},),
                        tools=REQ.tools)
    assert keyword_fit(stem) == ["translate_text"]  # five-letter stem
    assert keyword_fit(ModelRequest(instructions="i", messages=({"role": "user", "content": "get it"},),
                                    tools=REQ.tools)) == []  # generic parts never match


def test_resend_is_the_same_request_to_the_same_tier() -> None:
    p = plan(Ladder((Resend(),)))
    assert p.request == REQ and p.tier == "cheap" and p.position == 1 and p.rung == "resend"
    assert dict(p.counters) == {"ladder_rungs": 1}


def test_fitting_tools_keeps_only_the_tools_the_task_can_use() -> None:
    p = plan(Ladder((FittingTools(),)))
    assert [t["name"] for t in p.request.tools] == ["get_weather"] and not p.request.require_tool
    assert p.request.messages == REQ.messages and p.tier == "cheap"


def test_relax_turns_required_into_auto() -> None:
    p = plan(Ladder((RelaxToolChoice(),)), ModelRequest(instructions="i", messages=REQ.messages, tools=REQ.tools,
                                                        require_tool=True))
    assert p.request.require_tool is False and p.request.tools == REQ.tools


def test_named_tool_names_the_one_tool_that_fits() -> None:
    p = plan(Ladder((NamedTool(),)))
    assert [t["name"] for t in p.request.tools] == ["get_weather"] and p.request.require_tool is True


def test_escalate_goes_to_the_last_tier_and_counts_an_escalation() -> None:
    p = plan(Ladder((Escalate(),)))
    assert p.request == REQ and p.tier == "strong"
    assert dict(p.counters) == {"ladder_rungs": 1, "escalations": 1}


def test_a_changed_body_gets_a_new_key_basis() -> None:
    fp = "f" * 64
    keys = {plan(Ladder((r,))).keyed(fp) for r in (Resend(), FittingTools(), NamedTool(), Escalate())}
    assert len(keys) == 4 and fp not in keys  # even a re-send is a rung of its own
    assert Plan(request=REQ, tier="cheap").keyed(fp) == fp  # the original keeps its key


# -- bad input: loops, refusals, rungs that do not apply ---------------------------------------------


def test_a_rung_identical_to_the_original_is_skipped_and_counted() -> None:
    # Not required already: relaxing changes nothing; every tool fits: narrowing changes nothing.
    everything = ModelRequest(instructions="i", messages=({"role": "user", "content": "weather time translate"},),
                              tools=REQ.tools)
    p = plan(Ladder((RelaxToolChoice(), FittingTools(), Escalate())), everything)
    assert p.rung == "escalate" and p.position == 3
    assert [s["rung"] for s in p.skipped] == ["relax_tool_choice", "fitting_tools"]
    assert all("identical" in s["why"] and not s["refused"] for s in p.skipped)
    assert dict(p.counters) == {"ladder_rungs": 1, "rungs_skipped": 2, "escalations": 1}


def test_a_rung_identical_to_one_already_sent_is_skipped() -> None:
    ladder = Ladder((NamedTool(), NamedTool(), Escalate()))
    assert plan(ladder).rung == "named_tool"
    second = plan(ladder, start=1)  # after the first named rung was sent and rejected
    assert second.rung == "escalate" and second.skipped[0]["position"] == 2


def test_a_rung_that_removes_every_needed_tool_is_refused() -> None:
    nothing = ModelRequest(instructions="i", messages=({"role": "user", "content": "hello"},), tools=REQ.tools)
    p = plan(Ladder((FittingTools(), NamedTool(), Resend())), nothing)
    assert p.rung == "resend"
    assert [s["refused"] for s in p.skipped] == [True, True]
    assert "every tool the task needs" in p.skipped[0]["why"]
    assert dict(p.counters) == {"ladder_rungs": 1, "rungs_refused": 2}


def test_rungs_that_do_not_apply_are_skipped() -> None:
    two = ModelRequest(instructions="i", messages=({"role": "user", "content": "weather and time"},),
                       tools=REQ.tools)
    out = Ladder((NamedTool(), Escalate())).plan(two, 0, ("only",))
    assert isinstance(out, Exhausted)
    assert [s["why"] for s in out.skipped] == ["2 tools fit, a named choice needs one", "no stronger tier to escalate to"]
    no_tools = ModelRequest(instructions="i", messages=REQ.messages)
    assert isinstance(Ladder((FittingTools(), NamedTool())).plan(no_tools, 0, TIERS), Exhausted)


def test_an_empty_ladder_is_exhausted_at_once() -> None:
    assert Ladder(()).plan(REQ, 0, TIERS) == Exhausted(())


def test_bad_ladders_are_refused() -> None:
    with pytest.raises(UsageError, match="not a ladder rung"):
        Ladder((object(),))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="rejected outcomes"):
        Ladder((Resend(),), on=frozenset({"ok"}))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="ladder must be a Ladder"):
        TieredGateway(ScriptedGateway([]), ScriptedGateway([]), ladder=[Resend()])  # type: ignore[arg-type]


def test_ladder_exhausted_is_a_budget_error_that_pickles() -> None:
    err = LadderExhausted("r1", ["named_tool", "escalate"], [{"rung": "named_tool", "why": "x"}])
    assert isinstance(err, BudgetExceeded) and err.budget == "ladder" and err.limit == 2
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is LadderExhausted and back.rungs == err.rungs and back.skipped == err.skipped
    assert str(back) == str(err) and "ladder_exhausted" in str(err)


# -- the loop climbs it: journaled steps, keys, counters, bounds, replay -------------------------------


@tool(idempotent=True)
def get_weather(city: str) -> str:
    """Weather."""
    return f"sunny in {city}"


@tool(idempotent=True)
def get_time(city: str) -> str:
    """Time."""
    return "12:00"


AGENT = Agent(instructions="i", tools=[get_weather, get_time])
TASK = "What is the weather in Lima?"


def only_when(test: Callable[[ModelRequest], bool]) -> Callable[[ModelRequest], ModelResponse]:
    """A model that answers with a call when ``test(request)``, else with an empty 200."""

    def answer(request: ModelRequest) -> ModelResponse:
        if any(m.get("role") == "tool" for m in request.messages):
            return ScriptedGateway.text("done")
        return ScriptedGateway.call("get_weather", city="Lima") if test(request) else ScriptedGateway.empty()

    return answer


def named(request: ModelRequest) -> bool:
    return request.require_tool and len(request.tools) == 1


async def run(agent: Agent, gateway: Any, store: Any, run_id: str = "r") -> list[Any]:
    return [s async for s in agent.run(TASK, session=Session(run_id, gateway, store))]


def model_events(store: Any, run_id: str = "r") -> list[Any]:
    return [e for e in store.load(run_id) if e.kind == "model"]


async def test_the_loop_climbs_to_the_named_rung_and_journals_each_step() -> None:
    store = MemoryCheckpointer()
    cheap, strong = ScriptedGateway(only_when(named)), ScriptedGateway(only_when(lambda r: True))
    gw = TieredGateway(cheap, strong, ladder=Ladder((Resend(), NamedTool(), Escalate())))
    steps = await run(AGENT, gw, store)
    assert isinstance(steps[-1], FinalStep) and steps[-1].output == "done"
    # original (empty), re-send (empty), named (a call), then the answer after the tool result
    assert cheap.calls == 4 and strong.calls == 0 and gw.calls == {"cheap": 4, "strong": 0}
    assert [len(r.tools) for r in cheap.requests[:3]] == [2, 2, 1] and cheap.requests[2].require_tool
    assert len(set(cheap.keys)) == 4  # every rung a new key
    intents = [e for e in model_events(store) if e.phase == "intent"]
    assert "rung" not in intents[0].payload  # the original request is journaled as without a ladder
    assert [e.payload["rung"]["rung"] for e in intents[1:3]] == ["resend", "named_tool"]
    assert intents[2].payload["rung"]["tools"] == ["get_weather"] and intents[2].payload["rung"]["require_tool"]
    cp = store.checkpoint("r")
    assert cp is not None and cp.status == "completed"
    assert cp.count("ladder_rungs") == 2 and cp.count("rejected_responses") == 2 and cp.count("escalations") == 0
    assert cp.count("model_sends") == cheap.calls
    # A closed run replays nothing: no call to either tier.
    cheap2, strong2 = ScriptedGateway(only_when(named)), ScriptedGateway(only_when(lambda r: True))
    again = await run(AGENT, TieredGateway(cheap2, strong2), store)
    assert again[-1].replayed and cheap2.calls == strong2.calls == 0


async def test_escalation_rung_is_a_step_of_its_own_on_the_strong_tier() -> None:
    store = MemoryCheckpointer()
    cheap, strong = ScriptedGateway(only_when(lambda r: False)), ScriptedGateway(only_when(lambda r: True))
    gw = TieredGateway(cheap, strong, ladder=Ladder((Escalate(),)))
    await run(AGENT, gw, store)
    assert strong.calls == 1 and strong.requests[0].model is None and strong.keys[0] not in cheap.keys
    cp = store.checkpoint("r")
    assert cp is not None and cp.count("escalations") == 1 and gw.escalations == 1
    result = next(e for e in model_events(store) if e.step_id == "t0001.model" and e.phase == "result")
    assert result.payload["response"]["tier"] == "strong" and result.payload["rung"] == 1


async def test_every_rung_empty_ends_the_run_with_ladder_exhausted() -> None:
    store = MemoryCheckpointer()
    cheap, strong = ScriptedGateway(only_when(lambda r: False)), ScriptedGateway(only_when(lambda r: False))
    gw = TieredGateway(cheap, strong, ladder=Ladder((NamedTool(), RelaxToolChoice(), Escalate())))
    with pytest.raises(LadderExhausted) as info:
        await run(AGENT, gw, store)
    assert info.value.rungs == ["named_tool", "relax_tool_choice", "escalate"]
    assert cheap.calls == 2 and strong.calls == 1  # original, named, (relax: identical, skipped), escalate
    cp = store.checkpoint("r")
    assert cp is not None and cp.status == "failed" and cp.outcome is not None
    assert cp.outcome["reason"] == "ladder_exhausted" and cp.outcome["budget"] == "ladder"
    assert cp.count("rejected_responses") == 3 and cp.count("rungs_skipped") == 1
    with pytest.raises(RunClosed):  # ended for good: a resume makes no call
        await run(AGENT, gw, store)
    assert cheap.calls == 2 and strong.calls == 1


async def test_no_recovery_ends_at_the_first_empty_answer() -> None:
    store = MemoryCheckpointer()
    cheap = ScriptedGateway(only_when(lambda r: False))
    with pytest.raises(LadderExhausted):
        await run(AGENT, TieredGateway(cheap, ScriptedGateway([]), ladder=Ladder(())), store)
    assert cheap.calls == 1


async def test_the_rejected_response_cap_bounds_a_long_ladder() -> None:
    store = MemoryCheckpointer()
    cheap = ScriptedGateway(only_when(lambda r: False))
    agent = Agent(instructions="i", tools=[get_weather, get_time], budgets=Budgets(rejected_responses=2))
    gw = TieredGateway(cheap, ScriptedGateway([]), ladder=Ladder(tuple(Resend() for _ in range(10))))
    with pytest.raises(BudgetExceeded) as info:
        await run(agent, gw, store)
    assert not isinstance(info.value, LadderExhausted) and info.value.budget == "rejected_responses"
    assert cheap.calls == 3  # the cap (2) is exceeded at the third rejected answer, never a fourth call


async def test_a_refused_rung_is_journaled_on_the_next_step() -> None:
    store = MemoryCheckpointer()
    cheap, strong = ScriptedGateway(only_when(lambda r: False)), ScriptedGateway(only_when(lambda r: True))
    gw = TieredGateway(cheap, strong, ladder=Ladder((NamedTool(), Escalate())))
    steps = [s async for s in AGENT.run("hello there", session=Session("r", gw, store))]
    assert isinstance(steps[-1], FinalStep)
    intent = next(e for e in model_events(store) if e.step_id == "t0001.model" and e.phase == "intent")
    assert intent.payload["rung"]["rung"] == "escalate"
    assert intent.payload["rung"]["skipped"][0]["refused"] is True
    cp = store.checkpoint("r")
    assert cp is not None and cp.count("rungs_refused") == 1 and cp.count("escalations") == 1


async def test_without_a_route_the_tiered_gateway_still_escalates_in_step() -> None:
    cheap, strong = ScriptedGateway([ScriptedGateway.empty()]), ScriptedGateway([ScriptedGateway.text("ok")])
    gw = TieredGateway(cheap, strong)
    resp = await gw.complete(REQ, idempotency_key="k")
    assert resp.tier == "strong" and len(resp.escalations) == 1


async def test_a_ladder_off_leaves_the_loop_as_before() -> None:
    store = MemoryCheckpointer()
    cheap, strong = ScriptedGateway(only_when(lambda r: False)), ScriptedGateway(only_when(lambda r: True))
    await run(AGENT, TieredGateway(cheap, strong, ladder=None), store)
    assert all("rung" not in e.payload for e in model_events(store))
    cp = store.checkpoint("r")
    assert cp is not None and cp.count("rejected_responses") == 0 and cp.count("escalations") == 1


def test_the_default_ladder() -> None:
    assert DEFAULT_LADDER.names == ("named_tool", "escalate")
    assert TieredGateway(ScriptedGateway([]), ScriptedGateway([])).ladder is DEFAULT_LADDER


async def test_steps_are_yielded_for_every_rung() -> None:
    store = MemoryCheckpointer()
    cheap = ScriptedGateway(only_when(named))
    steps = await run(AGENT, TieredGateway(cheap, ScriptedGateway([]), ladder=Ladder((NamedTool(),))), store)
    models = [s for s in steps if isinstance(s, ModelStep)]
    assert [bool(s.response.tool_calls) for s in models[:2]] == [False, True]
