"""A worker process for the kill tests: ``python worker_main.py ADDRESS QUEUE JOURNAL LEDGER BILLING POLICY``.

Prints ``READY`` once polling; ``CUADERNO_CRASH_AT`` arms a crash point (SIGKILL of itself).
``PROVIDER_DEDUP=0`` makes the fake provider bill every request, its idempotency key ignored.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from temporal_app import SCRIPT, make_agent
from temporalio.client import Client

from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.temporal import build_worker


async def main(address: str, queue: str, journal: str, ledger: str, billing: str, policy: str) -> None:
    client = await Client.connect(address)
    worker = build_worker(client, make_agent(ledger), task_queue=queue, journal_url=journal, effect_policy=policy,
                          gateway_factory=lambda: ScriptedGateway(SCRIPT, stripe=os.environ.get("PROVIDER_DEDUP") != "0",
                                                                  billing_log=billing))
    async with worker:
        print("READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
