"""A child process of the memory-bound test: ``python _offload_mem_child.py MODE JOURNAL SIZE``.

- ``floor``: imports what the run imports and builds one ``SIZE``-character string the way the
  tool does, nothing else: the baseline the bound is stated against.
- ``record``: runs the agent whose one tool returns ``SIZE`` characters (hex text: it compresses
  to about half, as real data would, not to nothing), its result journaled (offloaded); armed by
  the parent with ``CUADERNO_CRASH_AT=tool.K7:1``, it is SIGKILLed right after the commit that
  holds the tool's result.
- ``resume``: resumes the run to its end from the journal (the tool is not called again: it would
  print ``TOOL CALLED``), and prints the final status.

The parent reads each child's peak RSS from ``os.wait4`` (the kernel's record, not the child's).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from cuaderno import Agent, ScriptedGateway, Session, open_journal, tool


def payload(size: int) -> str:
    return os.urandom(size // 2).hex()  # one 50 MB str (an even size), its bytes freed


@tool
def dump(size: int) -> dict[str, Any]:
    """Return ``size`` characters of text."""
    print("TOOL CALLED", flush=True)
    return {"data": payload(size)}


def main() -> None:
    mode, url, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "floor":
        kept = payload(size)
        print("FLOOR", len(kept), flush=True)
        return
    store = open_journal(url)
    store.max_payload = 2 * size + 1_000_000  # type: ignore[attr-defined]
    if os.environ.get("OFFLOAD_ABOVE"):  # the benchmark's comparison: the payload kept in its row
        store.offload_above = int(os.environ["OFFLOAD_ABOVE"])  # type: ignore[attr-defined]
    try:
        gateway = ScriptedGateway([ScriptedGateway.call("dump", size=size), ScriptedGateway.text("stored it")])
        agent = Agent(instructions="dump it", tools=[dump], name="dumper")
        result = asyncio.run(agent.run_to_end("dump", session=Session("mem-1", gateway, store)))
        print("STATUS", result.status, flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    main()
