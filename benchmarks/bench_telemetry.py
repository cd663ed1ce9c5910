"""What cuaderno's telemetry costs when no OpenTelemetry SDK is configured (the README's promise:
under a microsecond per span), and per pass.

Usage: ``python benchmarks/bench_telemetry.py [--repeats 7] [--n 200000]``

Each figure is the best of ``--repeats`` timings of ``--n`` iterations, in nanoseconds per
iteration, against an empty loop of the same shape (subtracted):

- ``model_call``: ``with telemetry.model_call(...) as call: call.response(r)`` (one chat span).
- ``tool_call``: ``with telemetry.tool_call(...) as span: span.ok()`` (one execute_tool span).
- ``agent_pass``: ``telemetry.agent_pass(...)`` then ``.drive(steps)`` and ``.opened(journal)``,
  once per pass. The do-nothing handle hands the loop's own generator back, so the steps of a
  pass pay nothing more.
- ``provider_name``: naming a gateway (``TracedGateway`` does it once per pass, SDK or not), for
  a scripted and an HTTP (OpenAI-compatible) gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import AsyncGenerator, Callable

from opentelemetry import trace

from cuaderno import ScriptedGateway, telemetry
from cuaderno.gateway.base import ModelRequest, ModelResponse, Usage
from cuaderno.gateway.openai import OpenAIGateway

REQUEST = ModelRequest(instructions="x", messages=(), model="m")
RESPONSE = ModelResponse(text="hi", usage=Usage(input_tokens=7, output_tokens=3), cost=None, model="m")


def best_ns(body: Callable[[int], None], n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        body(n)
        times.append(time.perf_counter_ns() - start)
    return min(times) / n


def empty(n: int) -> None:
    for _ in range(n):
        pass


def model_calls(n: int) -> None:
    for _ in range(n):
        with telemetry.model_call(REQUEST, run_id="r", step_id="s") as call:
            call.response(RESPONSE)


def tool_calls(n: int) -> None:
    for _ in range(n):
        with telemetry.tool_call("t", run_id="r", step_id="s", call_id="c") as span:
            span.ok()


async def _steps() -> AsyncGenerator[int, None]:
    yield 1


def agent_passes(n: int) -> None:
    gateway = ScriptedGateway([])
    steps = _steps()
    journal: dict[tuple[str, str], object] = {}
    for _ in range(n):
        handle = telemetry.agent_pass("agent", run_id="r", model="m", gateway=gateway)
        handle.drive(steps)
        handle.opened(journal)  # type: ignore[arg-type]


def provider_names(gateway: object) -> Callable[[int], None]:
    def body(n: int) -> None:
        for _ in range(n):
            telemetry.provider_name(gateway)
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--n", type=int, default=200_000)
    args = parser.parse_args()
    telemetry.configure()
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), "an SDK is configured"
    http = OpenAIGateway("m", base_url="http://127.0.0.1:8080/v1", api_key="sk-x")
    base = best_ns(empty, args.n, args.repeats)
    rows = [("model_call (no SDK)", model_calls), ("tool_call (no SDK)", tool_calls),
            ("agent_pass (no SDK), per pass", agent_passes),
            ("provider_name, scripted, per pass", provider_names(ScriptedGateway([]))),
            ("provider_name, HTTP, per pass", provider_names(http))]
    print(f"{'':40s} ns/iteration (best of {args.repeats} x {args.n}, empty loop subtracted)")
    for name, body in rows:
        print(f"{name:40s} {best_ns(body, args.n, args.repeats) - base:8.0f}")
    asyncio.run(http.aclose())


if __name__ == "__main__":
    main()
