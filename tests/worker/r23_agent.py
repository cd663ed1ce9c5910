"""``worker_agent``'s agents with a second place to hold a tool step: after the call.

``WORKER_GATE_AFTER`` (a file path): the first effect's body, once the ledger has applied it,
touches ``<gate>.inflight`` and waits until the file exists before it returns, so the step sits
between its call and its result write. The agents are ``worker_agent``'s own objects (same
definition, same versions): runs started with one are driven with the other.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import worker_agent

approving_agent = worker_agent.approving_agent
approving_gateway = worker_agent.approving_gateway

_post = worker_agent._client.post_effect
_held = [False]


def _post_then_wait(key: str, effect: str, args: Any, business_id: str | None = None) -> Any:
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
