"""A call possibly billed twice is in a cost figure: ``cost_usd`` is what the journaled answers
cost, :func:`~cuaderno.checkpoint.cost_upper_usd` adds the answers whose request was re-sent after
its first send's fate was lost, so it matches what the provider may have billed.

The provider's side is counted independently: the fake endpoint's own list of the requests it
received (each one billable), priced at the same table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest

from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, StepEvent
from cuaderno.checkpoint import cost_upper_usd, rebuild, verified
from cuaderno.gateway.openai import OpenAIGateway
from cuaderno.gateway.pricing import PriceTable

PRICES = PriceTable({"gpt-test": {"input": 2.0, "output": 8.0}})
USAGE = {"prompt_tokens": 1000, "completion_tokens": 500, "total_tokens": 1500}
PER_CALL = (1000 * 2.0 + 500 * 8.0) / 1e6  # what the provider bills for each request it answers
ANSWER = {"id": "c1", "object": "chat.completion", "created": 1, "model": "gpt-test", "usage": USAGE,
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}


async def no_wait(_: float) -> None:
    pass


async def run(agent: Agent, session: Session) -> None:
    async for _ in agent.run("t", session=session):
        pass


async def test_an_ambiguous_send_puts_the_answer_twice_in_the_upper_bound(fake: Any, tmp_path: Path,
                                                                         silent_server: str) -> None:
    # The provider received the whole request and (for all we know) billed it; its answer was lost.
    fake.queue(httpx2.ReadTimeout("the answer was lost after the request was sent")).json(body=ANSWER)
    fake.json(body=ANSWER)  # a second run, with nothing lost
    # The run's preflight connects to silent_server; every request is answered by the mock transport.
    gw = OpenAIGateway("gpt-test", base_url=f"{silent_server}/v1", api_key="k", http_client=fake.client(),
                       prices=PRICES)
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        await run(Agent(instructions="i"), Session("amb", gw, store, sleep=no_wait))
        await run(Agent(instructions="i"), Session("clean", gw, store, sleep=no_wait))
        cp, events = verified(store, "amb")
        clean, clean_events = verified(store, "clean")
    finally:
        await gw.aclose()
        store.close()
    billable = len(fake.requests) - 1  # every request the endpoint received in the first run
    assert (billable, cp.count("possibly_billed_twice")) == (2, 1)
    assert cp.cost_usd == pytest.approx(PER_CALL)  # the one journaled answer
    assert cost_upper_usd(cp, events) == pytest.approx(billable * PER_CALL)
    assert cost_upper_usd(clean, clean_events) == pytest.approx(clean.cost_usd) == pytest.approx(PER_CALL)


async def test_a_send_lost_in_a_crash_counts_in_the_upper_bound(tmp_path: Path) -> None:
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        # "intent committed, process died before the result": the first send's fate is unknown.
        await run(Agent(instructions="i"), Session("done", ScriptedGateway([ScriptedGateway.text("hi")]), store))
        for ev in store.load("done")[:2]:  # run start + model intent
            store.append([StepEvent(run_id="crashed", step_id=ev.step_id, phase=ev.phase, kind=ev.kind,
                                    name=ev.name, fingerprint=ev.fingerprint, payload=ev.payload)])
        resumed = ScriptedGateway([ScriptedGateway.text("hi", cost=0.25)])
        await run(Agent(instructions="i"), Session("crashed", resumed, store))
        cp, events = verified(store, "crashed")
    finally:
        store.close()
    assert cp.count("possibly_billed_twice") == 1 and cp.cost_usd == pytest.approx(0.25)
    assert cost_upper_usd(cp, events) == pytest.approx(0.5)


def test_escalations_and_unpriced_answers_of_a_doubled_step() -> None:
    def ev(seq: int, step: str, phase: str, payload: dict[str, Any]) -> StepEvent:
        return StepEvent(run_id="r", step_id=step, phase=phase, kind="model", payload=payload, seq=seq)

    events = [
        ev(1, "m0", "intent", {}), ev(2, "m0", "intent.2", {"after": "ambiguous"}),
        ev(3, "m0", "intent.3", {"after": "crash"}),
        ev(4, "m0", "result", {"response": {"cost": 0.5, "escalations": [{"cost": 0.25}, {"cost": None}]}}),
        ev(5, "m1", "intent", {}), ev(6, "m1", "intent.2", {"after": "transient"}),  # provably not billed
        ev(7, "m1", "result", {"response": {"cost": 1.0}}),
        ev(8, "m2", "intent", {}), ev(9, "m2", "intent.2", {"after": "crash"}),
        ev(10, "m2", "result", {"response": {"cost": None}}),  # unpriced: no figure to double
    ]
    cp = rebuild("r", events)
    assert cp.count("possibly_billed_twice") == 3 and cp.cost_usd == pytest.approx(1.75)
    assert cost_upper_usd(cp, events) == pytest.approx(1.75 + 2 * 0.75)
