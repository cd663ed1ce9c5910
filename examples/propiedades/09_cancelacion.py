"""Cancelación segura: from another process, while a transfer is in flight (seed 001 §7).

A child process runs an agent that makes two transfers through the ledger service; the first one
is slow. While it is in flight, the parent runs ``cuaderno cancel``. The cancellation does not
undo the transfer in flight: it completes and is journaled; no new step is admitted after the
cancellation committed (the second transfer and the next model call never happen). The
``cancelled`` record lists what completed and the cleanup it scheduled: a refund, which is a
separate action (its own effect key and policy decision) run by ``cuaderno.compensate``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import check, cuaderno_cli, entry, example_dir

from cuaderno import (
    Agent,
    Compensation,
    RunCancelled,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolContext,
    compensate,
    tool,
)
from cuaderno._cli_render import counted
from cuaderno.testing.ledger import LedgerClient, LedgerProcess


def build(url: str, slow: float) -> Agent:
    client = LedgerClient(url)

    @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"], "amount": args["amount"]}))
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money (the ledger is slow today)."""
        time.sleep(slow)
        return client.post_effect(ctx.effect_key, "transfer", {"to": to, "amount": amount}, business_id="pagos")

    @tool
    def refund(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Give money back."""
        return client.post_effect(ctx.effect_key, "refund", {"to": to, "amount": amount}, business_id="pagos")

    return Agent(instructions="Paga.", tools=[transfer, refund])


async def child(workdir: Path, url: str) -> None:
    script = [ScriptedGateway.call("transfer", to="ana", amount=10), ScriptedGateway.call("transfer", to="eva", amount=20),
              ScriptedGateway.text("hecho")]
    store = SqliteCheckpointer(workdir / "runs.db")
    try:
        async for step in build(url, 1.5).run("paga", session=Session("pagos", ScriptedGateway(script), store)):
            print(f"  child: {type(step).__name__} {step.step_id}", flush=True)
    except RunCancelled as exc:
        record = exc.record
        print(f"  child: stopped: run {exc.run_id!r} was cancelled ({record.get('reason')}): "
              f"{counted(len(record['completed']), 'effect')} completed, {len(record['uncertain'])} uncertain, "
              f"{counted(len(record['cleanup']), 'cleanup action')} scheduled", flush=True)
    store.close()


def main() -> int:
    print("cuaderno: safe cancellation (seed 001 §7)\n")
    with example_dir("cuaderno-cancelacion-") as workdir:
        with LedgerProcess(workdir / "ledger.db", mode="dedup") as ledger:
            proc = subprocess.Popen([sys.executable, __file__, "--child", str(workdir), ledger.url], text=True,
                                    stdout=subprocess.PIPE, env={k: v for k, v in os.environ.items()
                                                                 if k != "CUADERNO_CRASH_AT"})
            while not any(r for r in _intents(workdir)):
                time.sleep(0.05)  # wait until the first transfer's intent is on disk: it is in flight now
            cli = subprocess.run([sys.executable, "-m", "cuaderno", "--db", str(workdir / "runs.db"), "cancel",
                                  "pagos", "--reason", "el cliente se arrepintió", "--by", "ops"],
                                 capture_output=True, text=True, timeout=60)
            print(f"$ cuaderno cancel pagos --reason ...   (while the first transfer is in flight)\n  {cli.stdout.strip()}")
            out, _ = proc.communicate(timeout=60)
            print(out.rstrip())
            receipts = ledger.receipts(business_id="pagos")
            store = SqliteCheckpointer(workdir / "runs.db")
            cp = store.checkpoint("pagos")
            assert cp is not None and cp.outcome is not None
            print(f"\nstatus: {cp.status}; completed: {[c['step_id'] for c in cp.outcome['completed']]}; "
                  f"uncertain: {cp.outcome['uncertain']}; cleanup scheduled: {cp.outcome['cleanup']}")
            print(f"ledger receipts after the cancellation: {[(r['effect'], r['request']['args']) for r in receipts]}")
            results = asyncio.run(compensate(build(ledger.url, 0), store, "pagos"))
            again = asyncio.run(compensate(build(ledger.url, 0), store, "pagos"))
            after = ledger.receipts(business_id="pagos")
            store.close()
            print(f"compensate(): {[r['outcome'] for r in results]}; run again: {[r['outcome'] for r in again]}; "
                  f"ledger receipts now: {[(r['effect'], r['request']['args']['amount']) for r in after]}")
    kept = cuaderno_cli(workdir, "show", "pagos")
    if kept:
        print(f"journal kept; look at it with: {kept}")
    check(cp.status == "cancelled" and len(receipts) == 1, "one transfer completed, none after the cancellation")
    check(len(after) == 2 and after[1]["effect"] == "refund", "exactly one refund")
    return 0


def _intents(workdir: Path) -> list[Any]:
    import sqlite3

    path = workdir / "runs.db"
    if not path.exists():
        return []
    try:
        con = sqlite3.connect(path)
        try:
            return con.execute("SELECT 1 FROM cuaderno_events WHERE kind='tool' AND phase='intent'").fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return []


if __name__ == "__main__":
    entry(main, child)
