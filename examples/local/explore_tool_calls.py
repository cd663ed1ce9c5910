"""Probe the local llama.cpp server's tool calling through the official openai SDK.

Runs a fixed prompt set with ``tool_choice`` "auto" and "required", with and without a system
prompt, counts real tool calls / plain text / empty 200s / HTTP errors, checks what happens after
a tool result, and prints latencies. The numbers behind ``tests/local_model/FINDINGS.md``.

    .venv/bin/python examples/local/explore_tool_calls.py [--json out.json] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import Counter
from typing import Any

import openai

from cuaderno.testing.llama_server import LlamaServer

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SYSTEM = "You are a helpful assistant. Use the tools when they help."
WEATHER_PROMPTS = [
    "What's the weather in Paris?",
    "Is it raining in Tokyo right now?",
    "How hot is it in Madrid today?",
    "Tell me the weather forecast for Berlin.",
    "Should I bring an umbrella in London?",
]
OTHER_PROMPTS = [
    "What is 2 + 2?",
    "Write a haiku about the sea.",
    "Who wrote Don Quixote?",
    "Translate 'good morning' to Spanish.",
    "Hello!",
]


def shape(body: dict[str, Any]) -> str:
    choice = body["choices"][0]
    msg = choice["message"]
    if msg.get("tool_calls"):
        return "tool_call"
    if (msg.get("content") or "").strip():
        return "text"
    return "empty"


NAMED: dict[str, Any] = {"type": "function", "function": {"name": "get_weather"}}


async def call(client: openai.AsyncOpenAI, messages: list[dict[str, Any]], tool_choice: str,
               seed: int) -> tuple[str, float, dict[str, Any] | str]:
    """One chat completion; ``tool_choice`` "named" forces get_weather by name, "omitted" sends none."""
    start = time.monotonic()
    choice: Any = {"named": NAMED, "omitted": openai.omit}.get(tool_choice, tool_choice)
    wire: Any = messages
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="smollm2-135m-instruct", messages=wire, tools=[WEATHER_TOOL], tool_choice=choice, temperature=0,
            seed=seed, max_tokens=128)
        body = json.loads(await raw.http_response.aread())
        return shape(body), time.monotonic() - start, body
    except openai.APIStatusError as exc:
        return f"http_{exc.status_code}", time.monotonic() - start, exc.response.text[:2000]
    except openai.APIError as exc:
        return f"error_{type(exc).__name__}", time.monotonic() - start, str(exc)[:300]


async def main(out: str | None, threads: int) -> None:
    records: list[dict[str, Any]] = []
    with LlamaServer(n_threads=threads) as server:
        print(f"server up in {server.startup_seconds:.2f} s at {server.base_url} (pid {server.pid})")
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="local", max_retries=0) as client:
            for system in (True, False):
                for choice in ("omitted", "auto", "required", "named"):
                    for kind, prompts in (("weather", WEATHER_PROMPTS), ("other", OTHER_PROMPTS)):
                        for prompt in prompts:
                            messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
                            if system:
                                messages.insert(0, {"role": "system", "content": SYSTEM})
                            result, latency, body = await call(client, messages, choice, seed=7)
                            rec = {"system": system, "tool_choice": choice, "set": kind, "prompt": prompt,
                                   "result": result, "latency": round(latency, 3), "body": body}
                            records.append(rec)
                            print(f"sys={system!s:5} {choice:8} {kind:7} {result:10} {latency:6.2f}s  "
                                  f"{prompt!r} -> {summary(body)}")
            # After a tool result: does it call the tool again?
            for choice, content in (("auto", None), ("auto", ""), ("named", "")):
                messages = [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": "What's the weather in Paris?"},
                            {"role": "assistant", "content": content, "tool_calls": [
                                {"id": "call_1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
                result, latency, body = await call(client, messages, choice, seed=7)
                records.append({"system": True, "tool_choice": choice, "set": f"after_tool_result/{content!r}",
                                "prompt": "Paris + result", "result": result, "latency": round(latency, 3),
                                "body": body})
                print(f"after tool result {choice:8} content={content!r:5} {result:10} {latency:6.2f}s -> {summary(body)}")
            # Determinism: repeat one call of each kind.
            for choice in ("auto", "named"):
                msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": WEATHER_PROMPTS[0]}]
                outs = [summary((await call(client, msgs, choice, seed=s))[2]) for s in (1, 2, 1)]
                print(f"repeat {choice}: identical={len(set(outs)) == 1} {outs[0]}")
    counts = Counter((r["system"], r["tool_choice"], r["set"], r["result"]) for r in records)
    print("\ncounts:")
    for key, n in sorted(counts.items(), key=str):
        print(f"  {key}: {n}")
    lat = [r["latency"] for r in records]
    print(f"latency: n={len(lat)} median={statistics.median(lat):.2f}s max={max(lat):.2f}s total={sum(lat):.1f}s")
    if out:
        with open(out, "w") as fh:
            json.dump(records, fh, indent=1)


def summary(body: dict[str, Any] | str) -> str:
    if isinstance(body, str):
        return body[:120]
    choice = body["choices"][0]
    msg = choice["message"]
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []]
    return (f"finish={choice['finish_reason']} content={msg.get('content')!r:.60} calls={calls} "
            f"usage={body.get('usage', {}).get('completion_tokens')}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", help="write every request's record (and raw body) here")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (1 is faster on a busy 2-core box)")
    args = parser.parse_args()
    asyncio.run(main(args.json, args.threads))
