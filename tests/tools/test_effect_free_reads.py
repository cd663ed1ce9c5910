"""A read whose outcome is unknown (killed between its intent and its result) and that fails when
read again has simply failed: an effect-free tool has no effect to be uncertain about.

A real SIGKILL at ``tool.K2`` (the read's intent is committed, its body has not run), then a
resume in another process: the sandbox refuses the path again, and the run goes on with that
refusal as the read's outcome (it stopped ``needs_human`` before ``effect_free``). A tool with an
effect keeps the old, cautious answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cuaderno import SqliteCheckpointer

SCRIPT = textwrap.dedent('''
    import asyncio, sys
    from cuaderno import Agent, ScriptedGateway, Session, SqliteCheckpointer, tool
    from cuaderno.errors import ToolError
    from cuaderno.tools.sandbox import ReadOnlyRoot

    db, root, kind = sys.argv[1], sys.argv[2], sys.argv[3]

    @tool(idempotent=True)
    def fetch(url: str) -> str:
        """An idempotent tool with an effect (it could have been applied before the crash)."""
        raise ToolError("the server refused it")

    tools = ReadOnlyRoot(root).tools() if kind == "read" else [fetch]
    call = (ScriptedGateway.call("read_file", path="../outside.txt") if kind == "read"
            else ScriptedGateway.call("fetch", url="http://127.0.0.1:9/x"))

    async def main():
        with SqliteCheckpointer(db) as store:
            gw = ScriptedGateway([call, ScriptedGateway.text("done")])
            async for _ in Agent(instructions="i", tools=tools).run("t", session=Session("r", gw, store)):
                pass
    try:
        asyncio.run(main())
    except Exception as exc:
        print(type(exc).__name__)
''')


@pytest.mark.parametrize(("kind", "status"), [("read", "completed"), ("effect", "needs_human")])
def test_a_read_of_unknown_outcome_that_fails_again_has_simply_failed(tmp_path: Path, kind: str, status: str) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "outside.txt").write_text("SECRET")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    db = tmp_path / "runs.db"
    argv = [sys.executable, str(script), str(db), str(tmp_path / "root"), kind]
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    killed = subprocess.run(argv, env=env | {"CUADERNO_CRASH_AT": "tool.K2:1"}, capture_output=True, text=True,
                            timeout=60)
    assert killed.returncode == -9, killed.stderr
    resumed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    with SqliteCheckpointer(db, readonly=True) as store:
        cp = store.checkpoint("r")
        events = store.load("r")
    assert cp is not None and cp.status == status, (cp and cp.status, resumed.stdout)
    if kind == "read":
        result = next(e for e in events if e.step_id == "t0000.tool00" and e.phase == "result")
        assert result.payload["outcome"] == "error" and "SECRET" not in str(result.payload)
