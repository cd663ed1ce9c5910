"""Cancelación segura: from another process, while a transfer is in flight (seed 001 §7).

A child process runs an agent that makes two transfers through the ledger service; the first one
is in flight (its tool body has started, the ledger has no receipt yet) when the parent runs
``cuaderno cancel``. The transfer is held there until the command returned: the example waits on
files each side writes when it reaches its point, never on a guessed delay, so a loaded machine
cannot let the transfer finish before the cancellation is committed. The cancellation does not
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

from _comun import check, cuaderno_cli, entry, example_dir, journal_url

from cuaderno import (
    Agent,
    Compensation,
    RunCancelled,
    ScriptedGateway,
    Session,
    ToolContext,
    compensate,
    open_journal,
    tool,
)
from cuaderno.render import counted
from cuaderno.testing.ledger import LedgerClient, LedgerProcess

WAIT_S = 60.0
"""How long either side waits for the other to reach its point before giving up."""


def wait_for(path: Path, what: str, child: subprocess.Popen[str] | None = None) -> None:
    """Return once ``path`` exists: another process wrote it when it reached a point."""
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if child is not None and child.poll() is not None:
            raise SystemExit(f"the child exited ({child.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"waited {WAIT_S:.0f} s for {what}")
        time.sleep(0.01)


def build(url: str, gate: Path | None = None) -> Agent:
    """The agent; with ``gate``, a transfer writes ``gate.inflight`` and waits for ``gate``."""
    client = LedgerClient(url)

    @tool(compensation=Compensation("refund", lambda args, result: {"to": args["to"], "amount": args["amount"]}))
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money (the ledger is slow today)."""
        if gate is not None:
            gate.with_suffix(".inflight").touch()
            wait_for(gate, "the parent let the transfer go on")
        return client.post_effect(ctx.effect_key, "transfer", {"to": to, "amount": amount}, business_id="pagos")

    @tool
    def refund(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Give money back."""
        return client.post_effect(ctx.effect_key, "refund", {"to": to, "amount": amount}, business_id="pagos")

    return Agent(instructions="Pay.", tools=[transfer, refund])


async def child(workdir: Path, url: str) -> None:
    script = [ScriptedGateway.call("transfer", to="ana", amount=10), ScriptedGateway.call("transfer", to="eva", amount=20),
              ScriptedGateway.text("done")]
    store = open_journal(journal_url(workdir))
    try:
        async for step in build(url, workdir / "gate").run("pay", session=Session("pagos", ScriptedGateway(script), store)):
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
            try:
                # The first transfer's body has started (its intent is on disk before that): in flight now.
                wait_for(workdir / "gate.inflight", "the first transfer started", proc)
                cli = subprocess.run([sys.executable, "-m", "cuaderno", "--db", journal_url(workdir), "cancel",
                                      "pagos", "--reason", "the customer changed their mind", "--by", "ops"],
                                     capture_output=True, text=True, timeout=60)
                print(f"$ cuaderno cancel pagos --reason ...   (while the first transfer is in flight)\n"
                      f"  {cli.stdout.strip()}")
                in_flight = ledger.receipts(business_id="pagos")  # the world's word: nothing applied yet
                (workdir / "gate").touch()  # the cancellation is committed: let the transfer reach the ledger
                out, _ = proc.communicate(timeout=60)
            finally:
                if proc.poll() is None:  # it failed to get there: do not leave it waiting at the gate
                    proc.kill()
                    proc.wait()
            print(out.rstrip())
            receipts = ledger.receipts(business_id="pagos")
            store = open_journal(journal_url(workdir))
            cp = store.checkpoint("pagos")
            assert cp is not None and cp.outcome is not None
            print(f"\nstatus: {cp.status}; completed: {[c['step_id'] for c in cp.outcome['completed']]}; "
                  f"uncertain: {cp.outcome['uncertain']}; cleanup scheduled: {cp.outcome['cleanup']}")
            print(f"ledger receipts after the cancellation: {[(r['effect'], r['request']['args']) for r in receipts]}")
            results = asyncio.run(compensate(build(ledger.url), store, "pagos"))
            again = asyncio.run(compensate(build(ledger.url), store, "pagos"))
            after = ledger.receipts(business_id="pagos")
            store.close()
            print(f"compensate(): {[r['outcome'] for r in results]}; run again: {[r['outcome'] for r in again]}; "
                  f"ledger receipts now: {[(r['effect'], r['request']['args']['amount']) for r in after]}")
    kept = cuaderno_cli(workdir, "show", "pagos")
    if kept:
        print(f"journal kept; look at it with: {kept}")
    check(cli.returncode == 0 and in_flight == [], "cancelled while the first transfer was in flight")
    check(cp.status == "cancelled" and len(receipts) == 1, "one transfer completed, none after the cancellation")
    check(len(after) == 2 and after[1]["effect"] == "refund", "exactly one refund")
    return 0


if __name__ == "__main__":
    entry(main, child)
