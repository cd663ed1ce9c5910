"""cuaderno.telemetry against the real OpenTelemetry SDK (in-memory exporter and reader).

The global providers can be set only once per process, so these tests hand their providers to
``telemetry.configure``. The one test about the global providers runs in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

from cuaderno import telemetry
from cuaderno.errors import ErrorClass, GatewayError, ToolArgumentsInvalid, ToolError
from cuaderno.gateway.base import ModelRequest, ModelResponse, Usage


@dataclass
class Otel:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def span(self) -> ReadableSpan:
        spans = self.spans()
        assert len(spans) == 1, [s.name for s in spans]
        return spans[0]

    def metrics(self) -> dict[str, Any]:
        """Metric name -> the metric (with .unit and .data.data_points)."""
        data = self.reader.get_metrics_data()
        out: dict[str, Any] = {}
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == "cuaderno"
                for metric in sm.metrics:
                    out[metric.name] = metric
        return out

    def points(self, name: str) -> list[Any]:
        return list(self.metrics()[name].data.data_points)


def _providers(sampler: Any = None) -> tuple[TracerProvider, InMemorySpanExporter, MeterProvider,
                                             InMemoryMetricReader]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(sampler=sampler) if sampler is not None else TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    return tp, exporter, mp, reader


@pytest.fixture
def otel() -> Iterator[Otel]:
    tp, exporter, mp, reader = _providers()
    telemetry.configure(tracer_provider=tp, meter_provider=mp)
    try:
        yield Otel(exporter, reader, tp)
    finally:
        telemetry.configure()
        tp.shutdown()
        mp.shutdown()


REQUEST = ModelRequest(instructions="be brief", messages=({"role": "user", "content": "hi"},), model="gpt-x",
                       max_output_tokens=256, temperature=0.2)


def _response(**kw: Any) -> ModelResponse:
    defaults: dict[str, Any] = {"text": "hello", "finish_reason": "stop", "model": "gpt-x-2025",
                                "usage": Usage(input_tokens=100, output_tokens=20, cached_tokens=60,
                                               reasoning_tokens=5),
                                "cost": 0.25, "provider_request_id": "req_1", "response_id": "chatcmpl-1"}
    defaults.update(kw)
    return ModelResponse(**defaults)


# -- model call spans ----------------------------------------------------------------------------

def test_model_call_span_name_kind_and_attributes(otel: Otel) -> None:
    with telemetry.model_call(REQUEST, run_id="run-1", step_id="m1", provider="openai") as call:
        call.response(_response(tier="cheap"))
    span = otel.span()
    assert span.name == "chat gpt-x"
    assert span.kind is SpanKind.CLIENT
    assert span.instrumentation_scope is not None and span.instrumentation_scope.name == "cuaderno"
    assert span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-x",
        "gen_ai.provider.name": "openai",
        "gen_ai.conversation.id": "run-1",
        "cuaderno.run_id": "run-1",
        "cuaderno.step_id": "m1",
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.response.model": "gpt-x-2025",
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 60,
        "gen_ai.usage.reasoning.output_tokens": 5,
        "cuaderno.cost_usd": 0.25,
        "cuaderno.tier": "cheap",
        "cuaderno.provider_request_id": "req_1",
    }


def test_model_call_without_model_provider_or_cost(otel: Otel) -> None:
    request = ModelRequest(instructions="x", messages=())
    with telemetry.model_call(request, run_id="r", step_id="m1") as call:
        call.response(ModelResponse(text="ok", usage=Usage(input_tokens=3, output_tokens=1), cost=None))
    span = otel.span()
    assert span.name == "chat"
    attrs = dict(span.attributes or {})
    assert attrs["cuaderno.unpriced"] is True
    for absent in ("cuaderno.cost_usd", "gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model",
                   "gen_ai.response.finish_reasons", "gen_ai.usage.cache_read.input_tokens",
                   "gen_ai.usage.reasoning.output_tokens", "gen_ai.request.max_tokens"):
        assert absent not in attrs


def test_gateway_error_escaping_the_block_is_recorded_and_propagates(otel: Otel) -> None:
    err = GatewayError("429 slow down", error_class=ErrorClass.TRANSIENT, sent=False, status=429)
    with pytest.raises(GatewayError) as raised, telemetry.model_call(REQUEST, run_id="r", step_id="m1",
                                                                     provider="anthropic"):
        raise err
    assert raised.value is err
    span = otel.span()
    assert span.status.status_code is StatusCode.ERROR
    assert "429 slow down" in (span.status.description or "")
    assert span.attributes is not None and span.attributes["error.type"] == "transient"
    assert [e.name for e in span.events] == ["exception"]
    (point,) = otel.points("gen_ai.client.operation.duration")
    assert point.attributes["error.type"] == "transient"
    assert point.count == 1
    assert "gen_ai.client.token.usage" not in otel.metrics()


def test_explicit_error_uses_the_exception_type_name(otel: Otel) -> None:
    with telemetry.model_call(REQUEST, run_id="r", step_id="m1") as call:
        call.error(ValueError("bad"))
    span = otel.span()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes["error.type"] == "ValueError"


def test_an_exception_after_the_response_does_not_fail_the_model_span(otel: Otel) -> None:
    with pytest.raises(RuntimeError), telemetry.model_call(REQUEST, run_id="r", step_id="m1") as call:
        call.response(_response())
        raise RuntimeError("journal write failed")
    span = otel.span()
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes is not None and "error.type" not in span.attributes


def test_error_type_helper() -> None:
    assert telemetry.error_type(GatewayError("x", error_class=ErrorClass.AMBIGUOUS, sent=True)) == "ambiguous"
    assert telemetry.error_type(ToolArgumentsInvalid("x")) == "invalid_input"
    assert telemetry.error_type(KeyError("x")) == "KeyError"


# -- model call metrics ---------------------------------------------------------------------------

def test_token_usage_and_duration_histograms(otel: Otel) -> None:
    for n in (1, 2):
        with telemetry.model_call(REQUEST, run_id="r", step_id=f"m{n}", provider="openai") as call:
            call.response(_response(usage=Usage(input_tokens=100 * n, output_tokens=10 * n)))
    metrics = otel.metrics()
    tokens = metrics["gen_ai.client.token.usage"]
    assert tokens.unit == "{token}"
    by_type = {p.attributes["gen_ai.token.type"]: p for p in tokens.data.data_points}
    assert set(by_type) == {"input", "output"}
    assert (by_type["input"].count, by_type["input"].sum) == (2, 300)
    assert (by_type["output"].count, by_type["output"].sum) == (2, 30)
    assert dict(by_type["input"].attributes) == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-x",
        "gen_ai.response.model": "gpt-x-2025", "gen_ai.token.type": "input"}
    duration = metrics["gen_ai.client.operation.duration"]
    assert duration.unit == "s"
    (point,) = duration.data.data_points
    assert point.count == 2 and point.sum >= 0
    assert "error.type" not in point.attributes
    assert "cuaderno.run_id" not in point.attributes  # high-cardinality ids stay on spans


def test_cost_counter_and_unpriced_counter(otel: Otel) -> None:
    for cost in (0.25, 0.5, None, None, None):
        with telemetry.model_call(REQUEST, run_id="r", step_id="m", provider="openai") as call:
            call.response(_response(cost=cost))
    metrics = otel.metrics()
    cost_metric = metrics["cuaderno.model.cost"]
    assert cost_metric.unit == "USD"
    assert cost_metric.data.is_monotonic
    (cost_point,) = cost_metric.data.data_points
    assert cost_point.value == pytest.approx(0.75)
    unpriced = metrics["cuaderno.model.unpriced_calls"]
    (unpriced_point,) = unpriced.data.data_points
    assert unpriced_point.value == 3
    assert unpriced.unit == "{call}"


def test_only_unpriced_calls_leave_the_cost_counter_empty(otel: Otel) -> None:
    with telemetry.model_call(REQUEST, run_id="r", step_id="m") as call:
        call.response(_response(cost=None))
    metrics = otel.metrics()
    assert "cuaderno.model.cost" not in metrics
    (point,) = metrics["cuaderno.model.unpriced_calls"].data.data_points
    assert point.value == 1


def test_escalations_count_in_metrics_and_show_as_span_events(otel: Otel) -> None:
    escalation = {"from_tier": "cheap", "to_tier": "strong", "reason": "empty_text", "outcome": "rejected",
                  "usage": {"input_tokens": 40, "output_tokens": 0}, "cost": None, "model": "small-1",
                  "finish_reason": "stop"}
    with telemetry.model_call(REQUEST, run_id="r", step_id="m") as call:
        call.response(_response(tier="strong", cost=0.5, escalations=(escalation,)))
    (event,) = otel.span().events
    assert event.name == "cuaderno.escalation"
    assert dict(event.attributes or {}) == {
        "cuaderno.escalation.from_tier": "cheap", "cuaderno.escalation.to_tier": "strong",
        "cuaderno.escalation.reason": "empty_text", "cuaderno.escalation.outcome": "rejected",
        "cuaderno.escalation.model": "small-1", "cuaderno.escalation.finish_reason": "stop",
        "gen_ai.usage.input_tokens": 40, "gen_ai.usage.output_tokens": 0, "cuaderno.unpriced": True}
    inputs = {p.attributes.get("cuaderno.tier"): p.sum for p in otel.points("gen_ai.client.token.usage")
              if p.attributes["gen_ai.token.type"] == "input"}
    assert inputs == {"cheap": 40, "strong": 100}
    (unpriced,) = otel.points("cuaderno.model.unpriced_calls")
    assert unpriced.attributes["cuaderno.tier"] == "cheap" and unpriced.value == 1
    (cost,) = otel.points("cuaderno.model.cost")
    assert cost.attributes["cuaderno.tier"] == "strong" and cost.value == pytest.approx(0.5)


def test_malformed_escalation_evidence_never_breaks_the_call(otel: Otel, caplog: pytest.LogCaptureFixture) -> None:
    with telemetry.model_call(REQUEST, run_id="r", step_id="m") as call:
        call.response(_response(escalations=({"usage": "not a dict"},)))
    assert len(otel.spans()) == 1
    assert "cuaderno telemetry" in caplog.text


# -- tool call spans ------------------------------------------------------------------------------

def test_tool_call_span_ok(otel: Otel) -> None:
    with telemetry.tool_call("search", run_id="run-1", step_id="t1", call_id="call_9") as span:
        span.ok()
    s = otel.span()
    assert s.name == "execute_tool search"
    assert s.kind is SpanKind.INTERNAL
    assert s.status.status_code is StatusCode.UNSET
    assert dict(s.attributes or {}) == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                                        "gen_ai.tool.call.id": "call_9", "gen_ai.conversation.id": "run-1",
                                        "cuaderno.run_id": "run-1", "cuaderno.step_id": "t1"}
    (point,) = otel.points("gen_ai.execute_tool.duration")
    assert dict(point.attributes) == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"}


def test_tool_error_escaping_uses_its_error_class(otel: Otel) -> None:
    with pytest.raises(ToolError), telemetry.tool_call("pay", run_id="r", step_id="t1"):
        raise ToolError("stale version", error_class=ErrorClass.CONFLICT)
    s = otel.span()
    assert s.status.status_code is StatusCode.ERROR
    assert s.attributes is not None and s.attributes["error.type"] == "conflict"
    assert "gen_ai.tool.call.id" not in s.attributes
    (point,) = otel.points("gen_ai.execute_tool.duration")
    assert point.attributes["error.type"] == "conflict"


def test_tool_error_explicit_and_unclassified(otel: Otel) -> None:
    with telemetry.tool_call("pay", run_id="r", step_id="t1") as span:
        span.error(ToolError("nope"))
    with pytest.raises(ZeroDivisionError), telemetry.tool_call("calc", run_id="r", step_id="t2"):
        _ = 1 / 0
    types = {s.name: (s.attributes or {})["error.type"] for s in otel.spans()}
    assert types == {"execute_tool pay": "permanent", "execute_tool calc": "ZeroDivisionError"}


# -- context, sampling, providers -----------------------------------------------------------------

async def test_spans_are_current_inside_async_code(otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("test")

    async def one(step: str) -> None:
        with telemetry.model_call(REQUEST, run_id="r", step_id=step) as call:
            await asyncio.sleep(0)
            with telemetry.tool_call("inner", run_id="r", step_id=step):
                await asyncio.sleep(0)
                tracer.start_span(f"http {step}").end()
            call.response(_response())

    await asyncio.gather(one("a"), one("b"))
    assert not trace.get_current_span().get_span_context().is_valid
    spans = {s.name + "/" + str((s.attributes or {}).get("cuaderno.step_id", "")): s for s in otel.spans()}
    for step in ("a", "b"):
        chat, tool = spans[f"chat gpt-x/{step}"], spans[f"execute_tool inner/{step}"]
        http = spans[f"http {step}/"]
        assert tool.parent is not None and chat.context is not None and tool.parent.span_id == chat.context.span_id
        assert http.parent is not None and tool.context is not None and http.parent.span_id == tool.context.span_id


def test_unsampled_spans_still_record_metrics() -> None:
    tp, exporter, mp, reader = _providers(sampler=ALWAYS_OFF)
    telemetry.configure(tracer_provider=tp, meter_provider=mp)
    try:
        with telemetry.model_call(REQUEST, run_id="r", step_id="m") as call:
            call.response(_response())
            call.error(RuntimeError("ignored on a span that is not recording"))
        assert exporter.get_finished_spans() == ()
        assert Otel(exporter, reader, tp).metrics()["gen_ai.client.token.usage"] is not None
    finally:
        telemetry.configure()
        tp.shutdown()
        mp.shutdown()


def test_configure_switches_providers() -> None:
    tp1, exp1, mp1, reader1 = _providers()
    tp2, exp2, mp2, reader2 = _providers()
    try:
        telemetry.configure(tracer_provider=tp1, meter_provider=mp1)
        with telemetry.tool_call("a", run_id="r", step_id="t1"):
            pass
        telemetry.configure(tracer_provider=tp2, meter_provider=mp2)
        with telemetry.tool_call("b", run_id="r", step_id="t2"):
            pass
        assert [s.name for s in exp1.get_finished_spans()] == ["execute_tool a"]
        assert [s.name for s in exp2.get_finished_spans()] == ["execute_tool b"]
        for reader in (reader1, reader2):
            (point,) = Otel(exp1, reader, tp1).points("gen_ai.execute_tool.duration")
            assert point.count == 1
    finally:
        telemetry.configure()
        for p in (tp1, tp2, mp1, mp2):
            p.shutdown()


def test_tracing_only_or_metrics_only() -> None:
    tp, exporter, mp, reader = _providers()
    try:
        telemetry.configure(tracer_provider=tp)
        with telemetry.model_call(REQUEST, run_id="r", step_id="m") as call:
            call.response(_response())
        assert len(exporter.get_finished_spans()) == 1
        telemetry.configure(meter_provider=mp)
        with telemetry.model_call(REQUEST, run_id="r", step_id="m") as call:
            call.response(_response())
        assert len(exporter.get_finished_spans()) == 1
        (point,) = Otel(exporter, reader, tp).points("gen_ai.client.operation.duration")
        assert point.count == 1
    finally:
        telemetry.configure()
        tp.shutdown()
        mp.shutdown()


def test_no_sdk_path_is_a_cheap_no_op() -> None:
    telemetry.configure()
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("another test in this process set a global tracer provider")
    response = _response()
    with telemetry.model_call(REQUEST, run_id="r", step_id="m") as call:
        call.response(response)
        call.error(ValueError("x"))
    with pytest.raises(GatewayError), telemetry.model_call(REQUEST, run_id="r", step_id="m"):
        raise GatewayError("x", error_class=ErrorClass.PERMANENT, sent=True)
    with telemetry.tool_call("t", run_id="r", step_id="t1") as span:
        span.ok()
    n = 20_000
    start = time.perf_counter()
    for _ in range(n):
        with telemetry.model_call(REQUEST, run_id="r", step_id="m") as call:
            call.response(response)
    per_call = (time.perf_counter() - start) / n
    assert per_call < 20e-6, f"{per_call * 1e6:.2f} us per no-op model_call"  # measured ~0.5 us


_GLOBAL_SCRIPT = textwrap.dedent("""
    import json
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from cuaderno import telemetry
    from cuaderno.gateway.base import ModelRequest, ModelResponse, Usage

    request = ModelRequest(instructions="x", messages=(), model="m")
    response = ModelResponse(usage=Usage(input_tokens=7, output_tokens=3), cost=None, model="m")
    # Before any SDK: the shared no-op handle.
    before = telemetry.model_call(request, run_id="r", step_id="s0")
    with before as call:
        call.response(response)
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tp)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    with telemetry.model_call(request, run_id="r", step_id="s1") as call:
        call.response(response)
    names = sorted(m.name for rm in reader.get_metrics_data().resource_metrics
                   for sm in rm.scope_metrics for m in sm.metrics)
    print(json.dumps({"noop_before": type(before).__name__,
                      "spans": [s.attributes["cuaderno.step_id"] for s in exporter.get_finished_spans()],
                      "metrics": names}))
""")


def test_global_providers_set_after_import_are_picked_up() -> None:
    proc = subprocess.run([sys.executable, "-W", "error", "-c", _GLOBAL_SCRIPT], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"noop_before": "ModelCallSpan", "spans": ["s1"],
                   "metrics": ["cuaderno.model.unpriced_calls", "gen_ai.client.operation.duration",
                               "gen_ai.client.token.usage"]}


# -- the loop's spans ------------------------------------------------------------------------------

async def test_a_run_emits_one_span_per_model_send_and_per_tool_execution(otel: Otel, tmp_path: Any) -> None:
    """What the loop emits end to end (the spans now come from the gateway and tool-executor
    wrappers, not from the loop body): a chat span per send (the refused one marked with its
    error class), an execute_tool span around the tool body, each naming its run and step."""
    from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, tool

    inside: list[str] = []

    @tool
    def transfer(to: str) -> str:
        """Move money."""
        inside.append(getattr(trace.get_current_span(), "name", ""))
        return "moved"

    scripted = ScriptedGateway([ScriptedGateway.call("transfer", call_id="call_7", to="a"),
                                ScriptedGateway.text("done")])
    refusals = [GatewayError("429", error_class=ErrorClass.TRANSIENT, sent=False)]

    class Refusing:
        async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
            if refusals:
                raise refusals.pop()
            return await scripted.complete(request, idempotency_key=idempotency_key)

    async def no_wait(seconds: float) -> None:
        pass

    agent = Agent(instructions="i", tools=[transfer], model="m1")
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        [_ async for _ in agent.run("t", session=Session("tel", Refusing(), store, sleep=no_wait))]
    seen = [(s.name, (s.attributes or {}).get("cuaderno.step_id"), (s.attributes or {}).get("error.type"),
             (s.attributes or {}).get("gen_ai.tool.call.id")) for s in otel.spans()]
    assert seen == [("chat m1", "t0000.model", "transient", None), ("chat m1", "t0000.model", None, None),
                    ("execute_tool transfer", "t0000.tool00", None, "call_7"), ("chat m1", "t0001.model", None, None),
                    ("invoke_agent agent", None, None, None)]
    assert {(s.attributes or {}).get("cuaderno.run_id") for s in otel.spans()} == {"tel"}
    assert inside == ["execute_tool transfer"]  # the tool body runs inside its span


async def test_the_loop_body_opens_no_span_of_its_own(otel: Otel, tmp_path: Any) -> None:
    """With an untraced tool executor and model caller in the session, a run emits only its pass's
    invoke_agent span: every chat and execute_tool span comes from the wrappers (where a
    workflow's activities would open them instead)."""
    from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, tool
    from cuaderno.loop.executor import AgentTools

    @tool
    def transfer(to: str) -> str:
        """Move money."""
        return "moved"

    scripted = ScriptedGateway([ScriptedGateway.call("transfer", to="a"), ScriptedGateway.text("done")])

    class Untraced:
        async def call(self, request: ModelRequest, *, run_id: str, step_id: str,
                       idempotency_key: str) -> ModelResponse:
            return await scripted.complete(request, idempotency_key=idempotency_key)

    agent = Agent(instructions="i", tools=[transfer], model="m1")
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        session = Session("quiet", scripted, store, tools=AgentTools(agent.tools), model_caller=Untraced())
        steps = [step async for step in agent.run("t", session=session)]
    assert steps[-1].output == "done"  # type: ignore[union-attr]
    assert [s.name for s in otel.spans()] == ["invoke_agent agent"]


async def test_a_compensation_is_traced_like_any_tool_step(otel: Otel, tmp_path: Any) -> None:
    """compensate() runs through the loop's tool-step machine, so its body gets the same
    execute_tool span (it had none), named by its own step."""
    from cuaderno import (
        Agent,
        Compensation,
        RunCancelled,
        ScriptedGateway,
        Session,
        SqliteCheckpointer,
        cancel,
        compensate,
        tool,
    )

    @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"]}))
    def transfer(to: str) -> str:
        """Move money."""
        return "moved"

    @tool
    def refund(to: str) -> str:
        """Give it back."""
        return "refunded"

    agent = Agent(instructions="i", tools=[transfer, refund])
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        with pytest.raises(RunCancelled):
            async for step in agent.run("t", session=Session("comp", ScriptedGateway(
                    [ScriptedGateway.call("transfer", to="a"), ScriptedGateway.text("x")]), store)):
                if getattr(step, "tool", None) == "transfer":
                    cancel(store, "comp", "abort")
        otel.exporter.clear()
        assert [r["outcome"] for r in await compensate(agent, store, "comp")] == ["ok"]
    (span,) = otel.spans()
    assert span.name == "execute_tool refund"
    assert dict(span.attributes or {}) == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "refund",
                                           "gen_ai.tool.call.id": "cleanup00", "gen_ai.conversation.id": "comp",
                                           "cuaderno.run_id": "comp",
                                           "cuaderno.step_id": "cleanup00"}
