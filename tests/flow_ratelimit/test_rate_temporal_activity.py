"""The Temporal model activity takes its shared rate-limit turn before the step's intent, as the
loop does: a turn too far away is refused with nothing of the step written."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from cuaderno import RateLimit, RateLimitWaitTooLong, SqliteCheckpointer
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.loop import Agent
from cuaderno.temporal._activities import CuadernoActivities
from cuaderno.temporal._names import ModelTurnInput


def _turn(run_id: str) -> ModelTurnInput:
    return ModelTurnInput(agent="lim", run_id=run_id, step_id="t0000.model", turn=0, idempotency_key=f"k-{run_id}",
                          new_messages=[{"role": "user", "content": "task"}], n_messages=1)


async def test_the_model_activity_waits_for_its_turn_before_the_intent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    agent = Agent(instructions="i", name="lim")
    gateway = ScriptedGateway([ScriptedGateway.text("a")], rate_limit=RateLimit(requests_per_minute=6, max_wait=1))
    acts = CuadernoActivities(agent, lambda: gateway, url)
    answered = await ActivityEnvironment().run(acts.model_turn, _turn("r1"))
    assert answered["text"] == "a"
    with pytest.raises(RateLimitWaitTooLong) as refused:
        await ActivityEnvironment().run(acts.model_turn, _turn("r2"))
    assert refused.value.wait == pytest.approx(10.0, abs=0.5)
    store = SqliteCheckpointer(tmp_path / "j.db")
    try:
        assert [(e.step_id, e.phase) for e in store.load("r1") if e.kind == "model"] == [
            ("t0000.model", "intent"), ("t0000.model", "result")]
        assert [e for e in store.load("r2") if e.kind == "model"] == []  # no intent: no key used
    finally:
        store.close()
    assert gateway.calls == 1
    acts.store.close()
