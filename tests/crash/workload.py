"""The child program the crash tests kill: one agent run of one step kind, resumable.

``python workload.py --db URL --run R --kind K --turns N --work W [--ledger URL]``

It prints ``pid=N`` first and a JSON status line last (``{"status": ...}``); a SIGKILL at an
armed crash point (``CUADERNO_CRASH_AT``) ends it in between. Everything it does to the world is
recorded outside the journal: model generations in the fake provider's billing log
(``W/billing.jsonl``), idempotent tool calls in ``W/tool.jsonl``, transfers in the ledger
service's receipts (another process, its own SQLite file).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

from cuaderno import (
    Agent,
    ErrorClass,
    Policy,
    RunCancelled,
    RunClosed,
    ScriptedGateway,
    Session,
    ToolContext,
    ToolError,
    UncertainEffect,
    open_journal,
    tool,
)
from cuaderno.testing.ledger import LedgerClient, LedgerReplyLost, LedgerUnavailable
from cuaderno.testing.records import append_synced

KINDS = ("model", "model_dedup", "tool_idem", "tool_dedup", "tool_lookup", "tool_nodedup", "approval", "final")


def transfer_tool(url: str | None, run_id: str, *, idempotent: bool, with_lookup: bool) -> Any:
    client = LedgerClient(url or "http://127.0.0.1:1")

    def lookup(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        try:
            found = client.lookup(key=ctx.effect_key)
        except (LedgerUnavailable, LedgerReplyLost) as exc:
            raise RuntimeError(f"ledger unreachable: {exc}") from exc
        return None if found is None else found[0]

    @tool(idempotent=idempotent, lookup=lookup if with_lookup else None)
    def transfer(to: str, amount: int, ctx: ToolContext) -> dict[str, Any]:
        """Move money through the ledger service, keyed by the effect key."""
        try:
            return client.post_effect(ctx.effect_key, "transfer", {"to": to, "amount": amount, "from": "bank"},
                                      business_id=run_id)
        except LedgerUnavailable as exc:
            raise ToolError(str(exc), error_class=ErrorClass.TRANSIENT, sent=False) from exc
        except LedgerReplyLost as exc:
            raise ToolError(str(exc), error_class=ErrorClass.AMBIGUOUS, sent=True) from exc

    return transfer


def build(kind: str, run_id: str, turns: int, work: Path, ledger: str | None) -> tuple[Agent, ScriptedGateway]:
    @tool(idempotent=True)
    def note(text: str) -> str:
        """Write a note (idempotent; keeps a receipt of every call)."""
        append_synced(work / "tool.jsonl", {"text": text, "run": run_id})
        return f"noted {text}"

    policy = None
    if kind in ("model", "model_dedup", "tool_idem"):
        tools, calls = [note], [ScriptedGateway.call("note", text=f"n{i}") for i in range(turns)]
    elif kind == "final":
        tools, calls = [], []
    else:
        transfer = transfer_tool(ledger, run_id, idempotent=kind in ("tool_dedup", "approval"),
                                 with_lookup=kind == "tool_lookup")
        tools = [transfer]
        calls = [ScriptedGateway.call("transfer", to=f"acct{i}", amount=10 + i) for i in range(turns)]
        if kind == "approval":
            policy = Policy({"transfer": "require_approval"}, version="crash-1")
    gateway = ScriptedGateway([*calls, ScriptedGateway.text("done")], billing_log=work / "billing.jsonl",
                              stripe=kind == "model_dedup")
    # max_turns as before for the sweeps (<= 30 turns); the snapshot kills run 140 turns.
    return Agent(instructions=f"crash workload {kind}", tools=tools, policy=policy, max_turns=max(32, turns + 2)), gateway


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    agent, gateway = build(args.kind, args.run, args.turns, work, args.ledger)
    store = open_journal(args.db)
    try:
        last = None
        async for step in agent.run(f"task {args.kind}", session=Session(args.run, gateway, store)):
            last = step
        cp = store.checkpoint(args.run)
        assert cp is not None
        return {"status": cp.status, "last": type(last).__name__ if last else None}
    except UncertainEffect as exc:
        return {"status": "needs_human", "evidence": exc.evidence}
    except RunCancelled as exc:
        return {"status": "cancelled", "record": exc.record}
    except RunClosed as exc:
        return {"status": exc.status}
    finally:
        store.close()


def cancel_from_another_connection(db: str, run_id: str, *, wait: bool) -> None:
    """Commit a cancellation through another connection, as another process would.

    Inside a journal transaction the write lock is held, so the cancellation waits for it in a
    thread and commits right after; elsewhere it commits before the loop goes on.
    """
    import threading

    from cuaderno import cancel

    def go() -> None:
        with closing(open_journal(db)) as other:
            cancel(other, run_id, "R16", by="test")

    thread = threading.Thread(target=go)
    thread.start()
    if wait:
        thread.join()


def run_forked(argv: list[str], crash_at: str | None, result_path: str, cancel_at: str | None = None) -> None:
    """Entry point of a forked child: arm the crash point, run, write the result, exit."""
    from cuaderno.testing import crash

    crash.arm(crash_at)
    args = parser().parse_args(argv)
    if cancel_at:
        in_txn = cancel_at.endswith(("K1", "K6", "K8"))
        crash.on(cancel_at, lambda: cancel_from_another_connection(args.db, args.run, wait=not in_txn))
    result = asyncio.run(run(args))
    import threading

    for thread in threading.enumerate():  # a cancellation waiting for the write lock must land
        if thread is not threading.main_thread():
            thread.join(30)
    Path(result_path).write_text(json.dumps({"pid": os.getpid(), **result}))
    os._exit(0)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--kind", choices=KINDS, required=True)
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--work", required=True)
    ap.add_argument("--ledger", default=None)
    return ap


def main() -> int:
    args = parser().parse_args()
    print(f"pid={os.getpid()}", flush=True)
    result = asyncio.run(run(args))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
