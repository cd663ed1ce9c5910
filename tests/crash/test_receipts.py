"""R2: the service accepted and applied the effect, and the runtime never persisted the reply.

Ground truth is the ledger's receipts (its own process, its own SQLite file). Variants:

- the runtime is SIGKILLed after the ledger committed its receipt and before the reply is read
  (``tool.K4``), with a deduplicating ledger (re-sent with the same key: the stored receipt comes
  back), a non-deduplicating ledger with a lookup (found by key), and one without (``needs_human``);
- the reply is lost in transit (the ledger closes the connection after applying);
- the ledger itself dies right after writing its receipt; it is restarted on the same file.

``CUADERNO_SOAK=1`` runs 50 trials per variant instead of 3.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _report import record
from _sweep import Outcome, case_for, run_case

from cuaderno.journal._compress import stored_payload
from cuaderno.testing.ledger import LedgerProcess, read_receipts

TRIALS = range(50 if os.environ.get("CUADERNO_SOAK") else 3)


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("ledgers-r2")
    with LedgerProcess(d / "dedup.db", mode="dedup") as dedup, LedgerProcess(d / "nodedup.db", mode="nodedup") as nd:
        yield {"dedup": dedup, "nodedup": nd}


def _intent_keys(db: Path, run_id: str) -> set[str]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT codec, payload FROM cuaderno_events WHERE run_id=? AND kind='tool' "
                           "AND phase='intent'", (run_id,)).fetchall()
    finally:
        con.close()
    return {stored_payload(*r)["effect_key"] for r in rows}


def _report(variant: str, status: str, receipts: int, duplicates: int, resent_nodedup: int,
            outcome: Outcome | None = None) -> None:
    """One R2 case's figures, measured: from the supervisor's outcome when the agent ran under it
    (kills from exit codes, re-bills from the billing log), else only what the test asserted."""
    record({"test": f"R2 accepted, not persisted ({variant})", "kind": variant, "point": "K4", "status": status,
            "kills": int(outcome.crashed) + int(outcome.second_crashed) if outcome else 0, "not_reached": 0,
            "duplicated": duplicates, "rebilled_journaled": outcome.rebilled_journaled if outcome else 0,
            "rebilled_in_flight": outcome.rebilled_unjournaled if outcome else 0,
            "violations": len(outcome.violations) if outcome else 0, "receipts": receipts, "resent": resent_nodedup})


@pytest.mark.parametrize("trial", TRIALS)
@pytest.mark.parametrize(("kind", "expected"), [("tool_dedup", "completed"), ("tool_lookup", "completed"),
                                                ("tool_nodedup", "needs_human")])
def test_killed_after_the_service_applied(kind: str, expected: str, trial: int, ledgers: dict[str, Any],
                                          tmp_path: Path) -> None:
    case = case_for(kind, "K4", trial)
    case.tag = "r2-"
    outcome = run_case(case, tmp_path, ledgers)
    assert outcome.crashed and not outcome.violations, outcome.violations
    assert outcome.status == expected
    ledger = ledgers["dedup" if kind == "tool_dedup" else "nodedup"]
    receipts = read_receipts(ledger.db_path, business_id=case.run_id)
    keys = {r["key"] for r in receipts}
    assert len(receipts) == len(keys) <= case.turns  # one receipt per effect, never two
    assert keys <= _intent_keys(tmp_path / "runs.db", case.run_id)  # the receipt's key is the journaled intent's
    replays = sum(int(r.get("replays", 0)) for r in receipts)
    if kind == "tool_nodedup":
        assert replays == 0  # nothing re-sent to a service that would apply it again
        assert outcome.evidence and outcome.evidence["effect_key"] in keys
    _report(kind, outcome.status, len(receipts), len(receipts) - len(keys), replays if kind == "tool_nodedup" else 0,
            outcome)


@pytest.mark.parametrize("trial", TRIALS)
@pytest.mark.parametrize(("kind", "mode", "expected"), [("tool_dedup", "dedup", "completed"),
                                                        ("tool_lookup", "nodedup", "completed"),
                                                        ("tool_nodedup", "nodedup", "needs_human")])
def test_reply_lost_in_transit(kind: str, mode: str, expected: str, trial: int, tmp_path: Path) -> None:
    with LedgerProcess(tmp_path / "ledger.db", mode=mode, drop_after_apply=1) as ledger:
        case = case_for(kind, "K0", trial)  # no crash point: armed on a point this kind never passes
        case.point = "none"
        case.tag = "r2-lost-"
        outcome = run_case(case, tmp_path / "w", {mode: ledger})
        receipts = read_receipts(ledger.db_path, business_id=case.run_id)
    keys = {r["key"] for r in receipts}
    assert outcome.status == expected, outcome
    assert len(receipts) == len(keys) == case.turns if expected == "completed" else len(receipts) == len(keys)
    assert not [v for v in outcome.violations if "I1" in v]
    _report(f"reply lost, {kind}", outcome.status, len(receipts), len(receipts) - len(keys), 0, outcome)


@pytest.mark.parametrize("trial", TRIALS)
def test_ledger_dies_after_its_receipt_and_comes_back(trial: int, tmp_path: Path) -> None:
    from cuaderno import ScriptedGateway, Session, SqliteCheckpointer, UncertainEffect

    db = tmp_path / "ledger.db"
    with LedgerProcess(db, mode="nodedup", crash_after_receipt=1) as ledger:
        port = ledger.port
        import workload

        agent_run = f"ledger-crash-{trial}"
        agent, gateway = workload.build("tool_lookup", agent_run, 1, tmp_path, ledger.url)
        store = SqliteCheckpointer(tmp_path / "runs.db")
        import asyncio

        async def go(gw: ScriptedGateway) -> str:
            try:
                async for _ in agent.run("task tool_lookup", session=Session(agent_run, gw, store)):
                    pass
            except UncertainEffect:
                return "needs_human"
            return store.checkpoint(agent_run).status  # type: ignore[union-attr]

        first = asyncio.run(go(gateway))
        assert ledger.wait(10) == -9  # the ledger died right after committing its receipt
    assert first == "needs_human"  # the lookup could not reach it: nobody can know yet
    with LedgerProcess(db, mode="nodedup", port=port) as again:
        _, gw2 = workload.build("tool_lookup", agent_run, 1, tmp_path, again.url)
        second = asyncio.run(go(gw2))
        receipts = read_receipts(db, business_id=agent_run)
    store.close()
    assert second == "completed"  # the lookup now finds the receipt: reconciled, not re-sent
    assert len(receipts) == 1
    _report("ledger crash after receipt", second, len(receipts), 0, 0)
