"""A hard cap on response body size, with bounded memory, installed as ``httpx2`` event hooks.

Why hooks and not a parse-time check: by the time an SDK hands back a response, ``httpx2`` has
already joined the whole body in memory. The response hook runs after the headers arrive and
*before* the body is read, so it can refuse on ``Content-Length`` without reading a byte, and
otherwise wrap the body stream so reading stops as soon as the cap is passed. The hook never
consumes the body itself (doing so breaks the SDK's own parsing); it only wraps the stream.

Compressed bodies: the request hook asks for ``Accept-Encoding: identity`` (chat answers are
small; the bandwidth is worth a hard memory bound). A server that compresses anyway is still
bounded: gzip/deflate bodies are inflated on the side in bounded pieces just to *count* the
decoded size, so a small compressed "bomb" is refused before ``httpx2`` inflates it.
"""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2

from cuaderno.gateway._errors import ResponseTooLarge

__all__ = ["install_body_limit"]

_INFLATE_STEP = 64 * 1024
"""Largest piece inflated at once while counting; the only decoded bytes held by the counter."""

_MARK = "_cuaderno_body_limit"
"""Attribute set on our hooks, so installing twice on a shared client does not stack them."""


def install_body_limit(client: httpx2.AsyncClient, max_body_bytes: int) -> None:
    """Refuse response bodies larger than ``max_body_bytes`` on every request ``client`` makes.

    Idempotent per client; a later call replaces the limit.

    Raises:
        ValueError: ``max_body_bytes`` is not positive.
    """
    if max_body_bytes <= 0:
        raise ValueError("max_body_bytes must be positive")
    hooks = client.event_hooks
    request_hooks = [h for h in hooks.get("request", []) if not getattr(h, _MARK, False)]
    response_hooks = [h for h in hooks.get("response", []) if not getattr(h, _MARK, False)]
    client.event_hooks = {"request": [*request_hooks, _request_hook()],
                          "response": [*response_hooks, _response_hook(max_body_bytes)]}


def _marked(hook: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
    setattr(hook, _MARK, True)
    return hook


def _request_hook() -> Callable[[Any], Awaitable[None]]:
    async def ask_identity(request: httpx2.Request) -> None:
        request.headers["Accept-Encoding"] = "identity"
    return _marked(ask_identity)


def _response_hook(limit: int) -> Callable[[Any], Awaitable[None]]:
    async def cap(response: httpx2.Response) -> None:
        declared = _content_length(response)
        if declared is not None and declared > limit:
            # Refused on the header alone: httpx2 closes the response without reading the body.
            raise ResponseTooLarge(limit, declared=declared)
        encoding = response.headers.get("content-encoding", "").strip().lower()
        response.stream = _CappedStream(response.stream, limit, encoding)
    return _marked(cap)


def _content_length(response: httpx2.Response) -> int | None:
    raw = response.headers.get("content-length")
    if raw is None:
        return None
    try:
        return int(raw.split(",")[0].strip())
    except ValueError:
        return None


class _CappedStream(httpx2.AsyncByteStream):
    """Passes raw chunks through, raising :class:`ResponseTooLarge` once the cap is passed."""

    def __init__(self, inner: Any, limit: int, encoding: str) -> None:
        self._inner = inner
        self._limit = limit
        self._raw = 0
        self._decoded = 0
        self._inflater = _inflater(encoding)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._raw += len(chunk)
            if self._raw > self._limit:
                raise ResponseTooLarge(self._limit, read=self._raw)
            self._count_decoded(chunk)
            yield chunk

    def _count_decoded(self, chunk: bytes) -> None:
        if self._inflater is None:
            return
        data = chunk
        try:
            while data:
                out = self._inflater.decompress(data, _INFLATE_STEP)
                self._decoded += len(out)
                if self._decoded > self._limit:
                    raise ResponseTooLarge(self._limit, read=self._decoded)
                data = self._inflater.unconsumed_tail
                if not out and not data:
                    break
        except zlib.error:
            # Not our job to judge the encoding: stop counting and let httpx2 raise its DecodingError.
            self._inflater = None

    async def aclose(self) -> None:
        close = getattr(self._inner, "aclose", None)
        if close is not None:
            await close()


def _inflater(encoding: str) -> Any:
    """A side decompressor used only to count decoded bytes (``None`` for identity/unknown)."""
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj(32 + zlib.MAX_WBITS)  # zlib-wrapped (the common case) or gzip
    return None
