"""What a trace viewer sees of a run: one ``invoke_agent`` span per pass (each ``agent.run`` that
drives the run), its steps' spans as its children, a resumed pass linked to the earlier one (in
this process or another, through the pass marker the earlier pass journaled), and the GenAI
attributes a viewer groups and names calls by: ``gen_ai.provider.name``, ``gen_ai.conversation.id``
(the run id) and ``gen_ai.response.id`` (the provider's id for the completion).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cuaderno import Agent, Policy, ScriptedGateway, Session, SqliteCheckpointer, approve, telemetry, tool
from cuaderno.checkpoint import rebuild
from cuaderno.gateway.anthropic import AnthropicGateway
from cuaderno.gateway.base import ModelRequest
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.gateway.tiered import TieredGateway
from cuaderno.loop.model_calls import TracedGateway

RUN = "pay-1"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=tp)
    try:
        yield exporter
    finally:
        telemetry.configure()
        tp.shutdown()


@tool
def transfer(to: str) -> str:
    """Move money."""
    return f"moved to {to}"


def _agent() -> Agent:
    return Agent(instructions="pay", tools=[transfer], model="m1", policy=Policy({"transfer": "require_approval"}))


def _scripted() -> ScriptedGateway:
    return ScriptedGateway([ScriptedGateway.call("transfer", call_id="call_1", to="bob"), ScriptedGateway.text("paid")])


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _passes(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith("invoke_agent")]


async def test_an_approval_makes_two_passes_the_second_linked_to_the_first(exporter: InMemorySpanExporter,
                                                                           tmp_path: Path) -> None:
    agent, scripted = _agent(), _scripted()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        first = [s async for s in agent.run("pay bob", session=Session(RUN, scripted, store))]
        assert type(first[-1]).__name__ == "ApprovalStep" and first[-1].status == "pending"  # type: ignore[union-attr]
        approve(store, RUN, "t0000.tool00")
        second = [s async for s in agent.run("pay bob", session=Session(RUN, scripted, store))]
        assert second[-1].output == "paid"  # type: ignore[union-attr]
        events = store.load(RUN)
    spans = list(exporter.get_finished_spans())
    one, two = _passes(spans)
    assert one.name == two.name == "invoke_agent agent"
    assert (_attrs(one)["cuaderno.pass"], _attrs(two)["cuaderno.pass"]) == (1, 2)
    assert one.links == ()
    (link,) = two.links
    assert one.context is not None and two.context is not None
    assert (link.context.trace_id, link.context.span_id) == (one.context.trace_id, one.context.span_id)
    assert (link.attributes or {}).get("cuaderno.link") == "previous_pass"
    # Each pass's own steps are its children: the first sent turn 0, the second ran the approved
    # transfer and sent turn 1 (turn 0 was replayed: no span).
    children = {s.context.span_id: [c.name for c in spans if c.parent is not None and c.parent.span_id ==
                                    s.context.span_id] for s in (one, two) if s.context is not None}
    assert children == {one.context.span_id: ["chat m1"],
                        two.context.span_id: ["execute_tool transfer", "chat m1"]}
    for span in spans:
        assert _attrs(span)["gen_ai.conversation.id"] == RUN, span.name
    for span in spans:
        if span.name.startswith(("chat", "invoke_agent")):
            assert _attrs(span)["gen_ai.provider.name"] == "scripted", span.name
    # The markers the passes journaled name their spans; the summary is their events' projection
    # (the markers change no status, counter or outcome).
    markers = {e.phase: e.payload for e in events if e.step_id == "run" and e.phase.startswith("pass")}
    assert markers == {
        "pass": {"trace_id": format(one.context.trace_id, "032x"), "span_id": format(one.context.span_id, "016x")},
        "pass.2": {"trace_id": format(two.context.trace_id, "032x"), "span_id": format(two.context.span_id, "016x")}}
    projected = rebuild(RUN, [e for e in events if not e.phase.startswith("pass")])
    with_markers = rebuild(RUN, events)
    assert (with_markers.status, with_markers.counters, with_markers.outcome, with_markers.uncertain) == \
           (projected.status, projected.counters, projected.outcome, projected.uncertain)


async def test_without_tracing_a_pass_journals_no_marker(tmp_path: Path) -> None:
    telemetry.configure()
    agent = Agent(instructions="pay", tools=[transfer], model="m1")
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        [_ async for _ in agent.run("pay bob", session=Session(RUN, _scripted(), store))]
        assert not [e for e in store.load(RUN) if e.phase.startswith("pass")]


async def test_a_traced_run_resumes_untraced_and_the_markers_replay_as_nothing(exporter: InMemorySpanExporter,
                                                                             tmp_path: Path) -> None:
    agent, scripted = _agent(), _scripted()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        [_ async for _ in agent.run("pay bob", session=Session(RUN, scripted, store))]
        approve(store, RUN, "t0000.tool00")
        telemetry.configure()  # no SDK from here on
        steps = [s async for s in agent.run("pay bob", session=Session(RUN, scripted, store))]
        assert steps[-1].output == "paid"  # type: ignore[union-attr]
        assert [e.phase for e in store.load(RUN) if e.phase.startswith("pass")] == ["pass"]
    assert [s.name for s in _passes(list(exporter.get_finished_spans()))] == ["invoke_agent agent"]


async def test_a_pass_that_fails_marks_its_span(exporter: InMemorySpanExporter, tmp_path: Path) -> None:
    from opentelemetry.trace import StatusCode

    from cuaderno import BudgetExceeded

    agent = Agent(instructions="pay", tools=[transfer], model="m1", max_turns=1)
    with SqliteCheckpointer(tmp_path / "runs.db") as store, pytest.raises(BudgetExceeded):
        [_ async for _ in agent.run("pay bob", session=Session(RUN, _scripted(), store))]
    (span,) = _passes(list(exporter.get_finished_spans()))
    assert span.status.status_code is StatusCode.ERROR
    assert _attrs(span)["error.type"] == "BudgetExceeded"


_PASS_SCRIPT = textwrap.dedent("""
    import asyncio, json, sys
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from cuaderno import Agent, Policy, ScriptedGateway, Session, SqliteCheckpointer, telemetry, tool

    journal, out = sys.argv[1], sys.argv[2]

    class JsonFile(SpanExporter):
        def export(self, spans):
            with open(out, "a") as f:
                for s in spans:
                    f.write(json.dumps({
                        "name": s.name, "trace_id": s.context.trace_id, "span_id": s.context.span_id,
                        "parent": s.parent.span_id if s.parent else None,
                        "links": [[l.context.trace_id, l.context.span_id] for l in s.links],
                        "attributes": dict(s.attributes)}) + "\\n")
            return SpanExportResult.SUCCESS

    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(JsonFile()))
    telemetry.configure(tracer_provider=tp)

    @tool
    def transfer(to: str) -> str:
        \"\"\"Move money.\"\"\"
        return f"moved to {to}"

    agent = Agent(instructions="pay", tools=[transfer], model="m1", policy=Policy({"transfer": "require_approval"}))
    scripted = ScriptedGateway([ScriptedGateway.call("transfer", call_id="call_1", to="bob"),
                                ScriptedGateway.text("paid")])

    async def main():
        with SqliteCheckpointer(journal) as store:
            return [s async for s in agent.run("pay bob", session=Session("pay-1", scripted, store))]

    steps = asyncio.run(main())
    tp.shutdown()
    print(type(steps[-1]).__name__)
""")


def _pass_in_a_process(journal: Path, out: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", _PASS_SCRIPT, str(journal), str(out)], capture_output=True,
                          text=True, timeout=120, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_pass_in_another_process_links_to_the_first_process_pass(tmp_path: Path) -> None:
    journal = tmp_path / "runs.db"
    first = _pass_in_a_process(journal, tmp_path / "first.jsonl")
    with SqliteCheckpointer(journal) as store:
        approve(store, RUN, "t0000.tool00")
    second = _pass_in_a_process(journal, tmp_path / "second.jsonl")
    (one,) = [s for s in first if s["name"] == "invoke_agent agent"]
    (two,) = [s for s in second if s["name"] == "invoke_agent agent"]
    assert two["links"] == [[one["trace_id"], one["span_id"]]]
    assert two["trace_id"] != one["trace_id"]  # its own trace: only the link ties them
    assert [s["name"] for s in second if s["parent"] == two["span_id"]] == ["execute_tool transfer", "chat m1"]
    assert {s["attributes"]["gen_ai.conversation.id"] for s in first + second} == {RUN}


# -- provider name and response id through the real SDKs -------------------------------------------

REQUEST = ModelRequest(instructions="be brief", messages=({"role": "user", "content": "hi"},), model="m1")

OPENAI_BODY = {"id": "chatcmpl-abc123", "object": "chat.completion", "created": 1, "model": "gpt-test",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
ANTHROPIC_BODY = {"id": "msg_01XYZ", "type": "message", "role": "assistant", "model": "claude-test",
                  "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn", "stop_sequence": None,
                  "usage": {"input_tokens": 10, "output_tokens": 5}}


def _client(body: dict[str, Any], request_id_header: str) -> httpx2.AsyncClient:
    def handler(request: httpx2.Request) -> httpx2.Response:
        # The request id header differs from the body's id: the span must carry the body's.
        return httpx2.Response(200, json=body, headers={request_id_header: "req_header_1"})

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handler))


async def _chat_span(exporter: InMemorySpanExporter, gateway: Any) -> dict[str, Any]:
    try:
        response = await TracedGateway(gateway).call(REQUEST, run_id=RUN, step_id="t0000.model", idempotency_key="k1")
    finally:
        if hasattr(gateway, "aclose"):
            await gateway.aclose()
    (span,) = exporter.get_finished_spans()
    attrs = _attrs(span)
    assert attrs["gen_ai.conversation.id"] == RUN
    assert attrs.get("gen_ai.response.id") == response.response_id
    return attrs


@pytest.mark.parametrize(("base_url", "provider"), [("https://api.openai.com/v1", "openai"),
                                                    ("http://127.0.0.1:9/v1", "127.0.0.1"),
                                                    ("https://my-res.openai.azure.com/openai/v1", "azure.ai.openai")])
async def test_openai_chat_span_names_its_provider_and_the_response_id(exporter: InMemorySpanExporter, base_url: str,
                                                                        provider: str) -> None:
    gateway = OpenAIGateway("m1", base_url=base_url, api_key="sk-test", http_client=_client(OPENAI_BODY, "x-request-id"))
    attrs = await _chat_span(exporter, gateway)
    assert attrs["gen_ai.provider.name"] == provider
    assert attrs["gen_ai.response.id"] == "chatcmpl-abc123"
    assert attrs["cuaderno.provider_request_id"] == "req_header_1"


@pytest.mark.parametrize(("base_url", "provider"), [("https://api.anthropic.com", "anthropic"),
                                                    ("http://localhost:8080", "localhost")])
async def test_anthropic_chat_span_names_its_provider_and_the_response_id(exporter: InMemorySpanExporter,
                                                                           base_url: str, provider: str) -> None:
    gateway = AnthropicGateway("m1", base_url=base_url, api_key="sk-ant-test",
                               http_client=_client(ANTHROPIC_BODY, "request-id"))
    attrs = await _chat_span(exporter, gateway)
    assert attrs["gen_ai.provider.name"] == provider
    assert attrs["gen_ai.response.id"] == "msg_01XYZ"


async def test_scripted_and_other_gateways_always_get_a_provider_name(exporter: InMemorySpanExporter) -> None:
    attrs = await _chat_span(exporter, ScriptedGateway([ScriptedGateway.text("hi")]))
    assert attrs["gen_ai.provider.name"] == "scripted"
    assert "gen_ai.response.id" not in attrs  # a scripted answer has no provider id

    class Mine:
        async def complete(self, request: ModelRequest, *, idempotency_key: str) -> Any:
            return ScriptedGateway.text("hi")

    class Declared(Mine):
        provider_name = "my-llm"

    assert telemetry.provider_name(Mine()) == "Mine"
    assert telemetry.provider_name(Declared()) == "my-llm"
    scripted = ScriptedGateway([ScriptedGateway.text("hi")])
    assert telemetry.provider_name(TieredGateway(scripted, ScriptedGateway([]))) == "scripted"
    assert telemetry.provider_name(TieredGateway(scripted, Declared())) == "scripted+my-llm"


def test_the_response_id_is_journaled_only_when_known() -> None:
    from cuaderno.gateway.base import ModelResponse

    with_id = ModelResponse(text="x", response_id="chatcmpl-1")
    assert ModelResponse.from_json(with_id.to_json()).response_id == "chatcmpl-1"
    assert "response_id" not in ModelResponse(text="x").to_json()  # old journals' bytes stay as they were
