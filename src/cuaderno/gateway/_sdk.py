"""What the two SDK gateways share: one request per call, the size cap, one error mapping.

Subclasses say how to build the request (``_request_kwargs``), how to send it through their SDK's
raw-response API (``_create``) and how to parse the body (``_parse``); sending, bounding, mapping
failures and the preflight live here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cuaderno.gateway._common import enforce_size, preflight_reachable, reraise
from cuaderno.gateway.base import ModelRequest, ModelResponse

__all__ = ["SdkGateway"]


class SdkGateway:
    """Base of :class:`~cuaderno.gateway.openai.OpenAIGateway` and
    :class:`~cuaderno.gateway.anthropic.AnthropicGateway`."""

    provider_name: str = ""
    """``gen_ai.provider.name`` for telemetry, and the name errors are mapped under."""
    _client: Any
    _timeout: Any
    idempotency_header: str | None
    max_body_bytes: int

    async def aclose(self) -> None:
        """Close the underlying HTTP client."""
        await self._client.close()

    async def preflight(self) -> None:
        """Check that the endpoint accepts connections (one TCP connect, no request), so a run on
        an unreachable endpoint fails before its first journal write."""
        await preflight_reachable(self._client.base_url, self.provider_name)

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        """Send one request through the SDK (retries off) and parse it.

        Returns:
            The parsed response, to be journaled whole. Replay rebuilds the next context from
            ``text`` and ``tool_calls`` (in order; a call with ``arguments_error`` never runs);
            ``usage`` and ``cost`` are the accounting (``cost=None`` is unpriced, never free);
            ``finish_reason`` is native and unmapped; ``provider_request_id`` and ``body_sha256``
            are evidence only, never compared.

        Raises:
            GatewayError: every failure, classified by :mod:`cuaderno.gateway._errors`.
            UsageError: the request cannot be expressed (unknown role, ``require_tool`` without tools).
        """
        kwargs = self._request_kwargs(request)
        headers = {self.idempotency_header: idempotency_key} if self.idempotency_header else {}
        try:
            raw = await self._create(kwargs, headers)
            body = await raw.http_response.aread()
            enforce_size(body, self.max_body_bytes)
        except Exception as exc:
            raise reraise(exc, self.provider_name) from exc
        return self._parse(body, raw.http_response.headers, request)

    async def _create(self, kwargs: dict[str, Any], headers: dict[str, str]) -> Any:
        raise NotImplementedError

    def _request_kwargs(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _parse(self, raw: bytes, headers: Mapping[str, str], request: ModelRequest) -> ModelResponse:
        raise NotImplementedError
