"""A worker process for the kill tests: ``python worker_main.py ADDRESS QUEUE JOURNAL LEDGER BILLING POLICY``.

Prints ``READY`` once polling; ``CUADERNO_CRASH_AT`` arms a crash point (SIGKILL of itself).
``PROVIDER_DEDUP=0`` makes the fake provider bill every request, its idempotency key ignored.
``PROVIDER_DELAY=SECONDS`` makes each model call wait that long before the provider answers (a
call in flight long enough for a kill at a random moment to land inside it); with
``PROVIDER_SAYS_SENDING=1`` it prints ``SENDING`` when a call starts. SIGTERM shuts the worker down
gracefully (as a deploy does) and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from temporal_app import SCRIPT, make_agent
from temporalio.client import Client

from cuaderno.gateway.base import ModelGateway, ModelRequest, ModelResponse
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.temporal import build_worker


class SlowProvider:
    """The fake provider, answering after a delay (the request is billed when it answers)."""

    def __init__(self, gateway: ModelGateway, delay: float) -> None:
        self.gateway, self.delay = gateway, delay

    async def complete(self, request: ModelRequest, *, idempotency_key: str) -> ModelResponse:
        if os.environ.get("PROVIDER_SAYS_SENDING") == "1":
            print("SENDING", flush=True)
        await asyncio.sleep(self.delay)
        return await self.gateway.complete(request, idempotency_key=idempotency_key)


def provider(billing: str) -> ModelGateway:
    gateway = ScriptedGateway(SCRIPT, stripe=os.environ.get("PROVIDER_DEDUP") != "0", billing_log=billing)
    delay = float(os.environ.get("PROVIDER_DELAY") or 0)
    return SlowProvider(gateway, delay) if delay else gateway


async def main(address: str, queue: str, journal: str, ledger: str, billing: str, policy: str) -> None:
    client = await Client.connect(address)
    worker = build_worker(client, make_agent(ledger), task_queue=queue, journal_url=journal, effect_policy=policy,
                          gateway_factory=lambda: provider(billing))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with worker:
        print("READY", flush=True)
        await stop.wait()
    # Leaving the block shut the worker down: activities in flight were cancelled and reported.


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
    # The worker has shut down (the block above returned). Exit without the interpreter's
    # finalization: under load it sometimes raced the SDK core's own threads and died of SIGSEGV
    # after a clean shutdown (seen once in a full run), which a test would read as an unclean one.
    sys.stdout.flush()
    os._exit(0)
