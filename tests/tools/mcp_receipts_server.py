"""A tiny MCP server (FastMCP, stdio) that records every tool execution in a receipts file.

The receipts are the server's own record, written (and fsynced) before it replies: a crash test
proves from them, not from cuaderno's journal, how many times a tool body ran.

Usage: python mcp_receipts_server.py RECEIPTS
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from mcp.server.fastmcp import Context, FastMCP

RECEIPTS = sys.argv[1]
app = FastMCP("receipts")


def _key(ctx: Context) -> str | None:  # type: ignore[type-arg]
    meta = ctx.request_context.meta
    extra = (meta.model_extra or {}) if meta is not None else {}
    key = extra.get("cuaderno/effect_key")
    return key if isinstance(key, str) else None


def _receipts() -> list[dict[str, Any]]:
    try:
        with open(RECEIPTS, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _record(entry: dict[str, Any]) -> None:
    with open(RECEIPTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


@app.tool()
def book(room: str, ctx: Context) -> str:  # type: ignore[type-arg]
    """Book a room (not idempotent: each execution is a booking)."""
    _record({"tool": "book", "room": room, "key": _key(ctx)})
    return f"booked {room}"


@app.tool()
def note(text: str, ctx: Context) -> str:  # type: ignore[type-arg]
    """Write a note; deduplicated by the effect key in the request's _meta."""
    key = _key(ctx)
    if key is not None and any(r["key"] == key for r in _receipts()):
        return f"noted {text}"  # the same intent again: applied once
    _record({"tool": "note", "text": text, "key": key})
    return f"noted {text}"


@app.tool()
def fail(reason: str) -> str:
    """Always reports an error."""
    raise ValueError(f"cannot: {reason}")


@app.tool()
def crash(room: str, ctx: Context) -> str:  # type: ignore[type-arg]
    """Books, then the server dies before it replies."""
    _record({"tool": "crash", "room": room, "key": _key(ctx)})
    os._exit(7)


if __name__ == "__main__":
    app.run()
