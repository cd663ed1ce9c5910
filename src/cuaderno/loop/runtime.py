"""The runtime seam: the clock, the random source, waiting, and the name of this process.

Nothing in the loop's decision path (retry backoff and its jitter, how long ``cancel`` waits for
a holder, which owner a takeover records, which thread holds a run) reads the process's clock,
randomness, host name, pid or thread directly: it asks the :class:`Runtime` on its
:class:`~cuaderno.loop.agent.Session`, and the default one asks the process.

Under Temporal, a workflow plugs its own runtime here: ``workflow.now()`` as the clock,
``workflow.random()`` as the random source (the same numbers on every replay), a workflow timer
as ``sleep``, and the workflow id as the owner, so that replaying the unchanged runner inside the
workflow takes the same decisions it took the first time.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["DEFAULT_RUNTIME", "Runtime"]


class Runtime:
    """What the loop asks of the world it runs in. The default is the process's.

    Args:
        seed: seeds the random source (retry jitter). ``None``: seeded from the system.
        sleep: how to wait between retries (injectable for tests).
    """

    def __init__(self, *, seed: int | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.random = random.Random(seed)
        """The random source of every jittered wait."""
        self._sleep = sleep

    def now(self) -> float:
        """Wall-clock seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for deadlines."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Wait inside the loop (a retry's backoff)."""
        await self._sleep(seconds)

    def block(self, seconds: float) -> None:
        """Wait outside any event loop (``cancel`` waiting for a holder to let a run go)."""
        time.sleep(seconds)

    def owner(self) -> str:
        """Names this process in a run's fencing record."""
        return f"{socket.gethostname()}:{os.getpid()}"

    def process(self) -> int:
        """This process's id, for messages that name it."""
        return os.getpid()

    def thread(self) -> int:
        """The calling thread, as the holds of this process tell loops apart."""
        return threading.get_ident()


DEFAULT_RUNTIME = Runtime()
"""The process's runtime, for the functions that run without a :class:`~cuaderno.loop.agent.Session`
(``cancel``, ``compensate``) when their caller gives none."""
