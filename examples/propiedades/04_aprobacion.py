"""Aprobación humana across processes: suspended on disk, decided by a person, run exactly once.

1. pass 1: the model asks for a transfer; the policy says ``require_approval``; the run is
   suspended on disk and the process exits;
2. a person approves from the command line (``cuaderno approve RUN STEP``), in another process,
   bound to the fingerprint of the exact arguments shown;
3. pass 2: the transfer happens exactly once (the ledger's receipts say so);
4. pass 3: the run is closed: nothing happens.

Then the hard case: approved, and the process is SIGKILLed while the non-idempotent transfer is
in flight (``tool.K4``): the resume does not run it again, it stops ``needs_human``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import check, died, entry, example_dir, journal_note, journal_url, run_pass

from cuaderno import (
    Agent,
    ApprovalStep,
    Policy,
    ScriptedGateway,
    Session,
    ToolContext,
    UncertainEffect,
    open_journal,
    tool,
)
from cuaderno.testing.ledger import LedgerClient, LedgerProcess


def build(url: str) -> Agent:
    client = LedgerClient(url)

    @tool
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money (not idempotent, no lookup: the strictest case)."""
        return client.post_effect(ctx.effect_key, "transfer", {"to": to, "amount": amount}, business_id=ctx.run_id)

    return Agent(instructions="Pay what is asked.", tools=[transfer],
                 policy=Policy({"transfer": "require_approval"}, version="aprobacion-1"))


async def child(workdir: Path, run_id: str, url: str) -> None:
    print(f"pid={os.getpid()}", flush=True)
    gateway = ScriptedGateway([ScriptedGateway.call("transfer", to="ana", amount=250), ScriptedGateway.text("paid")])
    store = open_journal(journal_url(workdir))
    try:
        async for step in build(url).run("pay ana 250", session=Session(run_id, gateway, store)):
            # Shortened for the line; `cuaderno show` prints all 64 characters, and a decision needs them all.
            extra = (f" status={step.status} fingerprint={step.fingerprint[:12]}… (shortened)"
                     if isinstance(step, ApprovalStep) else "")
            print(f"  {type(step).__name__} {step.step_id}{extra}", flush=True)
        print(f"status={store.checkpoint(run_id).status}", flush=True)  # type: ignore[union-attr]
    except UncertainEffect:
        print("status=needs_human", flush=True)
    finally:
        store.close()


def cli(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuaderno", "--db", journal_url(workdir), *args],
                          capture_output=True, text=True, timeout=60)


def status(proc: subprocess.CompletedProcess[str]) -> str:
    return proc.stdout.strip().splitlines()[-1].split("=", 1)[1]


def main() -> int:
    script = str(Path(__file__).resolve())
    print("cuaderno: human approval (seed 000)\n")
    with example_dir("cuaderno-approval-") as workdir:
        with LedgerProcess(workdir / "ledger.db", mode="nodedup") as ledger:
            p1 = run_pass(script, workdir, "pago-1", ledger.url)
            print(f"pass 1 -> {status(p1)}; ledger receipts: {len(ledger.receipts(business_id='pago-1'))}")
            print(p1.stdout.rstrip())
            decided = cli(workdir, "approve", "pago-1", "t0000.tool00", "--by", "ana")
            print(f"\n$ cuaderno approve pago-1 t0000.tool00 --by ana   (exit {decided.returncode})")
            print(decided.stdout.rstrip())
            p2 = run_pass(script, workdir, "pago-1", ledger.url)
            n2 = len(ledger.receipts(business_id="pago-1"))
            p3 = run_pass(script, workdir, "pago-1", ledger.url)
            n3 = len(ledger.receipts(business_id="pago-1"))
            print(f"\npass 2 -> {status(p2)}; ledger receipts: {n2}")
            print(f"pass 3 -> {status(p3)}; ledger receipts: {n3}")
            check(status(p1) == "suspended" and decided.returncode == 0, "the run must wait for the person")
            check(status(p2) == "completed" and n2 == 1 and n3 == 1, "the approved effect must happen exactly once")
            again = cli(workdir, "approve", "pago-1", "t0000.tool00")
            print(f"approving again: exit {again.returncode}: {again.stderr.strip()}")
            check(again.returncode == 4, "a second decision must be refused (exit 4)")

            print("\nhard case: approved, then killed while the transfer is in flight")
            q1 = run_pass(script, workdir, "pago-2", ledger.url)
            cli(workdir, "approve", "pago-2", "t0000.tool00", "--by", "ana")
            q2 = run_pass(script, workdir, "pago-2", ledger.url, crash_at="tool.K4:1")
            q3 = run_pass(script, workdir, "pago-2", ledger.url)
            n = len(ledger.receipts(business_id="pago-2"))
            print(f"pass 1 -> {status(q1)}; approved; pass 2 {died(q2)}; pass 3 -> {status(q3)}; ledger receipts: {n}")
            check(q2.returncode == -9 and status(q3) == "needs_human" and n == 1,
                  "an approved effect interrupted in flight must be uncertain, never re-sent")
            print(journal_note(workdir, "show", "pago-2"))
    return 0


if __name__ == "__main__":
    entry(main, child)
