"""The model-call seam: how the loop sends one model request of one step.

The loop (:mod:`cuaderno.loop._model_steps`) hands a :class:`ModelCaller` the request, the run
and step it belongs to, and the idempotency key; it gets the response back, or the
:class:`~cuaderno.errors.GatewayError` it classifies and journals. :class:`TracedGateway`, the
default, sends it through the session's gateway inside a ``chat`` span (:mod:`cuaderno.telemetry`):
the loop body itself opens no span.

Under Temporal, a workflow plugs a caller that runs a model activity instead, given references
(run id, step id, idempotency key) rather than the conversation; the activity re-derives the
request from cuaderno's journal, sends it, and opens the span where the call really happens.
"""

from __future__ import annotations

from typing import Protocol

from cuaderno import telemetry
from cuaderno.gateway.base import ModelGateway, ModelRequest, ModelResponse

__all__ = ["ModelCaller", "TracedGateway"]


class ModelCaller(Protocol):
    """Sends a step's model request."""

    async def call(self, request: ModelRequest, *, run_id: str, step_id: str, idempotency_key: str) -> ModelResponse:
        """One send: the response, or a classified :class:`~cuaderno.errors.GatewayError`."""
        ...


class TracedGateway:
    """The default caller: the gateway, one ``chat`` span per send."""

    def __init__(self, gateway: ModelGateway) -> None:
        self.gateway = gateway
        self._provider: str | None = None

    @property
    def provider(self) -> str:
        """``gen_ai.provider.name`` of every chat span (the conventions require it). Worked out at
        the first send, not per pass: naming an HTTP gateway by its host costs a few microseconds."""
        if self._provider is None:
            self._provider = telemetry.provider_name(self.gateway)
        return self._provider

    async def call(self, request: ModelRequest, *, run_id: str, step_id: str, idempotency_key: str) -> ModelResponse:
        with telemetry.model_call(request, run_id=run_id, step_id=step_id, provider=self.provider) as span:
            response = await self.gateway.complete(request, idempotency_key=idempotency_key)
            span.response(response)
        return response
