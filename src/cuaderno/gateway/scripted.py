"""``ScriptedGateway``: a model that answers from a script and counts every call.

It is public API, for tests and demos: a test can assert "the resume paid 0 model calls" only if
the fake counts. With ``stripe=True`` it enforces provider idempotency the way Stripe does: the
same key with the same body replays the stored answer (not billed again); the same key with a
different body is rejected.

With ``billing_log=PATH`` every billed generation is appended (and fsynced) to a JSON-lines file
before the answer is returned (read it with ``cuaderno.records.read_records``). That file
is the fake provider's own billing record: independent of cuaderno's journal, shared by every
process that uses the same path, so a crash test can prove what was paid from a record cuaderno
did not write. With ``stripe=True`` the log is also the
provider's idempotency store across processes.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuaderno import faults
from cuaderno.errors import IdempotencyKeyReuse
from cuaderno.fingerprint import fingerprint
from cuaderno.gateway.base import ModelRequest, ModelResponse, ToolCall, Usage
from cuaderno.gateway.rate import RateLimit
from cuaderno.plainjson import JSONObject
from cuaderno.records import append_synced, read_records

if TYPE_CHECKING:
    from cuaderno.events.payloads import Response

__all__ = ["ScriptedGateway"]

Script = Sequence[ModelResponse] | Callable[[ModelRequest], ModelResponse]


class ScriptedGateway:
    """A :class:`~cuaderno.gateway.base.ModelGateway` that answers from a script.

    Args:
        script: a list of responses, picked by *turn* (the number of assistant messages already
            in the request), so a resumed process with a new gateway object gets the answer for
            the turn it is at; or a function of the request.
        stripe: enforce Stripe idempotency semantics on the key.
        billing_log: append every billed generation to this JSON-lines file (see module docs).
        cost: the price reported per billed call (``None`` = unpriced).
        rate_limit: a shared :class:`~cuaderno.RateLimit` its requests keep, as a real gateway's
            do (tests and benchmarks of the limiter without a provider).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, script: Script, *, stripe: bool = False, billing_log: str | os.PathLike[str] | None = None,
                 cost: float | None = 0.001, rate_limit: RateLimit | None = None) -> None:
        self._script = script
        self.rate_limit = rate_limit
        self.stripe = stripe
        self.cost = cost
        self.billing_log = Path(billing_log) if billing_log is not None else None
        self.calls = 0
        """Every ``complete`` call, answered or not."""
        self.billed = 0
        """Generations this object produced (a Stripe replay is not billed)."""
        self.replayed = 0
        """Calls answered from the idempotency store."""
        self.keys: list[str] = []
        self.requests: list[ModelRequest] = []
        self._store: dict[str, tuple[str, Response]] = {}
        self._lock = threading.Lock()
        for rec in read_records(self.billing_log) if self.billing_log is not None else ():
            self._store.setdefault(rec["key"], (rec["fingerprint"], rec["response"]))

    # -- building responses ------------------------------------------------------------------------

    @staticmethod
    def text(text: str, *, cost: float | None = None, input_tokens: int = 10, output_tokens: int = 5) -> ModelResponse:
        """A final text answer."""
        return ModelResponse(text=text, finish_reason="stop", cost=cost,
                             usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens))

    @staticmethod
    def call(name: str, /, *, call_id: str | None = None, cost: float | None = None, **arguments: Any) -> ModelResponse:
        """A response that asks for one tool call."""
        return ScriptedGateway.parallel((name, arguments), call_id=call_id, cost=cost)

    @staticmethod
    def parallel(*calls: tuple[str, JSONObject], call_id: str | None = None,
              cost: float | None = None) -> ModelResponse:
        """A response that asks for several tool calls, in order."""
        tool_calls = tuple(ToolCall(id=call_id or f"call_{i}_{name}", name=name, arguments=args)
                           for i, (name, args) in enumerate(calls))
        return ModelResponse(tool_calls=tool_calls, finish_reason="tool_calls", cost=cost,
                             usage=Usage(input_tokens=10, output_tokens=5))

    @staticmethod
    def empty() -> ModelResponse:
        """An empty 200: no text, no tool call, no price."""
        return ModelResponse(finish_reason="stop", cost=None, usage=Usage(input_tokens=10, output_tokens=0))

    # -- the gateway -------------------------------------------------------------------------------

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        """Answer from the script, counting the call."""
        body_fp = fingerprint(request.body())
        with self._lock:
            self.calls += 1
            self.keys.append(idempotency_key)
            self.requests.append(request)
            if self.stripe and idempotency_key in self._store:
                stored_fp, stored = self._store[idempotency_key]
                if stored_fp != body_fp:
                    raise IdempotencyKeyReuse(
                        f"idempotency key {idempotency_key!r} was already used for a different request body")
                self.replayed += 1
                return ModelResponse.from_json(stored)
        faults.point("model.K3")  # request written, not yet accepted
        response = self._answer(request)
        if response.cost is None and self.cost is not None and (response.text or response.tool_calls):
            response = _with_cost(response, self.cost)
        with self._lock:
            self.billed += 1
            self._store[idempotency_key] = (body_fp, response.to_json())
            if self.billing_log is not None:
                append_synced(self.billing_log, {"key": idempotency_key, "fingerprint": body_fp,
                                                 "response": response.to_json()})
        faults.point("model.K4")  # accepted and billed, answer not yet read by the caller
        return response

    def _answer(self, request: ModelRequest) -> ModelResponse:
        if callable(self._script):
            return self._script(request)
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        if turn >= len(self._script):
            return self._script[-1]
        return self._script[turn]


def _with_cost(response: ModelResponse, cost: float) -> ModelResponse:
    return dataclasses.replace(response, cost=cost)
