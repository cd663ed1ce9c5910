"""DurableAgent in one process, through the agent's real OpenAI client against a loopback provider
that bills every request: what is journaled, what is sent again, what is refused."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from cuaderno import PriceTable, RetryPolicy, SqliteCheckpointer
from cuaderno.errors import ErrorClass, GatewayError, ReplayDivergence, UsageError, VersionMismatch
from cuaderno.integrations.pydantic_ai import DurableAgent, Lookup

sys.path.insert(0, str(Path(__file__).parent))
from _program import Deps, Paid, build_agent, effects
from _runner_end import held, runner_end
from _servers import Provider, Receipts
from _spans_seen import span_names

PROMPT = 'PAY: [["transfer", "ana", 10], ["transfer", "bob", 20]]'


@dataclass
class World:
    tmp: Path
    provider: Provider
    receipts: Receipts
    name: str

    def billed(self) -> list[dict[str, Any]]:
        return self.provider.billing(self.name)

    def paid(self) -> list[dict[str, Any]]:
        return self.receipts.receipts(self.name)


@pytest.fixture
def world(tmp_path: Path, servers: tuple[Provider, Receipts], request: pytest.FixtureRequest) -> World:
    return World(tmp_path, *servers, name=request.node.name.replace("[", "-").replace("]", ""))


def _run(w: World, run_id: str = "r1", prompt: str = PROMPT, retry: RetryPolicy | None = None,
         prices: PriceTable | None = None, **kwargs: Any) -> Any:
    async def go() -> Any:
        receipts = w.receipts.base_url(w.name)
        async with httpx.AsyncClient() as http:
            with SqliteCheckpointer(w.tmp / "runs.db") as store:
                durable = DurableAgent(build_agent(w.provider.base_url(w.name)), journal=store,
                                       effects=effects("lookup", receipts, http), retry=retry, prices=prices)
                return await durable.run(prompt, run_id=run_id, deps=Deps(receipts, http), **kwargs)

    return asyncio.run(go())


def test_a_run_completes_with_structured_output_and_every_request_carries_its_journaled_key(world: World) -> None:
    result = _run(world)
    assert result.status == "completed" and not result.replayed
    assert isinstance(result.output, Paid) and result.output == Paid(paid=["ana", "bob"], total=30)
    billed = world.billed()
    assert len(billed) == 3  # two tool turns and the output
    with SqliteCheckpointer(world.tmp / "runs.db", readonly=True) as store:
        events = store.load("r1")
        cp = store.checkpoint("r1")
    keys = [e.payload["key"] for e in events if e.kind == "model" and e.phase == "intent"]
    # The provider saw the journal's key in both headers, once per step: the real HTTP path.
    assert [b["key"] for b in billed] == keys and [b["x_key"] for b in billed] == keys
    assert len(set(keys)) == 3
    assert cp is not None and cp.status == "completed"
    assert [r["to"] for r in world.paid()] == ["ana", "bob"]
    effect_keys = [e.payload["effect_key"] for e in events if e.kind == "tool" and e.phase == "intent"]
    assert [r["key"] for r in world.paid()] == effect_keys


def test_each_step_is_priced_with_the_prices_given_and_unpriced_otherwise(world: World) -> None:
    """The run's cost is what ``cuaderno show`` and the cost counters read: each answered step
    priced once (10 input and 5 output tokens a step, at 1 and 2 USD per million), and a model
    the prices do not know is counted unpriced, never as free."""
    _run(world, run_id="priced", prices=PriceTable({"fake-model": {"input": 1.0, "output": 2.0}}))
    _run(world, run_id="unknown", prices=PriceTable({"another-model": {"input": 1.0, "output": 2.0}}))
    with SqliteCheckpointer(world.tmp / "runs.db", readonly=True) as store:
        priced, unknown = store.checkpoint("priced"), store.checkpoint("unknown")
    assert priced is not None and unknown is not None
    assert priced.cost_usd == pytest.approx(3 * (10 * 1.0 + 5 * 2.0) / 1e6)
    assert priced.counters.get("calls_paid") == 3 and not priced.counters.get("unpriced_calls")
    assert unknown.cost_usd == 0 and unknown.counters.get("unpriced_calls") == 3


def test_each_send_and_each_tool_body_is_a_span_and_a_replay_is_none(world: World,
                                                                      spans: InMemorySpanExporter) -> None:
    _run(world, run_id="traced")
    names = span_names(spans)
    assert [step for name, step in names if name == "chat fake-model"] == ["t0000.model", "t0001.model", "t0002.model"]
    assert sorted(name for name, _ in names if name.startswith("execute_tool")) == ["execute_tool transfer"] * 2
    chat = next(s for s in spans.get_finished_spans() if s.name == "chat fake-model")
    attributes = chat.attributes or {}
    assert attributes["gen_ai.provider.name"] == "openai" and attributes["gen_ai.usage.input_tokens"] == 10
    spans.clear()
    assert _run(world, run_id="traced").replayed and span_names(spans) == []


def test_a_closed_run_answers_from_its_journal_and_sends_nothing(world: World) -> None:
    first = _run(world)
    again = _run(world)
    assert again.replayed and again.status == "completed" and again.output == first.output
    assert [type(m).__name__ for m in again.messages] == [type(m).__name__ for m in first.messages]
    assert len(world.billed()) == 3 and len(world.paid()) == 2


def test_message_history_continues_a_conversation_and_is_part_of_the_task(world: World) -> None:
    first = _run(world, run_id="turn1")
    second = _run(world, run_id="turn2", prompt='PAY: [["transfer", "cy", 5]]',
                  message_history=first.messages)
    assert second.status == "completed"
    # The provider scripts from the first PAY it finds: the history was sent (ana and bob again
    # is what this fake answers for a conversation that starts with them).
    assert second.output.paid == ["ana", "bob"]
    with pytest.raises(ReplayDivergence):  # the same run id with another history is another task
        _run(world, run_id="turn2", prompt='PAY: [["transfer", "cy", 5]]')


def test_a_changed_agent_definition_is_a_version_mismatch(world: World) -> None:
    _run(world)

    async def changed() -> None:
        agent = build_agent(world.provider.base_url(world.name))
        agent.instructions("Be brief.")  # another instruction: another agent
        with SqliteCheckpointer(world.tmp / "runs.db") as store:
            await DurableAgent(agent, journal=store).run(PROMPT, run_id="r1")

    with pytest.raises(VersionMismatch):
        asyncio.run(changed())


def test_bad_input_is_refused_before_anything_is_written(world: World) -> None:
    agent = build_agent(world.provider.base_url(world.name))
    with SqliteCheckpointer(world.tmp / "runs.db") as store:
        with pytest.raises(UsageError, match="effects"):
            DurableAgent(agent, journal=store, effects={"transfer": "sometimes"})  # type: ignore[dict-item]
        with pytest.raises(UsageError, match="Lookup.find"):
            DurableAgent(agent, journal=store, effects={"transfer": Lookup(find=None)})  # type: ignore[arg-type]
        with pytest.raises(UsageError, match="Checkpointer"):
            DurableAgent(agent, journal="runs.db")  # type: ignore[arg-type]
        retrying = Agent(OpenAIChatModel("m", provider=OpenAIProvider(
            openai_client=AsyncOpenAI(base_url=world.provider.base_url(world.name), api_key="k", max_retries=2))))
        with pytest.raises(UsageError, match="max_retries"):
            DurableAgent(retrying, journal=store)
        with pytest.raises(UsageError, match="run_id"):
            asyncio.run(DurableAgent(agent, journal=store).run(PROMPT, run_id=""))
        assert store.checkpoint("r1") is None
        # A retrying model chosen at run time is refused when it would serve a request, unsent.
        with pytest.raises(UsageError, match="max_retries"):
            asyncio.run(DurableAgent(agent, journal=store).run(PROMPT, run_id="r2", model=retrying.model))
    assert world.billed() == []


def test_a_tool_that_raises_a_bug_fails_the_run_and_a_later_call_answers_failed(world: World) -> None:
    calls: list[str] = []

    async def go() -> Any:
        agent = build_agent(world.provider.base_url(world.name))

        @agent.tool_plain
        async def explode(to: str, amount: int) -> str:
            """Fail."""
            calls.append(to)
            raise RuntimeError("the tool has a bug")

        with SqliteCheckpointer(world.tmp / "runs.db") as store:
            return await DurableAgent(agent, journal=store).run('PAY: [["explode", "ana", 1]]', run_id="bug")

    with pytest.raises(RuntimeError, match="the tool has a bug"):
        asyncio.run(go())
    again = asyncio.run(go())
    assert again.status == "failed" and again.replayed and "explode" in (again.reason or "")
    assert calls == ["ana"] and len(world.billed()) == 1  # the tool ran once, the model was asked once
    with SqliteCheckpointer(world.tmp / "runs.db", readonly=True) as store:
        cp = store.checkpoint("bug")
        result = next(e for e in store.load("bug") if e.step_id == "t0000.tool00" and e.phase == "result")
    assert cp is not None and cp.status == "failed"
    assert result.payload["error"]["error_class"] == "bug"


@pytest.mark.parametrize("status", [500, 429])
def test_a_failed_send_is_classified_by_the_sdks_error_and_sent_again_with_the_same_key(
        tmp_path: Path, servers: tuple[Provider, Receipts], status: int) -> None:
    """A 500 may have been billed (the answer is lost): a new intent ``after: ambiguous``, counted
    as a second send. A 429 was refused, not billed: retried under the same intent, not counted."""
    world = World(tmp_path, *servers, name=f"fail{status}-{tmp_path.name}")
    result = _run(world, retry=RetryPolicy(base_delay=0.01))
    assert result.status == "completed" and result.output == Paid(paid=["ana", "bob"], total=30)
    with SqliteCheckpointer(tmp_path / "runs.db", readonly=True) as store:
        events = store.load("r1")
    results = [e.payload for e in events if e.kind == "model" and e.phase == "result"]
    billed = world.billed()
    assert len(results) == 3 and all(len({b["key"] for b in billed if b["tool_results"] == n}) == 1 for n in range(3))
    if status == 500:
        assert [r["sends"] for r in results] == [2, 2, 2] and len(billed) == 6  # each billed twice, each counted
        assert all(e.payload["after"] == "ambiguous" for e in events if e.phase == "intent.2")
    else:
        assert [r["sends"] for r in results] == [1, 1, 1] and len(billed) == 3
        assert [r["counters"].get("retries") for r in results] == [1, 1, 1]


def test_call_ids_reused_across_turns_still_run_each_call(tmp_path: Path, servers: tuple[Provider, Receipts]) -> None:
    """A provider that calls every tool call ``call_0``, and the same transfer asked twice: two
    steps, two effect keys, two transfers; the closed run answers from its journal."""
    world = World(tmp_path, *servers, name=f"reuseids-{tmp_path.name}")
    twice = 'PAY: [["transfer", "ana", 10], ["transfer", "ana", 10]]'
    result = _run(world, prompt=twice)
    assert result.status == "completed" and result.output == Paid(paid=["ana", "ana"], total=20)
    paid = world.paid()
    assert [(r["to"], r["amount"]) for r in paid] == [("ana", 10), ("ana", 10)] and len({r["key"] for r in paid}) == 2
    assert _run(world, prompt=twice).replayed and len(world.paid()) == 2


@pytest.mark.parametrize(("status", "error_class"), [(429, ErrorClass.TRANSIENT), (500, ErrorClass.AMBIGUOUS)])
def test_a_model_failure_past_the_bounds_leaves_the_run_as_the_runner_does(
        tmp_path: Path, servers: tuple[Provider, Receipts], status: int, error_class: ErrorClass) -> None:
    """Open (``running``), held by nobody, the failure journaled: the next call of the run id, in
    any process, sends the step again with its key, as a resumed run of cuaderno's own runner."""
    world = World(tmp_path, *servers, name=f"fail{status}-{tmp_path.name}")
    with pytest.raises(GatewayError) as err:
        _run(world, retry=RetryPolicy(max_retries=0, max_resends=0))
    assert err.value.error_class is error_class
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        cp = store.checkpoint("r1")
        assert cp is not None
        assert (cp.status, held(store, "r1")) == runner_end(tmp_path, error_class) == ("running", False)
        assert any(e.kind == "model" and e.phase.startswith("error") for e in store.load("r1"))
    result = _run(world, retry=RetryPolicy(base_delay=0.01))  # the scripted failure was the first answer only
    assert result.status == "completed"
