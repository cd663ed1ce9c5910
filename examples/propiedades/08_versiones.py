"""Versiones: a run started under other code is resumed only by an explicit choice (seed 001 §6).

A run waits for an approval under agent v1. The code is then deployed as v2 (instructions
reworded). Resuming it under v2:

- by default: ``VersionMismatch`` — nothing is read with silent defaults, nothing is written;
- ``"drain"``: left to a worker that still runs v1;
- a ``Migration`` that refuses: ``MigrationFailed``, the file is byte-for-byte unchanged;
- a tested ``Migration``: the run moves to v2; recorded steps stand as decided; the new steps use v2;
- ``"cancel"`` (on another run): cancelled, so a new run can start.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import check, cuaderno_cli, example_dir

from cuaderno import (
    Agent,
    Migration,
    Policy,
    RunCancelled,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    VersionMismatch,
    approve,
    tool,
)
from cuaderno.render import counted

sent: list[int] = []


@tool
def transfer(to: str, amount: int) -> str:
    """Move money."""
    sent.append(amount)
    return "ok"


def agent(instructions: str) -> Agent:
    return Agent(instructions=instructions, tools=[transfer], policy=Policy({"transfer": "require_approval"}))


SCRIPT = [ScriptedGateway.call("transfer", to="ana", amount=40), ScriptedGateway.text("done")]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


async def run(a: Agent, run_id: str, store: SqliteCheckpointer, **session: Any) -> str:
    gw = ScriptedGateway(SCRIPT)
    try:
        async for _ in a.run("pay 40", session=Session(run_id, gw, store, **session)):
            pass
    except (VersionMismatch, RunCancelled) as exc:
        return f"{type(exc).__name__} ({counted(gw.calls, 'model call')})"
    return f"{store.checkpoint(run_id).status} ({counted(gw.calls, 'model call')})"  # type: ignore[union-attr]


async def main() -> int:
    print("cuaderno: versions (seed 001 §6)\n")
    with example_dir("cuaderno-versiones-") as workdir:
        path = workdir / "runs.db"
        store = SqliteCheckpointer(path)
        v1, v2 = agent("Pay what is asked."), agent("Pay exactly what is asked, without rounding.")
        print("v1 starts both runs:", await run(v1, "r1", store), "/", await run(v1, "r2", store))
        approve(store, "r1", "t0000.tool00", approver="ana")
        print("v2 resumes r1 by default     ->", await run(v2, "r1", store))
        print("v2 resumes r1 with drain     ->", await run(v2, "r1", store, on_version_mismatch="drain"))
        store.close()
        before = digest(path)

        def refuse(old: dict[str, Any], new: dict[str, Any], events: list[Any]) -> dict[str, Any]:
            raise ValueError("runs with a pending transfer are not migrated")

        store = SqliteCheckpointer(path)
        print("v2 with a refusing migration ->", await run(v2, "r1", store, on_version_mismatch=Migration(
            name="strict", migrate=refuse)))
        store.close()
        unchanged = digest(path) == before
        print(f"   journal file unchanged: {unchanged}")

        def reword(old: dict[str, Any], new: dict[str, Any], events: list[Any]) -> dict[str, Any]:
            return {"from_agent": old["agent"], "to_agent": new["agent"], "kept_steps": len(events)}

        store = SqliteCheckpointer(path)
        print("v2 with a tested migration   ->", await run(v2, "r1", store, on_version_mismatch=Migration(
            name="reword-2026-12", migrate=reword)), f"; transfers sent: {len(sent)}")
        print("v2 resumes r1 again          ->", await run(v2, "r1", store))
        print("v2 resumes r2 with cancel    ->", await run(v2, "r2", store, on_version_mismatch="cancel"))
        statuses = (store.checkpoint("r1").status, store.checkpoint("r2").status)  # type: ignore[union-attr]
        store.close()
    kept = cuaderno_cli(workdir, "list")
    if kept:
        print(f"journal kept; look at it with: {kept}")
    check(unchanged and sent == [40] and statuses == ("completed", "cancelled"), f"{unchanged} {sent} {statuses}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
