"""A process SIGKILLed while it climbs the empty-generation ladder, between rungs and inside one.

The child runs an agent through ``TieredGateway`` with the ladder re-send → named tool → escalate on
a cheap tier that answers every request with an empty 200 (named choice included) and a strong tier
that answers. Each tier is a fake provider that bills every generation into its own log and honours
the idempotency key (a key it has billed is replayed, not billed again). The child is killed at a
named crash point; another process resumes the run. Ground truth is the billing logs, not the journal:
whatever the kill point, every rung is billed exactly once, under the same keys as a run never
killed, and the run ends with the same answer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer
from cuaderno.testing.records import read_records

CHILD = textwrap.dedent("""
    import asyncio, sys
    from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, TieredGateway, tool
    from cuaderno.gateway.ladder import Escalate, Ladder, NamedTool, Resend

    @tool(idempotent=True)
    def get_weather(city: str) -> str:
        '''Weather.'''
        return "sunny"

    @tool(idempotent=True)
    def get_time(city: str) -> str:
        '''Time.'''
        return "noon"

    def cheap(request):
        if any(m.get("role") == "tool" for m in request.messages):
            return ScriptedGateway.text("done")
        return ScriptedGateway.empty()

    def strong(request):
        return ScriptedGateway.call("get_weather", city="Lima")

    async def main() -> None:
        db, billing = sys.argv[1], sys.argv[2]
        gw = TieredGateway(ScriptedGateway(cheap, stripe=True, billing_log=billing + ".cheap"),
                           ScriptedGateway(strong, stripe=True, billing_log=billing + ".strong"),
                           ladder=Ladder((Resend(), NamedTool(), Escalate())))
        agent = Agent(instructions="i", tools=[get_weather, get_time])
        store = SqliteCheckpointer(db)
        try:
            async for step in agent.run("What is the weather in Lima?", session=Session("run", gw, store)):
                pass
            print("answer", step.output)
        finally:
            store.close()

    asyncio.run(main())
""")


def _child(db: Path, billing: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at is not None:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-c", CHILD, str(db), str(billing)], env=env, capture_output=True,
                          text=True, timeout=120)


def _billed(billing: Path) -> dict[str, Counter[str]]:
    return {tier: Counter(r["key"] for r in read_records(Path(f"{billing}.{tier}"))) for tier in ("cheap", "strong")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Counter[str]]:
    """The billing of a run never killed: original, re-send and named rung on the cheap tier, the
    escalation on the strong one, then the answer after the tool result on the cheap tier."""
    tmp = tmp_path_factory.mktemp("reference")
    done = _child(tmp / "runs.db", tmp / "billing", None)
    assert done.returncode == 0 and done.stdout.strip() == "answer done", done.stderr
    billed = _billed(tmp / "billing")
    assert sum(billed["cheap"].values()) == 4 and sum(billed["strong"].values()) == 1
    assert len(billed["cheap"]) == 4, "every rung is a request of its own, with its own key"
    return billed


@pytest.mark.parametrize("crash_at", [
    "model.K7:1",  # the original's empty answer and the re-send's intent committed, re-send not sent
    "model.K7:2",  # the re-send's empty answer committed, the named rung not sent
    "model.K7:3",  # the named rung's empty answer committed, the escalation not sent
    "model.K4:2",  # the re-send billed by the cheap tier, its answer not journaled
    "model.K4:3",  # the named rung billed, its answer not journaled
    "model.K4:4",  # the escalation billed by the strong tier, its answer not journaled
    "model.K2:4",  # the escalation's intent committed, the request about to leave
])
def test_killed_on_the_ladder_no_rung_is_paid_twice(tmp_path: Path, crash_at: str,
                                                     reference: dict[str, Counter[str]]) -> None:
    db, billing = tmp_path / "runs.db", tmp_path / "billing"
    killed = _child(db, billing, crash_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    before = _billed(billing)

    resumed = _child(db, billing, None)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "answer done"
    after = _billed(billing)
    # Each key billed once, and the keys are the uncrashed run's: a rung replayed from the journal
    # made no request, and a rung re-sent after the kill reused its key (the provider replayed it).
    assert after == reference, (crash_at, before, after)
    assert all(n == 1 for tier in after.values() for n in tier.values())

    store = SqliteCheckpointer(db)
    try:
        cp = store.checkpoint("run")
        assert cp is not None and cp.status == "completed"
        assert cp.count("ladder_rungs") == 3 and cp.count("escalations") == 1 and cp.count("rejected_responses") == 3
        rungs = [e.payload["rung"]["rung"] for e in store.load("run")
                 if e.kind == "model" and e.phase == "intent" and "rung" in e.payload]
        assert rungs == ["resend", "named_tool", "escalate"]  # counted once each, even across the kill
    finally:
        store.close()
