"""The loop asks the store, between an effect's durable intent and its body, whether it still
holds the run (R23): a store that says no gets no body run and no result written."""

from __future__ import annotations

from typing import Any

import pytest

from cuaderno import Agent, MemoryCheckpointer, ScriptedGateway, Session, tool
from cuaderno.errors import FencedOut

calls: list[int] = []


@tool
def pay(amount: int) -> dict[str, int]:
    """Pay."""
    calls.append(amount)
    return {"paid": amount}


class _LosesTheRun(MemoryCheckpointer):
    """A store whose holder lost the run while its intent was being written."""

    asked = 0

    def confirm_hold(self, run_id: str, epoch: int | None) -> None:
        self.asked += 1
        raise FencedOut(run_id, epoch or 0, (epoch or 0) + 1)


async def test_a_body_is_not_started_when_the_store_says_the_run_was_lost() -> None:
    calls.clear()
    store = _LosesTheRun()
    agent = Agent(instructions="Pay.", tools=[pay])
    gateway = ScriptedGateway([ScriptedGateway.call("pay", amount=5), ScriptedGateway.text("done")])
    with pytest.raises(FencedOut):
        async for _ in agent.run("pay 5", session=Session("r", gateway, store)):
            pass
    phases: list[Any] = [(e.step_id, e.phase) for e in store.load("r")]
    assert store.asked == 1 and calls == []
    assert ("t0000.tool00", "intent") in phases and ("t0000.tool00", "result") not in phases
