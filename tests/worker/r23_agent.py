"""``worker_agent``'s agents with a second place to hold a tool step: after the call.

``WORKER_GATE_AFTER`` (a file path): the first effect's body, once the ledger has applied it,
touches ``<gate>.inflight`` and waits until the file exists before it returns, so the step sits
between its call and its result write. The agents are ``worker_agent``'s own objects (same
definition, same versions): runs started with one are driven with the other.

``R23_BODY_DELAY`` (seconds): every effect's body waits a random time up to that before its call,
so that a session ended at a random moment often finds a tool step in flight (the chaos run).

``R23_HOSTNAME``: this process says it runs on that host (``socket.gethostname``), so that a worker
on this machine sees it as a holder on another host, whose liveness it cannot know.
"""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import worker_agent

if os.environ.get("R23_HOSTNAME"):
    _name = os.environ["R23_HOSTNAME"]
    socket.gethostname = lambda: _name

approving_agent = worker_agent.approving_agent
approving_gateway = worker_agent.approving_gateway

_post = worker_agent._client.post_effect
_held = [False]


def _post_then_wait(key: str, effect: str, args: Any, business_id: str | None = None) -> Any:
    delay = float(os.environ.get("R23_BODY_DELAY") or 0)
    if delay:
        time.sleep(random.uniform(0, delay))
    reply = _post(key, effect, args, business_id=business_id)
    gate = os.environ.get("WORKER_GATE_AFTER")
    if gate and not _held[0]:
        _held[0] = True
        Path(gate + ".inflight").touch()
        deadline = time.monotonic() + 60
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return reply


worker_agent._client.post_effect = _post_then_wait  # type: ignore[method-assign]
