"""Release N worker processes at one barrier on one run (RELIABILITY R4/R5).

    python _race.py JOURNAL_URL RACERS WORK_DIR

Imports cuaderno and the takeover workload (``WORK_DIR/takeover_workload.py``) once, then forks
``RACERS`` children. Each opens its own store, says it is ready, and blocks on one pipe; once all
are ready the parent writes one byte per child, so they all call ``agent.run`` on run ``run`` at
the same moment. Prints one JSON line: each child's verdict (``done``, ``busy``, ``fenced`` or
``crashed: ...``). The receipts (``WORK_DIR/receipts.jsonl``) and the bill
(``WORK_DIR/billing.jsonl``) are the truth; the verdicts only say who ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from pathlib import Path


def child(url: str, work: Path, ready_w: int, go_r: int) -> str:
    from takeover_workload import agent, script  # type: ignore[import-not-found]

    from cuaderno import FencedOut, RunBusy, ScriptedGateway, Session, open_journal

    try:
        store = open_journal(url)
    finally:
        # Ready even when the open failed: the parent waits for one byte per child, and the
        # others (which hold the pipe's write end too) wait at the barrier, so a child that
        # failed silently would hang the race instead of reporting its verdict.
        os.write(ready_w, b"r")
    try:
        gw = ScriptedGateway(script(), billing_log=work / "billing.jsonl")
        os.read(go_r, 1)  # the barrier

        async def run() -> str:
            steps = [s async for s in agent(str(work / "receipts.jsonl"), None).run(
                "pay bob", session=Session("run", gw, store))]
            return "done" if steps else "done-empty"

        try:
            return asyncio.run(run())
        except RunBusy:
            return "busy"
        except FencedOut:
            return "fenced"
    finally:
        store.close()


def main() -> None:
    url, racers, work = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    sys.path.insert(0, str(work))
    import cuaderno  # imported once, before the forks
    import cuaderno.journal.postgres  # noqa: F401

    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pids = []
    for i in range(racers):
        pid = os.fork()
        if pid == 0:
            try:
                verdict = child(url, work, ready_w, go_r)
            except BaseException as exc:  # reported to the test, which fails on it
                verdict = f"crashed: {type(exc).__name__}: {exc} {traceback.format_exc()[-400:]}"
            (work / f"verdict.{i}").write_text(verdict)
            os._exit(0)
        pids.append(pid)
    os.close(ready_w)  # only the children write it now: if they all die, the read below ends
    got = 0
    while got < racers:  # every child has opened its store
        chunk = os.read(ready_r, racers - got)
        if not chunk:
            break
        got += len(chunk)
    os.write(go_w, b"g" * racers)
    for pid in pids:
        os.waitpid(pid, 0)
    verdicts = [(work / f"verdict.{i}").read_text() if (work / f"verdict.{i}").exists() else "crashed: no verdict"
                for i in range(racers)]
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main()
