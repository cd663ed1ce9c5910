"""A run resumed under another configuration than the one it was killed in.

A process is SIGKILLed inside a tool body, after the effect reached the receiver and before its
result was journaled. Another process resumes the run with something changed: a new policy
version (accepted with ``on_version_mismatch="resume"``), another tenant, fewer turns. Ground
truth is the receiver's own receipts file, written outside the journal.

What must hold: the effect is asked about (lookup) and re-sent (idempotent receiver) under the
key it was first sent with, so it happens once; a change that would give the run's effects
another identity (the tenant) or skip recorded steps (``max_turns``) is refused before
anything is written.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from cuaderno.journal._compress import stored_payload
from cuaderno.testing.records import read_records

pytestmark = pytest.mark.xdist_group("crash")

CHILD = textwrap.dedent("""
    import asyncio, json, os, signal, sys
    from cuaderno import (Agent, Policy, ReplayDivergence, ScriptedGateway, Session, SqliteCheckpointer,
                          ToolContext, UncertainEffect, tool)
    from cuaderno.testing.records import append_synced, read_records

    db, receipts, kind, policy_version, tenant, max_turns, kill_for, payees = sys.argv[1:9]

    def receiver(key: str, arguments: dict) -> dict:
        '''The receiving system: it deduplicates by effect key, like a payments API.'''
        found = next((r for r in read_records(receipts) if r["key"] == key), None)
        if found is not None:
            return found
        receipt = {"key": key, **arguments}
        append_synced(receipts, receipt)
        if arguments["to"] == kill_for:  # the effect happened; its result will never be journaled
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt

    def lookup(ctx: ToolContext, arguments: dict) -> object:
        return next((r for r in read_records(receipts) if r["key"] == ctx.effect_key), None)

    if kind == "lookup":
        @tool(lookup=lookup)
        def transfer(to: str, amount: int, ctx: ToolContext) -> dict:
            '''Move money (not idempotent; asked about by key after a crash).'''
            return receiver(ctx.effect_key, {"to": to, "amount": amount})
    else:
        @tool(idempotent=True)
        def transfer(to: str, amount: int, ctx: ToolContext) -> dict:
            '''Move money (the receiver deduplicates by effect key).'''
            return receiver(ctx.effect_key, {"to": to, "amount": amount})

    agent = Agent(instructions="pay", tools=[transfer], max_turns=int(max_turns),
                  policy=Policy({}, version=policy_version))
    gateway = ScriptedGateway([*(ScriptedGateway.call("transfer", to=to, amount=5) for to in payees.split(",")),
                               ScriptedGateway.text("paid")])

    async def main() -> None:
        store = SqliteCheckpointer(db)
        session = Session("run", gateway, store, tenant=tenant, on_version_mismatch="resume")
        try:
            steps = [type(s).__name__ async for s in agent.run("pay bob", session=session)]
            print(json.dumps({"outcome": "done", "steps": steps}))
        except (ReplayDivergence, UncertainEffect) as exc:
            print(json.dumps({"outcome": type(exc).__name__, "message": str(exc)}))
        finally:
            store.close()

    asyncio.run(main())
""")


def child(tmp: Path, *, kind: str, policy_version: str = "1", tenant: str = "acme", max_turns: int = 5,
          kill_for: str = "-", payees: str = "bob") -> subprocess.CompletedProcess[str]:
    """One process running (or resuming) the run; ``kill_for`` names the payee whose transfer
    SIGKILLs it right after the receiver recorded it."""
    script = tmp / "child.py"
    script.write_text(CHILD)
    argv = [sys.executable, str(script), str(tmp / "runs.db"), str(tmp / "receipts.jsonl"), kind, policy_version,
            tenant, str(max_turns), kill_for, payees]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def rows(tmp: Path) -> list[tuple[str, str, Any]]:
    with closing(sqlite3.connect(tmp / "runs.db")) as db:
        return [(step, phase, stored_payload(codec, payload)) for step, phase, codec, payload in
                db.execute("SELECT step_id, phase, codec, payload FROM cuaderno_events ORDER BY seq")]


def killed_after_the_effect(tmp: Path, kind: str) -> str:
    """Run until the receiver has the transfer, then SIGKILL; returns the effect key it holds."""
    first = child(tmp, kind=kind, kill_for="bob")
    assert first.returncode == -9, first.stderr
    receipts = read_records(tmp / "receipts.jsonl")
    assert len(receipts) == 1
    assert ("t0000.tool00", "result") not in {(s, p) for s, p, _ in rows(tmp)}
    return str(receipts[0]["key"])


@pytest.mark.parametrize("kind", ["lookup", "idempotent"])
def test_resume_under_a_new_policy_version_keeps_the_recorded_effect_key(tmp_path: Path, kind: str) -> None:
    """The effect key holds the policy version. Derived afresh on resume, the lookup asked about
    a key the receiver never saw ("absent") and the re-send carried a new one: two transfers."""
    key = killed_after_the_effect(tmp_path, kind)
    second = child(tmp_path, kind=kind, policy_version="2")
    assert second.returncode == 0, second.stderr
    assert '"outcome": "done"' in second.stdout, second.stdout
    receipts = read_records(tmp_path / "receipts.jsonl")
    assert [r["key"] for r in receipts] == [key], "the transfer happened twice"
    journaled = {(s, p): p_ for s, p, p_ in rows(tmp_path)}
    assert key in str(journaled[("t0000.tool00", "result")])


def test_resume_under_another_tenant_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    killed_after_the_effect(tmp_path, "lookup")
    before = rows(tmp_path)
    second = child(tmp_path, kind="lookup", tenant="other")
    assert second.returncode == 0, second.stderr
    assert '"outcome": "ReplayDivergence"' in second.stdout and "tenant" in second.stdout, second.stdout
    assert rows(tmp_path) == before
    assert len(read_records(tmp_path / "receipts.jsonl")) == 1


def test_fewer_turns_than_recorded_is_a_divergence_not_a_failed_run(tmp_path: Path) -> None:
    """Turn 0's transfer completed; turn 1's was killed after its effect. Resumed with
    max_turns=1, ending the run as failed (max_turns) would bury a transfer that happened."""
    first = child(tmp_path, kind="lookup", payees="bob,ann", kill_for="ann")
    assert first.returncode == -9, first.stderr
    before = rows(tmp_path)
    second = child(tmp_path, kind="lookup", payees="bob,ann", max_turns=1)
    assert '"outcome": "ReplayDivergence"' in second.stdout and "max_turns=1" in second.stdout, second.stdout
    assert rows(tmp_path) == before
    assert [r["to"] for r in read_records(tmp_path / "receipts.jsonl")] == ["bob", "ann"]
