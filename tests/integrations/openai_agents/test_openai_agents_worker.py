"""``cuaderno worker`` resumes wrapped OpenAI Agents SDK runs: the run's process is SIGKILLed with
a transfer made and its reply unread, a ``cuaderno worker --agent module:attr`` process (``attr``:
``DurableRunner.resumable(agent, context=...)``) finishes it; the receipts server and the fake
provider's billing prove each transfer made once and no journaled model call sent again. On both
journals: a SQLite file, and a schema of its own on the machine's PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _oai_harness import HERE, SRC, ProviderProcess, outcome, run_agent, truth
from _pg import fresh_journal_url

from cuaderno.journal import open_journal
from cuaderno.testing.ledger import LedgerProcess


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The journal the run and the worker share: a SQLite file, or a fresh PostgreSQL schema."""
    yield from fresh_journal_url(request.param, tmp_path)


def _worker(journal: Path | str, provider: str, ledger: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{HERE}", "OAI_JOURNAL": str(journal),
           "OAI_PROVIDER": provider, "OAI_LEDGER": ledger}
    env.pop("CUADERNO_CRASH_AT", None)
    done = subprocess.run([sys.executable, "-m", "cuaderno", "worker", "--journal", str(journal), "--agent",
                           "_oai_worker_target:resumable", "--until-idle", "--poll-interval", "0.05"],
                          cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.startswith("{")]
    return done.returncode, (json.loads(lines[-1]) if lines else {}), done.stderr


def test_a_worker_finishes_a_run_whose_process_was_killed(tmp_path: Path, journal: str) -> None:
    run_id = "run-worker"
    with ProviderProcess(tmp_path / "billing.jsonl") as provider, \
            LedgerProcess(tmp_path / "ledger.db", mode="nodedup") as ledger:
        first = outcome(run_agent(journal, provider.url, ledger.url, run_id, crash_at="tool.K4:2"))
        assert first["status"] == "killed"
        store = open_journal(journal, create=False)
        try:
            cp = store.checkpoint(run_id)
        finally:
            store.close()
        assert cp is not None and cp.status == "running"

        code, stats, err = _worker(journal, provider.url, ledger.url)
        assert code == 0, err
        assert stats["claimed"] == 1 and stats["completed"] == 1, err
        t = truth(journal, run_id, ledger.db_path, provider.bills())
        assert t.duplicated == 0 and dict(t.effects) == {"transfer": 5, "notify": 1}
        assert t.rebilled_journaled == 0 and t.rebilled_in_flight == 0 and t.unkeyed == 0

        # The application's next call answers from the journal; a second worker finds nothing.
        again = outcome(run_agent(journal, provider.url, ledger.url, run_id))
        assert again["status"] == "completed" and again["replayed"] and again["final"] == {"transfers": 5, "total": 150}
        code, stats, err = _worker(journal, provider.url, ledger.url)
        assert code == 0 and stats["claimed"] == 0, err
        assert truth(journal, run_id, ledger.db_path, provider.bills()).billed == t.billed
