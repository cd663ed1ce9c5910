"""A worker process that holds one run of a Postgres journal, for the liveness tests.

    python _pg_holder.py URL RUN DIR

Takes the run over, writes ``DIR/held`` (its epoch and its lock connection's backend pid), waits
until ``DIR/go`` exists, then appends one intent with its epoch and writes what happened to
``DIR/outcome`` (``ok`` or the error's class name). It never releases the run on purpose.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from cuaderno import open_journal
from cuaderno.events import StepEvent
from cuaderno.journal.postgres import PostgresCheckpointer


def main() -> None:
    url, run, where = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    store = open_journal(url)
    assert isinstance(store, PostgresCheckpointer)
    epoch = store.acquire(run, "holder")
    (where / "held.tmp").write_text(json.dumps({"epoch": epoch, "backend": store.holder_pid(), "pid": os.getpid()}))
    os.replace(where / "held.tmp", where / "held")
    while not (where / "go").exists():  # the test says when; a file, since it may stop this process meanwhile
        time.sleep(0.01)
    try:
        store.append([StepEvent(run_id=run, step_id="t0000.tool00", phase="intent", kind="tool", name="pay",
                                fingerprint="f", payload={"by": "holder"})], epoch=epoch)
        outcome = "ok"
    except Exception as exc:  # reported to the test, which asserts on it
        outcome = type(exc).__name__
    (where / "outcome").write_text(outcome)
    os._exit(0)  # without close(): a holder that stops, not one that releases


if __name__ == "__main__":
    main()
