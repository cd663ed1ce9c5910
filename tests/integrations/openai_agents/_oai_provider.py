"""A fake OpenAI-compatible provider on loopback that bills every request it answers: the truth
about model calls, independent of cuaderno's journal.

``python _oai_provider.py --billing FILE [--port 0] [--delay S]`` serves ``POST
/v1/chat/completions`` and prints ``PROVIDER READY port=<port>``. Before each reply it appends one
line to FILE (written and fsynced): the request's number, its ``Idempotency-Key`` and
``X-Idempotency-Key`` headers (``null`` when absent), the turn it answered and the body's hash.
A ``[run=ID]`` in the first user message is billed as the request's ``run`` (how a peer's requests,
which carry no key, are told apart). It never deduplicates: a request sent twice is billed twice, as a provider that ignores the key.

The answers are a script, decided by the request alone (so a replay that sends the same request
gets the same answer): the number of assistant messages in the conversation is the turn.

- turn 0: two parallel ``transfer`` calls (ana 10, bob 20)
- turn 1: ``transfer`` (carol 30) and ``balance`` (effect-free)
- turn 2: ``transfer`` (dave 40)
- turn 3: ``transfer`` (erin 50) and ``notify`` (no lookup: non-idempotent)
- turn 4: the final answer, as JSON when the request asks for a schema, else text.

A request with ``X-Kill-At-Turn: T`` and ``X-Client-Pid: P`` headers, at turn T, is billed and then
its client is SIGKILLed before it reads the answer (a kill in a model call's flight, the same for
any runner). A request for the model ``status-NNN`` is answered with that HTTP error, unbilled. A request with
``"stream": true`` gets the same answer as server-sent chunks (billed once, like any request);
with ``X-Cut-Stream-At-Turn: T``, at turn T the stream stops after its first chunk.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SCRIPT: list[list[tuple[str, dict[str, Any]]]] = [
    [("transfer", {"to": "ana", "amount": 10}), ("transfer", {"to": "bob", "amount": 20})],
    [("transfer", {"to": "carol", "amount": 30}), ("balance", {"account": "ops"})],
    [("transfer", {"to": "dave", "amount": 40})],
    [("transfer", {"to": "erin", "amount": 50}), ("notify", {"message": "5 transfers sent"})],
]
TRANSFERS = 5
TOTAL = 150


def answer(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    messages = body.get("messages") or []
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    usage = {"prompt_tokens": 100 + 10 * len(messages), "completion_tokens": 20, "total_tokens": 120 + 10 * len(messages)}
    if turn < len(SCRIPT):
        calls = [{"id": f"call_{turn}_{i}", "type": "function",
                  "function": {"name": name, "arguments": json.dumps(args)}}
                 for i, (name, args) in enumerate(SCRIPT[turn])]
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    else:
        schema = (body.get("response_format") or {}).get("type") == "json_schema"
        content = json.dumps({"transfers": TRANSFERS, "total": TOTAL}) if schema else f"sent {TRANSFERS} transfers"
        message, finish = {"role": "assistant", "content": content}, "stop"
    return turn, {"id": f"chatcmpl-{turn}", "object": "chat.completion", "created": 0, "model": body.get("model"),
                  "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body.get("messages") or [] if isinstance(m, dict)]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.loads(raw or b"{}")
        model = str(body.get("model") or "")
        if model.startswith("status-"):  # an error answer (not billed): "status-401", "status-500"
            data = json.dumps({"error": {"message": f"fake {model}", "type": "fake", "code": None}}).encode()
            self.send_response(int(model.split("-")[1]))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        turn, reply = answer(body)
        if self.server.delay:
            time.sleep(self.server.delay)
        first = next((m.get("content") for m in messages_of(body) if m.get("role") == "user"), "") or ""
        run = first.split("[run=", 1)[1].split("]", 1)[0] if "[run=" in str(first) else None
        self.server.bill({"run": run, "key": self.headers.get("Idempotency-Key"), "x_key": self.headers.get("X-Idempotency-Key"),
                          "turn": turn, "sha": hashlib.sha256(raw).hexdigest()[:16],
                          "retry_count": self.headers.get("x-stainless-retry-count")})
        kill_turn, pid = self.headers.get("X-Kill-At-Turn"), self.headers.get("X-Client-Pid")
        if kill_turn is not None and pid and int(kill_turn) == turn:
            # Billed, then the client dies before it reads the answer: a model call's K4, from outside.
            os.kill(int(pid), signal.SIGKILL)
            return
        if body.get("stream"):
            self._stream(reply, cut=self.headers.get("X-Cut-Stream-At-Turn") == str(turn))
            return
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, reply: dict[str, Any], *, cut: bool) -> None:
        """The same answer as server-sent chunks, the way the Chat Completions API streams it:
        the text in pieces, each tool call's name then its arguments in two pieces, the finish
        reason, then (the SDK asks for ``include_usage``) a last chunk with the usage. ``cut``:
        the connection closes after the first chunk, in the middle of the body it announced
        (billed, never finished: the client's HTTP layer sees a body cut short)."""
        message = reply["choices"][0]["message"]
        base = {"id": reply["id"], "object": "chat.completion.chunk", "created": 0, "model": reply["model"]}
        deltas: list[dict[str, Any]] = [{"role": "assistant"}]
        text = message.get("content") or ""
        deltas += [{"content": text[i:i + 8]} for i in range(0, len(text), 8)]
        for i, call in enumerate(message.get("tool_calls") or []):
            args = call["function"]["arguments"]
            deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": args[:5]}}]})
            deltas.append({"tool_calls": [{"index": i, "function": {"arguments": args[5:]}}]})
        chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reply["choices"][0]["finish_reason"]}]})
        chunks.append({**base, "choices": [], "usage": reply["usage"]})
        body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        first = len(b"data: " + json.dumps(chunks[0]).encode() + b"\n\n")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body[:first] if cut else body)
        self.wfile.flush()
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, billing: str, delay: float) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.billing, self.delay = billing, delay
        self.lock = threading.Lock()
        self.n = 0

    def server_bind(self) -> None:  # no reverse DNS lookup
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()

    def bill(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.n += 1
            with open(self.billing, "a", encoding="utf-8") as f:
                f.write(json.dumps({"n": self.n, **record}, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--billing", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.0)
    a = p.parse_args()
    server = _Server(a.port, a.billing, a.delay)
    print(f"PROVIDER READY port={server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
