"""Submit one run and print its handle as JSON: ``python flowq_submit.py URL GO_FILE KEY``.

Waits for ``GO_FILE`` to exist first, so that many processes (journal opened, ready) submit at
the same moment.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import flowq_agent

from cuaderno import open_journal
from cuaderno.flow import submit


def main(url: str, go: str, key: str) -> None:
    store = open_journal(url)
    try:
        print("ready", flush=True)
        while not Path(go).exists():
            time.sleep(0.001)
        handle = submit(store, flowq_agent.agent, f"key={key} one business request", idempotency_key=key)
        print(json.dumps({"run_id": handle.run_id, "created": handle.created}), flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    main(*sys.argv[1:4])
