"""The truth outside cuaderno: a fake OpenAI-compatible provider that bills every request it
receives, and a payment service that keeps a receipt for every transfer it makes.

Both write their log line (and fsync it) before they answer, so a client killed at any moment
leaves the evidence of what reached them. Neither deduplicates: the receipts show every duplicate
a client causes, and the billing log every request paid.

Each server serves many scenarios at once: the first segment of the request path names the
scenario (``URL/<name>/v1/chat/completions``, ``URL/<name>/transfers``), and each scenario has its
own log (``<name>.billing.jsonl``, ``<name>.receipts.jsonl`` in the server's directory).

The provider plays a scripted agent: the first user message holds ``PAY: [[tool, to, amount],
...]``; it calls the k-th tool once k tool results are in the conversation, then answers with the
structured output (the request's output tool, ``final_result*``) listing who was paid. A request
with ``stream: true`` gets the same answer as server-sent chunks.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["Provider", "Receipts", "lines"]


def _append(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def lines(path: Path) -> list[dict[str, Any]]:
    """The records of a log (empty if nothing was written)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class _Quiet(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client SIGKILLed before it read its answer: what the kill tests do on purpose. The
        # log line was written before the answer, so nothing is lost by not answering.
        pass


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = _Quiet(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.owner = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _reply(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(raw)))
    handler.end_headers()
    handler.wfile.write(raw)


def _read(handler: BaseHTTPRequestHandler) -> dict[str, Any]:
    n = int(handler.headers.get("Content-Length") or 0)
    data = json.loads(handler.rfile.read(n) or b"{}")
    return data if isinstance(data, dict) else {}


def _scenario(path: str) -> tuple[str, str]:
    """The scenario a request path names, and the rest of the path."""
    name, _, rest = path.lstrip("/").partition("/")
    return name, "/" + rest


class Provider(_Server):
    """The fake OpenAI-compatible chat completions endpoint, billing to ``<scenario>.billing.jsonl``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.failed: set[tuple[str, int]] = set()
        super().__init__(_ProviderHandler)

    def base_url(self, scenario: str) -> str:
        return f"{self.url}/{scenario}/v1"

    def billing(self, scenario: str) -> list[dict[str, Any]]:
        return lines(self.directory / f"{scenario}.billing.jsonl")


class _ProviderHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        owner: Provider = self.server.owner  # type: ignore[attr-defined]
        body = _read(self)
        scenario, _ = _scenario(self.path)
        messages = body.get("messages") or []
        done = sum(1 for m in messages if m.get("role") == "tool")
        # A scenario named ``fail500-...`` or ``fail429-...`` answers the first request at each
        # position with that status (a 500 after billing it: the answer is lost; a 429 refused).
        status = int(scenario[4:7]) if scenario.startswith(("fail500", "fail429")) else 200
        with owner.lock:
            first = (scenario, done) not in owner.failed
            owner.failed.add((scenario, done))
            billed = status != 429 or not first
            if billed:
                _append(owner.directory / f"{scenario}.billing.jsonl", {"key": self.headers.get("Idempotency-Key"),
                                        "x_key": self.headers.get("X-Idempotency-Key"), "tool_results": done,
                                        "at": time.time()})
        if status != 200 and first:
            _reply(self, status, {"error": {"message": f"scripted {status}", "type": "server_error"}})
            return
        answer = _completion(messages, body.get("tools") or [], done)
        if scenario.startswith("reuseids"):  # a server that numbers tool calls per response, not per run
            for call in answer["choices"][0]["message"].get("tool_calls") or []:
                call["id"] = "call_0"
        if body.get("stream"):
            # A scenario named ``cut-...`` cuts the first stream at each position after two chunks
            # (billed, closed cleanly: no finish reason, no [DONE]).
            _stream(self, answer, cut=scenario.startswith("cut") and first)
            return
        _reply(self, 200, answer)


def _chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """``answer`` as the chat completion chunks a streaming provider sends: the role, then each
    tool call's name and its arguments in two halves (or the text in two halves), then the finish
    reason with the usage."""
    message = answer["choices"][0]["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    for i, call in enumerate(message.get("tool_calls") or []):
        args = call["function"]["arguments"]
        half = len(args) // 2
        deltas.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                       "function": {"name": call["function"]["name"], "arguments": args[:half]}}]})
        deltas.append({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]})
    text = message.get("content")
    if text:
        deltas += [{"content": text[:len(text) // 2]}, {"content": text[len(text) // 2:]}]
    base = {"id": answer["id"], "object": "chat.completion.chunk", "created": 0, "model": answer["model"]}
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": answer["choices"][0]["finish_reason"]}],
                   "usage": answer["usage"]})
    return chunks


def _stream(handler: BaseHTTPRequestHandler, answer: dict[str, Any], *, cut: bool) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    chunks = _chunks(answer)
    for chunk in chunks[:2] if cut else chunks:
        handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        handler.wfile.flush()
    if not cut:
        handler.wfile.write(b"data: [DONE]\n\n")
    handler.wfile.flush()
    handler.close_connection = True


def _script(messages: list[dict[str, Any]]) -> list[list[Any]]:
    for m in messages:
        text = m.get("content")
        if m.get("role") == "user" and isinstance(text, str) and "PAY:" in text:
            return list(json.loads(text.split("PAY:", 1)[1].strip()))
    return []


def _completion(messages: list[dict[str, Any]], tools: list[dict[str, Any]], done: int) -> dict[str, Any]:
    script = _script(messages)
    message: dict[str, Any] = {"role": "assistant", "content": None}
    if done < len(script):
        tool, to, amount = script[done]
        call = {"id": f"call_{done}", "type": "function",
                "function": {"name": tool, "arguments": json.dumps({"to": to, "amount": amount})}}
        message["tool_calls"] = [call]
        finish = "tool_calls"
    else:
        output = next((t["function"]["name"] for t in tools if t["function"]["name"].startswith("final_result")), None)
        paid = [row[1] for row in script]
        total = sum(int(row[2]) for row in script)
        if output is None:
            message["content"] = f"paid {', '.join(paid)}: {total}"
            finish = "stop"
        else:
            message["tool_calls"] = [{"id": f"call_out_{done}", "type": "function",
                                      "function": {"name": output,
                                                   "arguments": json.dumps({"paid": paid, "total": total})}}]
            finish = "tool_calls"
    return {"id": f"chatcmpl-{done}", "object": "chat.completion", "created": 0, "model": "fake-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


class Receipts(_Server):
    """The payment service: ``POST URL/<scenario>/transfers`` pays and keeps a receipt (never
    deduplicating); ``GET URL/<scenario>/transfers/KEY`` answers whether a transfer with that key
    was made; ``/refunds`` the same for refunds (their own log). ``ack_delay``: the seconds it waits after recording before it answers (a remote
    API's latency)."""

    def __init__(self, directory: Path, *, ack_delay: float = 0.0) -> None:
        self.directory = directory
        self.ack_delay = ack_delay
        super().__init__(_ReceiptsHandler)

    def base_url(self, scenario: str) -> str:
        return f"{self.url}/{scenario}"

    def receipts(self, scenario: str) -> list[dict[str, Any]]:
        return lines(self.directory / f"{scenario}.receipts.jsonl")

    def refunds(self, scenario: str) -> list[dict[str, Any]]:
        """The refunds made (``POST URL/<scenario>/refunds``), each kept like a transfer's receipt."""
        return lines(self.directory / f"{scenario}.refunds.jsonl")


class _ReceiptsHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        owner: Receipts = self.server.owner  # type: ignore[attr-defined]
        body = _read(self)
        scenario, rest = _scenario(self.path)
        kind = "refunds" if rest.startswith("/refunds") else "receipts"
        log = owner.directory / f"{scenario}.{kind}.jsonl"
        with owner.lock:
            n = len(lines(log)) + 1
            record = {"receipt": n, "key": body.get("key"), "to": body.get("to"), "amount": body.get("amount")}
            _append(log, record)
        if owner.ack_delay:
            time.sleep(owner.ack_delay)
        _reply(self, 200, record)

    def do_GET(self) -> None:
        owner: Receipts = self.server.owner  # type: ignore[attr-defined]
        scenario, rest = _scenario(self.path)
        kind = "refunds" if rest.startswith("/refunds") else "receipts"
        key = self.path.rsplit("/", 1)[-1]
        with owner.lock:
            found = [r for r in lines(owner.directory / f"{scenario}.{kind}.jsonl") if r.get("key") == key]
        if found:
            _reply(self, 200, found[0])
        else:
            _reply(self, 404, {"error": "no transfer with that key"})
