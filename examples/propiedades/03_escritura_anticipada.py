"""Escritura anticipada: the intent is on disk before a non-idempotent tool runs.

A child process sends a transfer to a ledger service (another process, its own SQLite) and is
SIGKILLed after the ledger applied it and before the reply was read (crash point ``tool.K4``).
Three tools, three answers on resume:

- no lookup, non-deduplicating service: nobody can know -> ``UncertainEffect``, ``needs_human``,
  zero re-sends (the ledger's receipts prove the effect happened exactly once);
- a lookup by effect key: cuaderno asks first, finds the receipt, adopts it -> ``completed``;
- a deduplicating service (idempotent by key): re-sent with the same effect key, the ledger
  returns the stored receipt -> ``completed``, still one receipt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _comun import check, cuaderno_cli, died, entry, example_dir, journal_note, run_pass

from cuaderno import (
    Agent,
    ErrorClass,
    ScriptedGateway,
    Session,
    SqliteCheckpointer,
    ToolContext,
    ToolError,
    UncertainEffect,
    tool,
)
from cuaderno.testing.ledger import LedgerClient, LedgerProcess, LedgerReplyLost


def build(variant: str, url: str) -> Agent:
    client = LedgerClient(url)

    def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        found = client.lookup(key=ctx.effect_key)
        return None if found is None else found[0]

    @tool(idempotent=variant == "dedup", lookup=lookup if variant == "lookup" else None)
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money through the ledger, keyed by the effect key."""
        try:
            return client.post_effect(ctx.effect_key, "transfer", {"to": to, "amount": amount}, business_id=variant)
        except LedgerReplyLost as exc:
            raise ToolError(str(exc), error_class=ErrorClass.AMBIGUOUS, sent=True) from exc

    return Agent(instructions="Pay what is asked.", tools=[transfer])


async def child(workdir: Path, variant: str, url: str) -> None:
    print(f"pid={os.getpid()}", flush=True)
    gateway = ScriptedGateway([ScriptedGateway.call("transfer", to="ana", amount=100), ScriptedGateway.text("done")])
    store = SqliteCheckpointer(workdir / "runs.db")
    try:
        async for step in build(variant, url).run("pay ana 100", session=Session(variant, gateway, store)):
            print(f"  {type(step).__name__} {step.step_id}", flush=True)
        print(f"status={store.checkpoint(variant).status}", flush=True)  # type: ignore[union-attr]
    except UncertainEffect as exc:
        print(f"  UncertainEffect: {exc}", flush=True)
        print("status=needs_human", flush=True)
    finally:
        store.close()


def main() -> int:
    script = str(Path(__file__).resolve())
    print("cuaderno: write-ahead intent (seed 000) and reconciliation (seed 001 §4)\n")
    with example_dir("cuaderno-intent-") as workdir:
        for variant, mode, expected in (("nodedup", "nodedup", "needs_human"), ("lookup", "nodedup", "completed"),
                                        ("dedup", "dedup", "completed")):
            with LedgerProcess(workdir / f"ledger-{variant}.db", mode=mode) as ledger:
                first = run_pass(script, workdir, variant, ledger.url, crash_at="tool.K4:1")
                second = run_pass(script, workdir, variant, ledger.url)
                receipts = ledger.receipts(business_id=variant)
                replays = sum(int(r.get("replays", 0)) for r in receipts)
                status = second.stdout.strip().splitlines()[-1].split("=", 1)[1]
                print(f"{variant:>8}: pass 1 {died(first)} after the ledger applied the transfer; "
                      f"pass 2 -> {status}; ledger receipts: {len(receipts)}, replays served: {replays}")
                check(first.returncode == -9, "pass 1 must be killed")
                check(len(receipts) == 1, f"{variant}: the effect must exist exactly once")
                check(status == expected, f"{variant}: expected {expected}, got {status}")
                if variant == "nodedup":
                    check(replays == 0, "nothing may be re-sent to a service that does not deduplicate")
        store = SqliteCheckpointer(workdir / "runs.db")
        cp = store.checkpoint("nodedup")
        store.close()
        assert cp is not None
        evidence = cp.uncertain["t0000.tool00"]
        print(f"\nneeds_human evidence kept in the checkpoint: tool={evidence['tool']}, "
              f"effect_key={evidence['effect_key']}, reason={evidence['reason']!r}")
        print(journal_note(workdir, "show", "nodedup"))
        resolve = cuaderno_cli(workdir, "resolve", "nodedup", "t0000.tool00")
        if resolve:
            print(f"once a person checked the ledger, settle it with: {resolve} --happened (or --not-happened)")
        else:
            print("once a person checked the ledger, `cuaderno resolve` (or `cuaderno.resolve(...)`) settles it.")
    return 0


if __name__ == "__main__":
    entry(main, child)
