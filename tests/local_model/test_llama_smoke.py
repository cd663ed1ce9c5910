"""What the real llama.cpp server does with tools, through the official ``openai`` SDK.

These pin the behaviour recorded in ``FINDINGS.md`` (llama-cpp-python 0.3.36,
``chatml-function-calling``, SmolLM2-135M-Instruct Q4_1, temperature 0). If one fails after an
upgrade, the server changed: re-run ``examples/local/explore_tool_calls.py`` and update both.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from cuaderno.testing.llama_server import LlamaServer

pytestmark = pytest.mark.local_model

SYSTEM = "You are a helpful assistant. Use the tools when they help."
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
FORCE_WEATHER: dict[str, Any] = {"type": "function", "function": {"name": "get_weather"}}


async def chat(client: openai.AsyncOpenAI, server: LlamaServer, prompt: str, *, tool_choice: Any,
               history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One chat completion with the weather tool; the raw JSON body (HTTP errors raise)."""
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}, *(history or [])]
    raw = await client.chat.completions.with_raw_response.create(
        model=server.model_alias, messages=messages, tools=[WEATHER_TOOL], tool_choice=tool_choice, temperature=0, seed=7, max_tokens=64)
    assert raw.http_response.status_code == 200
    body: dict[str, Any] = json.loads(await raw.http_response.aread())
    return body


def only_choice(body: dict[str, Any]) -> dict[str, Any]:
    assert len(body["choices"]) == 1
    choice: dict[str, Any] = body["choices"][0]
    return choice


def weather_call(body: dict[str, Any]) -> dict[str, Any]:
    """The single get_weather call in ``body``, checked for the OpenAI shape; its parsed arguments."""
    choice = only_choice(body)
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant"
    assert message["content"] is None
    [call] = message["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    assert isinstance(arguments, dict)
    assert isinstance(arguments.get("city"), str)
    return arguments


def assert_empty_200(body: dict[str, Any]) -> None:
    """The empty generation: 200, finish ``stop``, content ``""``, no tool call, tokens spent, no price."""
    choice = only_choice(body)
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {"role": "assistant", "content": ""}
    assert body["usage"]["completion_tokens"] > 0
    assert body["usage"]["prompt_tokens"] > 0
    assert "cost" not in body["usage"]


async def test_models_lists_the_alias(local_client: openai.AsyncOpenAI, llama_server: LlamaServer) -> None:
    models = await local_client.models.list()
    assert [m.id for m in models.data] == [llama_server.model_alias]


async def test_auto_weather_prompt_calls_get_weather(local_client: openai.AsyncOpenAI,
                                                     llama_server: LlamaServer) -> None:
    body = await chat(local_client, llama_server, "What's the weather in Paris?", tool_choice="auto")
    assert weather_call(body) == {"city": "Paris"}
    assert body["model"] == llama_server.model_alias
    assert body["usage"]["completion_tokens"] > 0


async def test_auto_unrelated_prompt_is_an_empty_200(local_client: openai.AsyncOpenAI,
                                                     llama_server: LlamaServer) -> None:
    # chatml-function-calling picks "message:" and then constrains the message to the follow-up
    # tool grammar, so a text answer always comes back empty: the seed-002 empty generation.
    body = await chat(local_client, llama_server, "Hello!", tool_choice="auto")
    assert_empty_200(body)


async def test_empty_200_through_the_parsed_sdk_object(local_client: openai.AsyncOpenAI,
                                                       llama_server: LlamaServer) -> None:
    messages: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Who wrote Don Quixote?"}]
    completion = await local_client.chat.completions.create(
        model=llama_server.model_alias, temperature=0, max_tokens=64, tool_choice="auto", tools=[WEATHER_TOOL],
        messages=messages)
    [choice] = completion.choices
    assert choice.finish_reason == "stop"
    assert choice.message.content == ""
    assert choice.message.tool_calls is None
    assert completion.usage is not None and completion.usage.completion_tokens > 0


async def test_named_tool_choice_forces_a_call_even_when_unrelated(local_client: openai.AsyncOpenAI,
                                                                   llama_server: LlamaServer) -> None:
    # The working way to require a tool on this server: the call is grammar-constrained JSON.
    body = await chat(local_client, llama_server, "Hello!", tool_choice=FORCE_WEATHER)
    weather_call(body)


async def test_tool_choice_required_is_an_http_500(local_client: openai.AsyncOpenAI,
                                                   llama_server: LlamaServer) -> None:
    # 0.3.36 asserts tool_choice == "auto" once it is not None/"none"/named: AssertionError -> 500, empty message.
    with pytest.raises(openai.InternalServerError) as info:
        await chat(local_client, llama_server, "What's the weather in Paris?", tool_choice="required")
    assert info.value.status_code == 500
    assert info.value.response.json() == {"error": {"message": "", "type": "internal_server_error",
                                                    "param": None, "code": None}}


async def test_after_a_tool_result_it_calls_the_tool_again(local_client: openai.AsyncOpenAI,
                                                           llama_server: LlamaServer) -> None:
    # The chatml-function-calling template drops role=tool messages, so the model never sees the result.
    history: list[dict[str, Any]] = [{"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    body = await chat(local_client, llama_server, "What's the weather in Paris?", tool_choice="auto", history=history)
    weather_call(body)


async def test_assistant_content_null_with_tool_calls_is_rejected(local_client: openai.AsyncOpenAI,
                                                                  llama_server: LlamaServer) -> None:
    # The OpenAI API accepts content=null next to tool_calls; this server's request model wants a string.
    history: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    with pytest.raises(openai.InternalServerError) as info:
        await chat(local_client, llama_server, "What's the weather in Paris?", tool_choice="auto", history=history)
    assert "validation error" in info.value.response.json()["error"]["message"]


async def test_same_request_same_answer(local_client: openai.AsyncOpenAI, llama_server: LlamaServer) -> None:
    def stable(body: dict[str, Any]) -> Any:
        choice = only_choice(body)
        calls = choice["message"].get("tool_calls") or []
        return (choice["finish_reason"], choice["message"].get("content"),
                [c["function"] for c in calls], body["usage"])

    first = await chat(local_client, llama_server, "Tell me the weather forecast for Berlin.", tool_choice="auto")
    second = await chat(local_client, llama_server, "Tell me the weather forecast for Berlin.", tool_choice="auto")
    assert stable(first) == stable(second)
    assert weather_call(first)["city"] == "Berlin"
