"""``RunBudget(tool_calls=..., tool_calls_per_tool=...)`` under ``DurableRunner``: a tool call past a
bound is not started and the run ends ``failed`` with the budget record; calls of one turn run
concurrently and each counts the others'; a resumed run counts the calls its journal holds. The
ledger's receipts (it never deduplicates) are the proof of what ran."""

from __future__ import annotations

from pathlib import Path

from _oai_harness import ProviderProcess, journal_events, outcome, run_agent

from cuaderno import SqliteCheckpointer
from cuaderno.testing.ledger import LedgerProcess, read_receipts


def _transfers(journal: Path, run_id: str, ledger_db: Path) -> list[str]:
    """The recipients the ledger holds receipts for, for this run's effect keys."""
    keys = {e["payload"]["effect_key"] for e in journal_events(journal, run_id) if e["kind"] == "tool"
            and e["phase"] == "intent"}
    return sorted(r["request"]["args"]["to"] for r in read_receipts(ledger_db) if r["key"] in keys and r["effect"] == "transfer")


def _started(journal: Path, run_id: str) -> list[str]:
    return [e["step_id"] for e in journal_events(journal, run_id) if e["kind"] == "tool" and e["phase"] == "intent"]


def _end(journal: Path, run_id: str) -> tuple[str, object, object, object]:
    with SqliteCheckpointer(journal, readonly=True) as store:
        cp = store.checkpoint(run_id)
    assert cp is not None and cp.outcome is not None
    return cp.status, cp.outcome["budget"], cp.outcome["limit"], cp.outcome["spent"]


def test_a_tool_call_past_its_bound_is_not_started_and_a_resume_counts_the_journal(tmp_path: Path) -> None:
    ledger_db = tmp_path / "ledger.db"
    with ProviderProcess(tmp_path / "billing.jsonl") as provider, LedgerProcess(ledger_db, mode="nodedup") as ledger:
        journal = tmp_path / "runs.db"
        # Turn 0 asks for two transfers at once: they run concurrently, and the bound of one
        # transfer lets exactly one of them start. The refused one waits for it to end before the
        # run stops (the SDK cancels a failing call's siblings: cancelled after its intent, the
        # transfer's fate would be known to nobody): it is paid, and its result journaled.
        out = outcome(run_agent(journal, provider.url, ledger.url, "per-tool", "--budget=tool_calls_per_tool=transfer/1"))
        assert out == {"status": "failed", "budget": "tool_calls[transfer]"}
        assert _transfers(journal, "per-tool", ledger_db) == ["ana"] and len(_started(journal, "per-tool")) == 1
        results = [e for e in journal_events(journal, "per-tool") if e["kind"] == "tool" and e["phase"] == "result"]
        assert [r["payload"]["outcome"] for r in results] == ["ok"]
        assert _end(journal, "per-tool") == ("failed", "tool_calls[transfer]", 1, 1)

        # Two calls allowed: turn 0's two transfers; turn 1's calls are refused.
        out = outcome(run_agent(journal, provider.url, ledger.url, "capped", "--budget=tool_calls=2"))
        assert out == {"status": "failed", "budget": "tool_calls"}
        assert _transfers(journal, "capped", ledger_db) == ["ana", "bob"]
        assert _end(journal, "capped") == ("failed", "tool_calls", 2, 2)
        again = outcome(run_agent(journal, provider.url, ledger.url, "capped", "--budget=tool_calls=2"))
        assert again["status"] == "error" and "RunClosed" in again["error"]  # ended: nothing more runs
        assert _transfers(journal, "capped", ledger_db) == ["ana", "bob"]

        # Killed once turn 1's answer is journaled (turn 0's two transfers made), resumed under a
        # bound of three: one more call starts. Counted from zero, three would (carol, balance,
        # dave): dave is never paid, and no transfer is made twice.
        killed = outcome(run_agent(journal, provider.url, ledger.url, "resumed", "--budget=tool_calls=3",
                                   crash_at="model.K7:2"))
        assert killed["status"] == "killed"
        assert _transfers(journal, "resumed", ledger_db) == ["ana", "bob"]
        resumed = outcome(run_agent(journal, provider.url, ledger.url, "resumed", "--budget=tool_calls=3"))
        assert resumed == {"status": "failed", "budget": "tool_calls"}
        assert len(_started(journal, "resumed")) == 3
        paid = _transfers(journal, "resumed", ledger_db)
        assert "dave" not in paid and paid[:2] == ["ana", "bob"] and len(paid) == len(set(paid))
        assert _end(journal, "resumed") == ("failed", "tool_calls", 3, 3)
