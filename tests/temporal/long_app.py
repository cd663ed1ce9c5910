"""A long conversation for the history-size tests and the benchmark: ``turns`` model calls, each
asking for a 5 KB tool output, then an answer; and the naive workflow (the whole conversation as
each model activity's input, as temporalio.contrib.openai_agents does: sdk-python#1890) running
the same script and the same tool."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

from cuaderno import Agent, tool
from cuaderno.gateway.base import ModelRequest, ModelResponse, assistant_message
from cuaderno.gateway.scripted import ScriptedGateway

OUTPUT_BYTES = 5000


def script(turns: int) -> Any:
    def answer(request: ModelRequest) -> ModelResponse:
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        if turn < turns:
            return ScriptedGateway.call("read_doc", call_id=f"c{turn}", name=f"doc-{turn}")
        return ScriptedGateway.text(f"read {turns} documents")
    return answer


def document(name: str) -> dict[str, Any]:
    return {"name": name, "text": (name + " ") * (OUTPUT_BYTES // (len(name) + 1))}


def long_agent(turns: int) -> Agent:
    @tool(idempotent=True)
    def read_doc(name: str) -> dict[str, Any]:
        """Read a document (5 KB)."""
        return document(name)

    return Agent(instructions="Read every document.", tools=[read_doc], name=f"reader{turns}", max_turns=turns + 1)


class NaiveActivities:
    def __init__(self, gateway: ScriptedGateway) -> None:
        self.gateway = gateway

    @activity.defn(name="naive.model_turn")
    async def model_turn(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        request = ModelRequest(instructions="Read every document.", messages=tuple(messages))
        return (await self.gateway.complete(request, idempotency_key=f"k{len(messages)}")).to_json()

    @activity.defn(name="naive.read_doc")
    async def read_doc(self, name: str) -> dict[str, Any]:
        return document(name)


@workflow.defn(name="naive.run", sandboxed=False)
class NaiveWorkflow:
    """The conversation is each model activity's input: the history grows quadratically."""

    @workflow.run
    async def run(self, task: str) -> str:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        while True:
            response = await workflow.execute_activity("naive.model_turn", messages, result_type=dict,
                                                       start_to_close_timeout=timedelta(seconds=210))
            messages.append(assistant_message(response))
            calls = response.get("tool_calls") or []
            if not calls:
                return str(response.get("text"))
            for call in calls:
                out = await workflow.execute_activity("naive.read_doc", call["arguments"]["name"], result_type=dict,
                                                      start_to_close_timeout=timedelta(seconds=25))
                messages.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"],
                                 "content": str(out)})
