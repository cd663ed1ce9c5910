"""Compensations of a cancelled run, killed in flight (SIGKILL), then run again.

``compensate`` is its own action with its own intent, key and replay rules. Ground truth is the
receipts file the refund appends to (fsynced) before it returns, outside the journal. What must
hold: each refund happens at most once; one nobody can know about stops ``UncertainEffect``
while the run stays ``cancelled``; a person's ``resolve`` settles it and ``compensate`` goes on
(re-sending, same key, only after "did not happen"); two processes never compensate at once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cuaderno.testing.records import read_records

pytestmark = pytest.mark.xdist_group("crash")

CHILD = textwrap.dedent('''
    import asyncio, json, os, signal, sys, time
    from pathlib import Path
    from cuaderno import (Agent, Compensation, RunCancelled, ScriptedGateway, Session, SqliteCheckpointer,
                          ToolContext, cancel, compensate, resolve, tool)
    from cuaderno.testing.records import append_synced, read_records

    db, work, action, lookup_mode, kill = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    receipts = work / "receipts.jsonl"
    store = SqliteCheckpointer(db)

    @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"], "amount": args["amount"]}))
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict:
        """Move money; the user cancels while it is in flight."""
        append_synced(receipts, {"effect": "transfer", "key": ctx.effect_key})
        cancel(store, "run", "user clicked cancel")
        return {"ok": True}

    def find(ctx: ToolContext, arguments: dict) -> object:
        return next((r for r in read_records(receipts) if r["key"] == ctx.effect_key), None)

    @tool(lookup=find if lookup_mode == "lookup" else None)
    def refund(to: str, amount: int, ctx: ToolContext) -> dict:
        """Give money back (not idempotent)."""
        if kill == "before":
            os.kill(os.getpid(), signal.SIGKILL)  # never reached the receiver
        if kill == "gate":
            (work / "inflight").touch()
            while not (work / "open").exists():
                time.sleep(0.01)
        append_synced(receipts, {"effect": "refund", "key": ctx.effect_key})
        if kill == "after":
            os.kill(os.getpid(), signal.SIGKILL)  # applied; its result is never journaled
        return {"refunded": amount}

    agent = Agent(instructions="i", tools=[transfer, refund])

    async def main() -> object:
        if action == "run":
            gw = ScriptedGateway([ScriptedGateway.call("transfer", to="a", amount=3), ScriptedGateway.text("x")])
            try:
                async for _ in agent.run("t", session=Session("run", gw, store)):
                    pass
            except RunCancelled:
                return "cancelled"
        if action.startswith("resolve-"):
            resolve(store, "run", "cleanup00", happened=action == "resolve-yes", by="ops",
                    result={"found": "by hand"} if action == "resolve-yes" else None)
            return "resolved"
        try:
            return await compensate(agent, store, "run")
        except Exception as exc:
            return type(exc).__name__

    out = asyncio.run(main())
    print(json.dumps({"out": out, "status": store.checkpoint("run").status}))
''')


class World:
    def __init__(self, tmp: Path, lookup: str) -> None:
        self.tmp, self.lookup = tmp, lookup
        (tmp / "child.py").write_text(CHILD)

    def argv(self, action: str, kill: str) -> list[str]:
        return [sys.executable, str(self.tmp / "child.py"), str(self.tmp / "runs.db"), str(self.tmp), action,
                self.lookup, kill]

    def run(self, action: str, kill: str = "-") -> tuple[int, dict[str, Any]]:
        proc = subprocess.run(self.argv(action, kill), capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode == -9:
            return -9, {}
        assert proc.returncode == 0, proc.stderr
        return 0, json.loads(proc.stdout.strip().splitlines()[-1])

    def refunds(self) -> list[str]:
        return [r["key"] for r in read_records(self.tmp / "receipts.jsonl") if r["effect"] == "refund"]


def cancelled_world(tmp: Path, lookup: str) -> World:
    world = World(tmp, lookup)
    assert world.run("run") == (0, {"out": "cancelled", "status": "cancelled"})
    return world


@pytest.mark.parametrize(("kill", "settle", "refunds"), [("after", "resolve-yes", 1), ("before", "resolve-no", 1)])
def test_a_compensation_nobody_can_know_about_waits_for_a_person(tmp_path: Path, kill: str, settle: str,
                                                                 refunds: int) -> None:
    world = cancelled_world(tmp_path, "none")
    assert world.run("compensate", kill)[0] == -9
    for _ in range(2):  # asked again, it says so again: the run stays cancelled, nothing is sent
        assert world.run("compensate") == (0, {"out": "UncertainEffect", "status": "cancelled"})
    assert world.run(settle) == (0, {"out": "resolved", "status": "cancelled"})
    rc, done = world.run("compensate")
    assert rc == 0 and done["status"] == "cancelled" and done["out"][0]["outcome"] == "ok", done
    keys = world.refunds()
    assert len(keys) == refunds and len(set(keys)) == 1, keys  # a re-send (after "did not happen") keeps its key
    assert world.run("compensate")[1]["out"] == done["out"] and world.refunds() == keys


@pytest.mark.parametrize("kill", ["after", "before"])
def test_a_lookup_settles_a_compensation_killed_in_flight(tmp_path: Path, kill: str) -> None:
    world = cancelled_world(tmp_path, "lookup")
    assert world.run("compensate", kill)[0] == -9
    rc, done = world.run("compensate")
    assert rc == 0 and done["out"][0]["outcome"] == "ok" and done["status"] == "cancelled", done
    assert len(world.refunds()) == 1  # found by the lookup, or absent and sent again under the same key


def test_two_processes_never_compensate_at_once(tmp_path: Path) -> None:
    world = cancelled_world(tmp_path, "lookup")
    first = subprocess.Popen(world.argv("compensate", "gate"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "inflight").exists():
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.01)
        assert world.run("compensate")[1]["out"] == "RunBusy"  # the first is alive, in the refund body
        first.kill()  # SIGKILL, still in the body: no refund reached the receiver
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    (tmp_path / "open").touch()
    rc, done = world.run("compensate")  # taken over at once: the holder is dead
    assert rc == 0 and done["out"][0]["outcome"] == "ok", done
    assert len(world.refunds()) == 1
