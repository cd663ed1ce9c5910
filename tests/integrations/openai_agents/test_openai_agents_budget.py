"""``DurableRunner(..., budget=RunBudget(...))``: a run past a bound sends nothing more and ends
``failed`` as cuaderno's runner ends it; the spending is the journal's, so a resume after a
SIGKILL counts nothing again. The fake provider's billing is the proof of what was sent."""

from __future__ import annotations

from pathlib import Path

from _oai_harness import ProviderProcess, journal_events, outcome, run_agent

from cuaderno import SqliteCheckpointer
from cuaderno.testing.ledger import LedgerProcess


def _mine(journal: Path, run_id: str, bills: list[dict[str, object]]) -> list[dict[str, object]]:
    keys = {e["payload"]["key"] for e in journal_events(journal, run_id) if e["kind"] == "model"
            and e["phase"] == "intent"}
    return [b for b in bills if b.get("key") in keys]


def test_a_run_past_its_budget_sends_nothing_more_and_a_resume_counts_nothing_again(tmp_path: Path) -> None:
    with ProviderProcess(tmp_path / "billing.jsonl") as provider, \
            LedgerProcess(tmp_path / "ledger.db", mode="nodedup") as ledger:
        journal = tmp_path / "runs.db"
        out = outcome(run_agent(journal, provider.url, ledger.url, "capped", "--budget=model_calls=2"))
        assert out == {"status": "failed", "budget": "model_calls"}
        assert len(_mine(journal, "capped", provider.bills())) == 2
        with SqliteCheckpointer(journal, readonly=True) as store:
            cp = store.checkpoint("capped")
        assert cp is not None and cp.status == "failed" and cp.outcome is not None
        assert (cp.outcome["reason"], cp.outcome["budget"], cp.outcome["limit"], cp.outcome["spent"]) == \
            ("budget", "model_calls", 2, 2)
        # Ended: the next call refuses it from the journal and sends nothing.
        again = outcome(run_agent(journal, provider.url, ledger.url, "capped", "--budget=model_calls=2"))
        assert again["status"] == "error" and "RunClosed" in again["error"]
        assert len(_mine(journal, "capped", provider.bills())) == 2

        # Killed once the second answer is journaled, resumed under a bound of three calls: the
        # two journaled answers replay uncounted, so exactly one more call is sent.
        killed = outcome(run_agent(journal, provider.url, ledger.url, "resumed", "--budget=model_calls=3",
                                   crash_at="model.K7:2"))
        assert killed["status"] == "killed"
        assert len(_mine(journal, "resumed", provider.bills())) == 2
        resumed = outcome(run_agent(journal, provider.url, ledger.url, "resumed", "--budget=model_calls=3"))
        assert resumed == {"status": "failed", "budget": "model_calls"}
        billed = _mine(journal, "resumed", provider.bills())
        assert len(billed) == 3 and len({b["key"] for b in billed}) == 3
