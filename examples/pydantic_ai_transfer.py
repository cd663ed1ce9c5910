"""A Pydantic AI agent that pays two transfers, made durable by cuaderno, killed mid-payment and
resumed by another process: each transfer is made once, each model request billed once.

Run: ``python examples/pydantic_ai_transfer.py`` (needs ``pip install 'cuaderno[pydantic-ai]'``).

Everything runs on loopback: a stand-in for an OpenAI-compatible provider (it plays the model:
one transfer per turn, then the structured answer) that logs every request it is billed for, and a
payment service that logs every transfer it makes. The agent is an ordinary ``pydantic_ai.Agent``
with the framework's own ``OpenAIChatModel``; cuaderno wraps it unchanged.

1. A child process runs the agent with ``CUADERNO_CRASH_AT=tool.K4:2``: it is SIGKILLed after the
   payment service made the second transfer, before the reply was read.
2. Another child runs the same run id: the journal answers the first model requests and the first
   transfer; the second transfer's fate is settled by asking the payment service by its effect
   key (a ``Lookup``): found, so it is not paid again; the run finishes.
3. The services' own logs are checked: 2 transfers, 3 requests billed, each with its key.

Exits 1 if the check fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from cuaderno import SqliteCheckpointer, faults
from cuaderno.integrations.pydantic_ai import DurableAgent, Lookup, current_effect_key

RUN_ID = "pay-2026-12"
PROMPT = "Pay ana 10 and bob 20."
SCRIPT = [("ana", 10), ("bob", 20)]


# -- the agent, as anyone writes it ----------------------------------------------------------------

class Paid(BaseModel):
    paid: list[str]
    total: int


async def agent_process(journal: str, provider_url: str, payments_url: str) -> None:
    # max_retries=0: cuaderno is the one retry layer (a retry the SDK made alone would be a send
    # the journal never counts); DurableAgent refuses a client that retries on its own.
    client = AsyncOpenAI(base_url=provider_url, api_key="not-needed", max_retries=0)
    agent = Agent(OpenAIChatModel("stand-in", provider=OpenAIProvider(openai_client=client)),
                  deps_type=httpx.AsyncClient, output_type=Paid, name="payer",
                  instructions="Pay each transfer the user asks for, then say who was paid.")

    @agent.tool
    async def transfer(ctx: RunContext[httpx.AsyncClient], to: str, amount: int) -> dict[str, Any]:
        """Transfer ``amount`` euros to ``to``."""
        # The effect key is the same on every attempt and resume of this call: the payment
        # service keeps it, so it can be asked later whether this transfer was made.
        reply = await ctx.deps.post(f"{payments_url}/transfers",
                                    json={"key": current_effect_key(), "to": to, "amount": amount})
        faults.point("tool.K4")  # the example's kill: the payment made, its reply not read
        return dict(reply.json())

    async with httpx.AsyncClient() as http:
        async def find(key: str, arguments: dict[str, Any]) -> Any:
            reply = await http.get(f"{payments_url}/transfers/{key}")
            return None if reply.status_code == 404 else reply.json()

        with SqliteCheckpointer(journal) as store:
            durable = DurableAgent(agent, journal=store, effects={"transfer": Lookup(find)})
            result = await durable.run(PROMPT, run_id=RUN_ID, deps=http)
    print(f"[agent] run {result.run_id}: {result.status}, output {result.output}")


# -- the world outside: a billing provider and a payment service, on loopback -------------------------

class World:
    def __init__(self) -> None:
        self.billed: list[dict[str, Any]] = []
        self.transfers: list[dict[str, Any]] = []
        self.lock = threading.Lock()


def serve(world: World) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: Any) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            try:
                self.wfile.write(raw)
            except OSError:  # the client was killed before it read its answer: the point of the demo
                pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path.endswith("/chat/completions"):
                done = sum(1 for m in body["messages"] if m["role"] == "tool")
                with world.lock:
                    world.billed.append({"key": self.headers.get("Idempotency-Key"), "turn": done})
                self._reply(200, completion(done, body.get("tools") or []))
            else:
                with world.lock:
                    world.transfers.append(body)
                self._reply(200, {"receipt": len(world.transfers), **body})

        def do_GET(self) -> None:
            key = self.path.rsplit("/", 1)[-1]
            found = [t for t in world.transfers if t["key"] == key]
            self._reply(200 if found else 404, found[0] if found else {"error": "not found"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.handle_error = lambda request, address: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def completion(done: int, tools: list[dict[str, Any]]) -> dict[str, Any]:
    if done < len(SCRIPT):
        to, amount = SCRIPT[done]
        call = {"id": f"call_{done}", "type": "function",
                "function": {"name": "transfer", "arguments": json.dumps({"to": to, "amount": amount})}}
    else:
        output = next(t["function"]["name"] for t in tools if t["function"]["name"].startswith("final_result"))
        answer = {"paid": [to for to, _ in SCRIPT], "total": sum(a for _, a in SCRIPT)}
        call = {"id": "call_out", "type": "function", "function": {"name": output, "arguments": json.dumps(answer)}}
    return {"id": f"chatcmpl-{done}", "object": "chat.completion", "created": 0, "model": "stand-in",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                         "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30}}


def main() -> int:
    world = World()
    server = serve(world)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        journal = os.path.join(tmp, "runs.db")
        for crash_at in ("tool.K4:2", None):
            env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
            if crash_at:
                env["CUADERNO_CRASH_AT"] = crash_at
            proc = subprocess.run([sys.executable, __file__, "--agent", journal, f"{url}/v1", url], env=env,
                                  capture_output=True, text=True, timeout=300)
            said = proc.stdout.strip() or proc.stderr.strip()[-2000:]
            print(f"[demo] agent process {'killed at ' + crash_at if crash_at else 'resumed'}: "
                  f"exit {proc.returncode} {said}")
    server.shutdown()
    keys = [b["key"] for b in world.billed]
    print(f"[payments] {len(world.transfers)} transfers: {[(t['to'], t['amount']) for t in world.transfers]}")
    print(f"[provider] {len(world.billed)} requests billed, turns {[b['turn'] for b in world.billed]}, "
          f"every one keyed: {all(keys)}")
    ok = (len(world.transfers) == 2 and len({t["key"] for t in world.transfers}) == 2
          and len(world.billed) == 3 and all(keys) and len(set(keys)) == 3)
    print("OK: each transfer made once, each request billed once" if ok else "FAILED", file=sys.stderr if not ok else
          sys.stdout)
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--agent"]:
        asyncio.run(agent_process(*sys.argv[2:5]))
    else:
        sys.exit(main())
