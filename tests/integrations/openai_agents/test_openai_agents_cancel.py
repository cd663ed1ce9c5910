"""Cancelling a wrapped OpenAI Agents SDK run killed mid-run: the next call meets the request,
closes the run with cuaderno's cancellation record and sends nothing more; each transfer that
happened is undone by its declared refund, once, as an effect, across a SIGKILL in the middle of
the refunds. The ledger's receipts and the provider's billing are the proof."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from _oai_harness import ProviderProcess, journal_events, outcome, run_agent

from cuaderno import SqliteCheckpointer
from cuaderno.cancellation import cancel
from cuaderno.testing.ledger import LedgerProcess, read_receipts


def test_a_cancelled_run_refunds_each_transfer_once_across_a_kill(tmp_path: Path) -> None:
    journal, run_id = tmp_path / "runs.db", "run-cancel"
    with ProviderProcess(tmp_path / "billing.jsonl") as provider, \
            LedgerProcess(tmp_path / "ledger.db", mode="nodedup") as ledger:
        def run(*flags: str, crash_at: str | None = None) -> dict[str, object]:
            return outcome(run_agent(journal, provider.url, ledger.url, run_id, "--refunds", *flags,
                                     crash_at=crash_at))

        assert run(crash_at="tool.K7:2")["status"] == "killed"  # two transfers made and journaled
        with SqliteCheckpointer(journal) as store:
            cancel(store, run_id, "stop paying", by="ana")
        billed = len(provider.bills())
        assert run() == {"status": "cancelled", "cleanup": 2}
        assert len(provider.bills()) == billed  # closing it asked the model nothing
        transfers = [r for r in read_receipts(ledger.db_path) if r["effect"] == "transfer"]
        assert len(transfers) == 2

        assert run("--compensate", crash_at="tool.K4:2")["status"] == "killed"  # second refund made, reply unread
        assert run("--compensate") == {"status": "compensated", "outcomes": ["ok", "ok"]}
        assert run("--compensate") == {"status": "compensated", "outcomes": ["ok", "ok"]}
        refunds = [r for r in read_receipts(ledger.db_path) if r["effect"] == "refund"]
        assert len(refunds) == 2 and max(Counter(r["key"] for r in refunds).values()) == 1
        assert {(r["request"]["args"]["to"], r["request"]["args"]["amount"]) for r in refunds} == \
            {(t["request"]["args"]["to"], t["request"]["args"]["amount"]) for t in transfers}
        assert run() == {"status": "cancelled", "cleanup": 2}  # closed: answered with its record
        events = journal_events(journal, run_id)
        assert [e["step_id"] for e in events if e["phase"] == "result" and e["step_id"].startswith("cleanup")] == \
            ["cleanup00", "cleanup01"]
        assert len([r for r in read_receipts(ledger.db_path) if r["effect"] == "transfer"]) == 2
