"""Start runs the way an application does, then go away: ``python start_runs.py URL KIND RUN...``.

``KIND`` is ``agent`` (runs to the end, or until an armed crash point kills this process) or
``approving`` (each run stops at its approval). Prints one ``RUN STATUS`` line per run.
"""

from __future__ import annotations

import asyncio
import sys

import worker_agent

from cuaderno import Session, open_journal


async def main(url: str, kind: str, runs: list[str]) -> None:
    store = open_journal(url)
    try:
        approving = kind == "approving"
        agent = worker_agent.approving_agent if approving else worker_agent.agent
        for run_id in runs:
            gateway = worker_agent.approving_gateway() if approving else worker_agent.gateway_factory()
            result = await agent.run_to_end("pay the accounts", session=Session(run_id, gateway, store))
            print(run_id, result.status, flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
