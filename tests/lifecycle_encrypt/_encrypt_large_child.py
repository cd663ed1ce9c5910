"""A child process of the large-payload test: ``python _encrypt_large_child.py MODE JOURNAL SECRET LEDGER``.

The journal is opened with the key in ``CUADERNO_KEY`` (set by the parent). The run's one tool
returns about 2 MB of text holding ``SECRET`` and appends a line to ``LEDGER`` each time it runs
(the independent record of how often it was called: not the journal).

- ``record``: runs the agent; armed by the parent with ``CUADERNO_CRASH_AT=tool.K7:1``, it is
  SIGKILLed right after the commit that holds the tool's result.
- ``resume``: resumes the run to its end from the journal and prints its status, and ``SEEN`` if
  the model's request on resume carried the tool's result (read back from the journal).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from cuaderno import Agent, ScriptedGateway, Session, open_journal, tool

SIZE = 2_000_000


def main() -> None:
    mode, url, token, ledger = sys.argv[1:5]

    @tool
    def fetch_page(page: str) -> dict[str, Any]:
        """Fetch a page."""
        with open(ledger, "a") as f:
            f.write(f"called {page}\n")
            f.flush()
            os.fsync(f.fileno())
        # Random hex (it compresses to about half, as real data would), the secret in its middle.
        half = os.urandom(SIZE // 4).hex()
        return {"data": f"{half}{token}{half}"}

    store = open_journal(url)
    try:
        gateway = ScriptedGateway([ScriptedGateway.call("fetch_page", page="p1"), ScriptedGateway.text("read it")])
        agent = Agent(instructions="read the page", tools=[fetch_page], name="reader")
        result = asyncio.run(agent.run_to_end("read p1", session=Session("big-1", gateway, store)))
        print("STATUS", result.status, flush=True)
        if mode == "resume" and any(token in str(m.get("content")) for r in gateway.requests for m in r.messages):
            print("SEEN", flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    main()
