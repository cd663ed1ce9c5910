"""Errores con códigos tipados, cuentas separadas e identidad del efecto (seed 001 §1-3).

Each tool fails the way a real system does, and says *how* with a typed class: the loop reacts to
the class, never to the wording. Printed from the run's checkpoint:

- invalid_input -> the model repairs its call (``repairs``), no backoff;
- conflict      -> fresh state, replan (``replans``);
- transient     -> bounded retry with jitter, same intent, same effect key (``retries``);
- permanent     -> never retried; the model is told and reflects (``reflects``);
- bug           -> an unclassified exception stops the run with the evidence kept.

And the effect key: derived from the intent (tenant, task, effect type, canonical arguments,
policy version), the same on every attempt.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import check, cuaderno_cli, example_dir

from cuaderno import (
    Agent,
    ErrorClass,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolContext,
    ToolError,
    tool,
)

attempts: dict[str, list[str]] = {}
retrying: list[str] = []
"""The label of the step whose transient failure the loop is about to retry."""


def label(step_id: str, tool_name: str) -> str:
    return f"  {step_id} {tool_name:<15} ->"


@tool
def pay(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
    """Pay: the first attempt meets a 429 before anything is sent."""
    attempts.setdefault("pay", []).append(ctx.effect_key)
    if len(attempts["pay"]) == 1:
        # The loop retries this one inside the step, so the step yields only its final outcome:
        # the failure is printed here, on its own line, before the backoff that belongs to it.
        message = "429 from the bank, nothing sent"
        retrying.append(label(ctx.step_id, "pay"))
        print(f"{retrying[-1]} error [transient] {message} (attempt {len(attempts['pay'])})")
        raise ToolError(message, error_class=ErrorClass.TRANSIENT, sent=False)
    return {"paid": amount}


@tool
def update_address(version: int, street: str) -> str:
    """Update with optimistic locking: version 1 is stale."""
    if version == 1:
        raise ToolError("stale version 1; current is 2", error_class=ErrorClass.CONFLICT)
    return "updated"


@tool
def delete_account(user: str) -> str:
    """Forbidden for this agent's credentials."""
    raise ToolError("403: not allowed to delete accounts", error_class=ErrorClass.PERMANENT)


@tool
def export(rows: int) -> str:
    """A tool with a bug: an unclassified exception."""
    raise KeyError("column 'email'")


async def main() -> int:
    print("cuaderno: typed error classes and separate accounting (seed 001)\n")
    script = [
        ScriptedGateway.call("pay", to="ana", amount="cien"),          # invalid input -> repair
        ScriptedGateway.call("pay", to="ana", amount=100),             # transient, then ok (retry)
        ScriptedGateway.call("update_address", version=1, street="x"),  # conflict -> replan
        ScriptedGateway.call("update_address", version=2, street="x"),
        ScriptedGateway.call("delete_account", user="ana"),            # permanent -> reflect
        ScriptedGateway.call("export", rows=10),                       # bug -> stop with evidence
    ]
    with example_dir("cuaderno-errores-") as workdir:
        store = SqliteCheckpointer(workdir / "runs.db")
        agent = Agent(instructions="Do the errands.", tools=[pay, update_address, delete_account, export])

        async def no_wait(seconds: float) -> None:
            print(f"{retrying[-1]} retry after a jittered {seconds:.2f}s backoff (not waited here), same effect key")

        try:
            async for step in agent.run("errands", session=Session("errands", ScriptedGateway(script), store,
                                                                     sleep=no_wait, seed=7)):
                if hasattr(step, "outcome"):
                    err = getattr(step, "error", None)
                    print(f"{label(step.step_id, step.tool)} {step.outcome}"
                          + (f" [{err['error_class']}] {err['message']}" if err else ""))
        except KeyError as exc:
            print(f"  bug: {exc!r} -> the run stopped; evidence journaled")
        cp = store.checkpoint("errands")
        store.close()
    assert cp is not None
    counts = {k: cp.count(k) for k in ("retries", "repairs", "replans", "reflects", "escalations")}
    print(f"\nstatus: {cp.status} (reason: {(cp.outcome or {}).get('reason')})")
    print("counted separately:", ", ".join(f"{k} {v}" for k, v in counts.items()))
    print(f"effect key of both pay attempts: {attempts['pay'][0]} == {attempts['pay'][1]}")
    kept = cuaderno_cli(workdir, "show", "errands")
    if kept:
        print(f"journal kept; look at it with: {kept}")
    check(counts == {"retries": 1, "repairs": 1, "replans": 1, "reflects": 1, "escalations": 0}, str(counts))
    check(cp.status == "failed" and len(set(attempts["pay"])) == 1, "bug must stop the run; keys must match")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
