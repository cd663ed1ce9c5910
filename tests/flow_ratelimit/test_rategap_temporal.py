"""The Temporal model activity: a probe whose turn is lost before its send (here the activity
refuses a diverging conversation after taking the probe's turn) ends its hold at once; a turn
overtaken by a pause while its intent was committed is held until the pause ends."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from cuaderno import RateLimit
from cuaderno.flow.ratelimit import SharedLimits
from cuaderno.gateway import rate
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.loop import Agent
from cuaderno.temporal._activities import CuadernoActivities
from cuaderno.temporal._names import ModelTurnInput


async def test_a_probe_refused_before_its_send_releases_the_others(tmp_path: Path) -> None:
    agent = Agent(instructions="i", name="lim")
    limit = RateLimit(requests_per_minute=600, max_wait=30)  # probe_timeout: the default 10 s
    gateway = ScriptedGateway([ScriptedGateway.text("a")], rate_limit=limit)
    acts = CuadernoActivities(agent, lambda: gateway, f"sqlite:///{tmp_path / 'j.db'}")
    limits = SharedLimits.of(acts.store)
    bucket = rate.bucket_label(limit, endpoint="ScriptedGateway", api_key=None, model=agent.model)
    limits.pause(bucket, 0.05)  # as a 429 leaves it: the next turn is the probe
    diverging = ModelTurnInput(agent="lim", run_id="r1", step_id="t0000.model", turn=0, idempotency_key="k-r1",
                               new_messages=[{"role": "user", "content": "task"}], n_messages=5)
    try:
        with pytest.raises(ApplicationError, match="ReplayDivergence|messages"):
            await ActivityEnvironment().run(acts.model_turn, diverging)
        assert gateway.calls == 0  # the probe was never sent
        after = limits.reserve(bucket, limit, 0)
        # Not held for probe_timeout by a probe that will never answer: the next turn is the probe.
        assert after.held == 0.0 and after.probe > 0, after
    finally:
        acts.store.close()


async def test_a_turn_overtaken_by_a_pause_while_its_intent_commits_waits_for_it(tmp_path: Path) -> None:
    agent = Agent(instructions="i", name="lim")
    limit = RateLimit(requests_per_minute=600, max_wait=30)
    gateway = ScriptedGateway([ScriptedGateway.text("a")], rate_limit=limit)
    acts = CuadernoActivities(agent, lambda: gateway, f"sqlite:///{tmp_path / 'j.db'}")
    limits = SharedLimits.of(acts.store)
    bucket = rate.bucket_label(limit, endpoint="ScriptedGateway", api_key=None, model=agent.model)
    paused: list[float] = []
    journal_send = acts._journal_send

    def intent_then_pause(*args: Any) -> int:
        sends = journal_send(*args)
        limits.pause(bucket, 0.5)  # another worker's 429, learned while this intent committed
        paused.append(time.monotonic())
        return sends

    acts._journal_send = intent_then_pause  # type: ignore[method-assign]
    turn = ModelTurnInput(agent="lim", run_id="r1", step_id="t0000.model", turn=0, idempotency_key="k-r1",
                          new_messages=[{"role": "user", "content": "task"}], n_messages=1)
    try:
        answered = await ActivityEnvironment().run(acts.model_turn, turn)
        waited = time.monotonic() - paused[0]
        assert answered["text"] == "a" and gateway.calls == 1
        assert waited >= 0.45, waited  # sent after the pause, not into it (the old code: at once)
        assert [e.phase for e in acts.store.load("r1") if e.kind == "model"] == ["intent", "result"]
    finally:
        acts.store.close()
