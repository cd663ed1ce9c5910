"""A process killed between the step that exceeds a budget and the run's end.

The step's result and the run's end are two commits. The child is SIGKILLed right after the
first (``tool.K7`` of the step that exceeded the bound); the resume in another process must end
the run as failed without one more model call. Ground truth is the fake provider's billing log,
written by the gateway, not the journal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from cuaderno import SqliteCheckpointer
from cuaderno.testing.records import read_records

CHILD = textwrap.dedent("""
    import asyncio, sys
    from cuaderno import (Agent, BudgetExceeded, Budgets, ErrorClass, ScriptedGateway, Session,
                          SqliteCheckpointer, ToolError, tool)

    @tool
    def update(version: int) -> str:
        '''Update a record (always stale here).'''
        raise ToolError("stale version", error_class=ErrorClass.CONFLICT)

    async def main() -> None:
        db, billing = sys.argv[1], sys.argv[2]
        agent = Agent(instructions="i", tools=[update], budgets=Budgets(replans=1))
        gw = ScriptedGateway([ScriptedGateway.call("update", version=1)] * 9, billing_log=billing)
        store = SqliteCheckpointer(db)
        try:
            async for _ in agent.run("t", session=Session("run", gw, store)):
                pass
        except BudgetExceeded as exc:
            print("budget", exc.budget)
        finally:
            store.close()

    asyncio.run(main())
""")


def _child(db: Path, billing: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    if crash_at is not None:
        env["CUADERNO_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-c", CHILD, str(db), str(billing)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_killed_after_the_step_that_exceeded_a_budget(tmp_path: Path) -> None:
    db, billing = tmp_path / "runs.db", tmp_path / "billing.jsonl"
    # The first conflict is within the bound (replans=1); the second exceeds it, and its result
    # is the second tool.K7 the run passes.
    killed = _child(db, billing, "tool.K7:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(read_records(billing)) == 2
    store = SqliteCheckpointer(db)
    try:
        cp = store.checkpoint("run")
        assert cp is not None and cp.status != "failed" and cp.count("replans") == 2
    finally:
        store.close()

    resumed = _child(db, billing, None)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "budget replans"
    assert len(read_records(billing)) == 2, "the resume paid for a model call the budget no longer allowed"
    store = SqliteCheckpointer(db)
    try:
        cp = store.checkpoint("run")
        assert cp is not None and cp.status == "failed" and cp.count("model_calls") == 2
    finally:
        store.close()
