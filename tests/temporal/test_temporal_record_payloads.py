"""The ``record`` activity holds every event the workflow sends it to its payload type: a malformed
payload fails the activity typed (``PayloadMalformed``, not retried), with nothing written; a
well-formed one is journaled as sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from cuaderno import SqliteCheckpointer
from cuaderno.gateway.scripted import ScriptedGateway
from cuaderno.loop import Agent
from cuaderno.temporal._activities import CuadernoActivities
from cuaderno.temporal._names import RecordInput


def _final(payload: dict[str, object]) -> dict[str, object]:
    return {"step_id": "final", "phase": "result", "kind": "final", "name": None, "decision": None,
            "fingerprint": None, "payload": payload}


async def test_a_malformed_payload_is_refused_typed_and_nothing_is_written(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    agent = Agent(instructions="i", name="rec")
    acts = CuadernoActivities(agent, lambda: ScriptedGateway([]), url)
    start = {"step_id": "run", "phase": "start", "kind": "run", "name": "rec", "decision": None,
             "fingerprint": "fp", "payload": {"task": "t", "versions": agent.versions(), "tenant": None}}
    bad = RecordInput(agent="rec", run_id="r1", events=[start, _final({"output": "x", "turn": "zero"})])
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(acts.record, bad)
    assert refused.value.type == "PayloadMalformed" and refused.value.non_retryable
    assert "'turn' = 'zero'" in str(refused.value)
    store = SqliteCheckpointer(str(tmp_path / "j.db"))
    try:
        assert store.checkpoint("r1") is None  # not even the well-formed start row
        good = RecordInput(agent="rec", run_id="r1", events=[start, _final({"output": "x", "turn": 0})])
        assert await ActivityEnvironment().run(acts.record, good) == 2
        events = store.load("r1")
        assert [e.payload for e in events] == [start["payload"], {"output": "x", "turn": 0}]
        assert store.checkpoint("r1").status == "completed"  # type: ignore[union-attr]
    finally:
        store.close()
