"""``DurableRunner`` in one process, through the SDK's real HTTP path to the fake provider: what a
run is bound to (agent definition, input), how failures leave it, tool failures the SDK's way,
multi-turn input, and bad input refused with a typed error before anything is written."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _oai_harness import ProviderProcess, journal_events
from _runner_end import held, runner_end
from _spans_seen import span_names
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrailTripwireTriggered,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    function_tool,
    input_guardrail,
    output_guardrail,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from cuaderno import PriceTable, SqliteCheckpointer, harness
from cuaderno.errors import (
    ErrorClass,
    GatewayError,
    ReplayDivergence,
    ToolError,
    UncertainEffect,
    UsageError,
    VersionMismatch,
)
from cuaderno.integrations.openai_agents import DurableRunner, ToolEffect, effect_key, lookup

set_tracing_disabled(True)


class Summary(BaseModel):
    transfers: int
    total: int


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderProcess]:
    with ProviderProcess(tmp_path_factory.mktemp("oai-runner") / "billing.jsonl") as p:
        yield p


def agent(provider: ProviderProcess, *, model: str = "fake-model", transfer: Any = None, notify: Any = None,
          instructions: str = "Make the transfers.", headers: dict[str, str] | None = None) -> Agent[Any]:
    sent: list[tuple[str, int, str]] = []

    @function_tool
    async def transfer_ok(ctx: RunContextWrapper[Any], to: str, amount: int) -> dict[str, Any]:
        """Send money."""
        sent.append((to, amount, effect_key()))
        return {"to": to, "amount": amount}

    @function_tool
    async def balance(account: str) -> int:
        """Read a balance."""
        return 1000

    @function_tool
    async def notify_ok(message: str) -> str:
        """Notify."""
        return "notified"

    t = transfer or transfer_ok
    t.name = "transfer"
    n = notify or notify_ok
    n.name = "notify"
    client = AsyncOpenAI(base_url=provider.url, api_key="k", default_headers=headers)
    a = Agent(name="treasurer", instructions=instructions, tools=[t, balance, n], output_type=Summary,
              model=OpenAIChatCompletionsModel(model=model, openai_client=client))
    a.sent = sent  # type: ignore[attr-defined]
    return a


def run(store: SqliteCheckpointer, a: Agent[Any], input: Any = "pay", run_id: str = "r", **kw: Any) -> Any:
    return asyncio.run(DurableRunner(store, effects={"balance": "effect_free"}, **kw).run(a, input, run_id=run_id))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteCheckpointer]:
    s = SqliteCheckpointer(tmp_path / "j.db")
    yield s
    s.close()


def test_completes_with_structured_output_and_answers_again_from_the_journal(provider: ProviderProcess,
                                                                            store: SqliteCheckpointer) -> None:
    a = agent(provider)
    result = run(store, a)
    assert result.status == "completed" and result.final_output == Summary(transfers=5, total=150)
    keys = [k for _, _, k in a.sent]
    assert len(keys) == 5 and len(set(keys)) == 5  # five transfers, five keys
    billed = len(provider.bills())
    again = run(store, agent(provider))
    assert again.replayed and again.final_output == Summary(transfers=5, total=150)
    assert len(provider.bills()) == billed  # nothing sent


def test_each_step_is_priced_with_the_prices_given_and_unpriced_otherwise(provider: ProviderProcess,
                                                                           store: SqliteCheckpointer) -> None:
    """Five answered steps, priced once each at the table's price for the agent's model (the fake
    provider's usage: 100 + 10 per message in, 20 out); an unknown model is counted unpriced."""
    run(store, agent(provider), run_id="priced", prices=PriceTable({"fake-model": {"input": 1.0, "output": 2.0}}))
    run(store, agent(provider), run_id="unknown", prices=PriceTable({"other": {"input": 1.0, "output": 2.0}}))
    priced, unknown = store.checkpoint("priced"), store.checkpoint("unknown")
    assert priced is not None and unknown is not None
    results = [e.payload["response"]["usage"] for e in store.load("priced") if e.kind == "model" and e.phase == "result"]
    expected = sum(u["input_tokens"] * 1.0 + u["output_tokens"] * 2.0 for u in results) / 1e6
    assert len(results) == 5 and expected > 0 and priced.cost_usd == pytest.approx(expected)
    assert priced.counters.get("calls_paid") == 5 and not priced.counters.get("unpriced_calls")
    assert unknown.cost_usd == 0 and unknown.counters.get("unpriced_calls") == 5


def test_each_send_and_each_tool_body_is_a_span_and_a_replay_is_none(provider: ProviderProcess,
                                                                      store: SqliteCheckpointer,
                                                                      spans: InMemorySpanExporter) -> None:
    """The GenAI spans cuaderno's own loop emits: one ``chat`` per send, one ``execute_tool`` per
    tool body, with the run and step; answering the ended run again sends nothing and traces
    nothing."""
    run(store, agent(provider), run_id="traced", prices=PriceTable({"fake-model": {"input": 1.0, "output": 2.0}}))
    names = span_names(spans)
    chats = [step for name, step in names if name == "chat fake-model"]
    tools = sorted(name for name, _ in names if name.startswith("execute_tool"))
    assert chats == [f"t{n:04d}.model" for n in range(5)]
    assert tools == sorted(["execute_tool transfer"] * 5 + ["execute_tool balance", "execute_tool notify"])
    assert {(s.attributes or {}).get("cuaderno.run_id") for s in spans.get_finished_spans()} == {"traced"}
    chat = next(s for s in spans.get_finished_spans() if s.name == "chat fake-model")
    attributes = chat.attributes or {}
    assert attributes["gen_ai.usage.output_tokens"] == 20 and attributes["cuaderno.cost_usd"] > 0
    spans.clear()
    assert run(store, agent(provider), run_id="traced").replayed and span_names(spans) == []


def test_keys_are_the_same_in_a_resume(provider: ProviderProcess, tmp_path: Path) -> None:
    """The effect keys derive from the run and the step only: two stores, same run id, same keys."""
    keys = []
    for name in ("a", "b"):
        s = SqliteCheckpointer(tmp_path / f"{name}.db")
        a = agent(provider)
        run(s, a)
        s.close()
        keys.append([k for _, _, k in a.sent])
    assert keys[0] == keys[1]


def test_a_changed_agent_is_a_version_mismatch_unless_a_version_is_chosen(provider: ProviderProcess,
                                                                          store: SqliteCheckpointer) -> None:
    with pytest.raises(GatewayError):
        run(store, agent(provider, model="status-503"), run_id="v")  # open, resumable
    with pytest.raises(VersionMismatch):
        run(store, agent(provider, instructions="Something else."), run_id="v")
    with pytest.raises(ReplayDivergence):
        run(store, agent(provider, model="status-503"), input="another task", run_id="v")
    run(store, agent(provider), run_id="w", agent_version="treasurer-1")
    changed = run(store, agent(provider, instructions="Reworded."), run_id="w", agent_version="treasurer-1")
    assert changed.replayed  # a label the caller chose: the run is the same version


@pytest.mark.parametrize(("model", "error_class"), [("status-401", ErrorClass.PERMANENT),
                                                     ("status-503", ErrorClass.TRANSIENT)])
def test_a_model_failure_past_the_bounds_leaves_the_run_as_the_runner_does(
        provider: ProviderProcess, store: SqliteCheckpointer, tmp_path: Path, model: str,
        error_class: ErrorClass) -> None:
    """Open (``running``), held by nobody, the failure journaled, the error raised: what cuaderno's
    own runner leaves (a permanent error too: fix the key or the model, and the run resumes)."""
    run_id = f"fail-{model}"
    with pytest.raises(GatewayError) as err:
        run(store, agent(provider, model=model), run_id=run_id, retry=_NoWait(), agent_version="treasurer")
    assert err.value.error_class is error_class
    cp = store.checkpoint(run_id)
    assert cp is not None
    assert (cp.status, held(store, run_id)) == runner_end(tmp_path, error_class) == ("running", False)
    assert [e.phase for e in store.load(run_id) if e.kind == "model"][-1].startswith("error")
    billed = len(provider.bills())
    result = run(store, agent(provider), run_id=run_id, agent_version="treasurer")  # fixed: the same run goes on
    assert result.status == "completed" and len(provider.bills()) > billed


async def _streamed(store: SqliteCheckpointer, a: Agent[Any], run_id: str, **kw: Any) -> Any:
    stream = DurableRunner(store, effects={"balance": "effect_free"}, **kw).run_streamed(a, "pay", run_id=run_id)
    async for _ in stream.stream_events():
        pass
    return stream.result


def test_a_cut_stream_is_sent_again_with_its_key_and_counted(provider: ProviderProcess, store: SqliteCheckpointer,
                                                             tmp_path: Path) -> None:
    """The provider cuts turn 1's stream after its first chunk, every time: the step is sent
    again with the same key within the re-send bound (counted possibly billed twice), then the
    failure is journaled and raised, the run left open; with the stream healed, the same run goes
    on and sends turn 1 once more, with that key."""
    run_id, before = "cut", len(provider.bills())
    with pytest.raises(GatewayError) as err:
        asyncio.run(_streamed(store, agent(provider, headers={"X-Cut-Stream-At-Turn": "1"}), run_id, retry=_NoWait()))
    assert err.value.error_class is ErrorClass.AMBIGUOUS and err.value.sent
    turn1 = [b for b in provider.bills()[before:] if b["turn"] == 1]
    assert len(turn1) == 1 + _NoWait.max_resends and len({b["key"] for b in turn1}) == 1 and turn1[0]["key"]
    cp = store.checkpoint(run_id)
    assert cp is not None and (cp.status, held(store, run_id)) == ("running", False)
    model_phases = [e.phase for e in store.load(run_id) if e.step_id == "t0001.model"]
    assert model_phases[-1].startswith("error") and "intent.2" in model_phases  # the re-send, journaled
    result = asyncio.run(_streamed(store, agent(provider), run_id))
    assert result.status == "completed" and result.final_output == Summary(transfers=5, total=150)
    turn1 = [b for b in provider.bills()[before:] if b["turn"] == 1]
    assert len(turn1) == 2 + _NoWait.max_resends and len({b["key"] for b in turn1}) == 1


def test_run_and_run_streamed_drive_one_run_step_by_step(provider: ProviderProcess, store: SqliteCheckpointer) -> None:
    """A run that failed unstreamed goes on streamed (and the reverse), from its journal."""
    with pytest.raises(GatewayError):
        run(store, agent(provider, model="status-503"), run_id="mixed", retry=_NoWait(), agent_version="t")
    result = asyncio.run(_streamed(store, agent(provider), "mixed", agent_version="t"))
    assert result.status == "completed" and result.final_output == Summary(transfers=5, total=150)
    assert run(store, agent(provider), run_id="mixed", agent_version="t").replayed


def _released(store: SqliteCheckpointer, run_id: str) -> None:
    """Another owner takes the run without forcing: nobody holds it."""
    epoch = store.acquire(run_id, "someone-else", force=False)
    store.release(run_id, epoch)


class _NoWait:
    max_retries = 1
    max_resends = 1

    def delay(self, attempt: int, retry_after: float | None, rng: Any) -> float | None:
        return 0.0


def test_a_tool_exception_is_told_to_the_model_the_sdk_way_and_journaled(provider: ProviderProcess,
                                                                         store: SqliteCheckpointer) -> None:
    @function_tool
    async def broken(to: str, amount: int) -> str:
        """Send money."""
        raise ValueError(f"no route to {to}")

    result = run(store, agent(provider, transfer=broken), run_id="e")
    assert result.status == "completed"
    told = [e for e in journal_events(Path(store.path), "e") if e["kind"] == "tool" and e["phase"] == "result"
            and e["step_id"] == "t0000.tool.call_0_0"]
    # What the SDK's default failure function tells the model (0.24 keeps the exception's text out).
    assert told and told[0]["payload"]["value"].startswith("An error occurred while running the tool")


def test_an_ambiguous_failure_of_a_tool_without_lookup_stops_needs_human(provider: ProviderProcess,
                                                                          store: SqliteCheckpointer) -> None:
    @function_tool
    async def lost(to: str, amount: int) -> str:
        """Send money."""
        raise ToolError("reply lost", error_class=ErrorClass.AMBIGUOUS, sent=True)

    with pytest.raises(UncertainEffect):
        run(store, agent(provider, transfer=lost), run_id="u")
    cp = store.checkpoint("u")
    assert cp is not None and cp.status == "needs_human"
    _released(store, "u")


def test_guardrails_are_journaled_once_and_a_resume_does_not_ask_them_again(provider: ProviderProcess,
                                                                            store: SqliteCheckpointer) -> None:
    """A guardrail that would decide otherwise the second time (it trips on every call after its
    first) is asked once: a resume after needs_human hands back its journaled decision, so the
    resumed run does not trip where the first pass did not."""
    asked: list[str] = []

    @input_guardrail
    async def screen(ctx: RunContextWrapper[Any], agent: Agent[Any], value: Any) -> GuardrailFunctionOutput:
        asked.append("in")
        return GuardrailFunctionOutput(output_info={"calls": len(asked)}, tripwire_triggered=asked.count("in") > 1)

    @output_guardrail
    async def review(ctx: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> GuardrailFunctionOutput:
        asked.append("out")
        return GuardrailFunctionOutput(output_info=None, tripwire_triggered=asked.count("out") > 1)

    @function_tool
    async def lost(to: str, amount: int) -> str:
        """Send money."""
        raise ToolError("reply lost", error_class=ErrorClass.AMBIGUOUS, sent=True)

    guarded = agent(provider, transfer=lost)
    guarded.input_guardrails, guarded.output_guardrails = [screen], [review]
    with pytest.raises(UncertainEffect) as stopped:
        run(store, guarded, run_id="g", agent_version="guarded")
    assert asked == ["in"]
    uncertain = [e.step_id for e in store.load("g") if e.phase == "uncertain"]
    assert stopped.value.step_id in uncertain  # the two parallel transfers of turn 0
    for step in uncertain:
        harness.resolve(store, "g", step, happened=True, result={"ok": True}, by="test", note="found it")
    ok = agent(provider)
    ok.input_guardrails, ok.output_guardrails = [screen], [review]
    result = run(store, ok, run_id="g", agent_version="guarded")  # another tool body: the version is chosen
    assert result.status == "completed" and asked == ["in", "out"]
    guards = {e.step_id: e.payload["value"] for e in store.load("g") if e.step_id.startswith("guard.")
              and e.phase == "result"}
    assert guards == {"guard.in.00.screen": {"output_info": {"calls": 1}, "tripwire_triggered": False},
                      "guard.out.00.review": {"output_info": None, "tripwire_triggered": False}}
    assert run(store, ok, run_id="g", agent_version="guarded").replayed and asked == ["in", "out"]


def test_a_guardrail_that_trips_ends_the_run_failed_with_its_decision_journaled(provider: ProviderProcess,
                                                                                store: SqliteCheckpointer) -> None:
    @input_guardrail
    async def refuse(ctx: RunContextWrapper[Any], agent: Agent[Any], value: Any) -> GuardrailFunctionOutput:
        return GuardrailFunctionOutput(output_info="no", tripwire_triggered=True)

    a = agent(provider)
    a.input_guardrails = [refuse]
    with pytest.raises(InputGuardrailTripwireTriggered):
        run(store, a, run_id="tripped")
    cp = store.checkpoint("tripped")
    assert cp is not None and cp.status == "failed"
    [judged] = [e.payload["value"] for e in store.load("tripped") if e.step_id == "guard.in.00.refuse"
                and e.phase == "result"]
    assert judged == {"output_info": "no", "tripwire_triggered": True}


def test_multi_turn_input_list(provider: ProviderProcess, store: SqliteCheckpointer) -> None:
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
               {"role": "user", "content": "pay"}]
    # One assistant message already: the script starts at its second turn (four transfers left).
    result = run(store, agent(provider), input=history, run_id="m")
    assert result.status == "completed"
    assert sum(1 for e in journal_events(Path(store.path), "m") if e["kind"] == "model" and e["phase"] == "result") == 4


def test_bad_input_is_refused_before_anything_is_written(provider: ProviderProcess, store: SqliteCheckpointer) -> None:
    a = agent(provider)
    with pytest.raises(UsageError, match="Checkpointer"):
        DurableRunner("runs.db")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="needs its function"):
        DurableRunner(store, effects={"transfer": "lookup"})
    with pytest.raises(UsageError, match="kind"):
        DurableRunner(store, effects={"transfer": "twice"})
    with pytest.raises(UsageError, match="lookup"):
        ToolEffect("lookup")
    with pytest.raises(UsageError, match="does not have"):
        asyncio.run(DurableRunner(store, effects={"nope": lookup(_none)}).run(a, "pay", run_id="x"))
    with pytest.raises(UsageError, match="run_id"):
        asyncio.run(DurableRunner(store).run(a, "pay", run_id=""))
    with pytest.raises(UsageError, match="input"):
        asyncio.run(DurableRunner(store).run(a, 42, run_id="x"))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="effect_key"):
        effect_key()
    assert store.checkpoint("x") is None


async def _none(call: Any) -> None:
    return None
