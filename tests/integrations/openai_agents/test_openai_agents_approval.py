"""``needs_approval`` tools of the OpenAI Agents SDK become cuaderno approvals, decided with the
``cuaderno`` command line, bound to the exact arguments, and run exactly once across a kill
(receipts server as the truth)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _oai_harness import SRC, ProviderProcess, outcome, run_agent, truth

from cuaderno.testing.ledger import LedgerProcess

STEP = "t0003.tool.call_3_1"  # notify: the second call of the fourth model turn


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("oai-approval")
    with ProviderProcess(d / "billing.jsonl") as provider, LedgerProcess(d / "ledger.db", mode="nodedup") as ledger:
        yield {"dir": d, "provider": provider, "ledger": ledger}


def cli(journal: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "cuaderno", "--db", str(journal), *args], capture_output=True,
                          text=True, env=env, timeout=60)


def test_approved_call_runs_exactly_once_across_a_kill(world: dict[str, Any]) -> None:
    d, provider, ledger = world["dir"], world["provider"], world["ledger"]
    journal, run = d / "approve.db", "run-approve"
    first = outcome(run_agent(journal, provider.url, ledger.url, run, "--approval"))
    assert first == {"status": "suspended", "pending": [f"{STEP}.approval"]}
    assert truth(journal, run, ledger.db_path, provider.bills()).effects == {"transfer": 5}  # notify waits

    shown = cli(journal, "show", run)
    assert shown.returncode == 0 and "suspended" in shown.stdout and f"{STEP}.approval" in shown.stdout \
        and "notify" in shown.stdout, shown.stdout
    again = outcome(run_agent(journal, provider.url, ledger.url, run, "--approval"))
    assert again == first  # still waiting: nothing runs, nothing is billed twice

    wrong = cli(journal, "approve", run, STEP, "--fingerprint", "0" * 64)
    assert wrong.returncode != 0 and "nothing was written" in wrong.stderr, (wrong.stdout, wrong.stderr)
    assert outcome(run_agent(journal, provider.url, ledger.url, run, "--approval")) == first

    ok = cli(journal, "approve", run, STEP, "--by", "ana")
    assert ok.returncode == 0 and "approved" in ok.stdout, (ok.stdout, ok.stderr)
    # The approved call is sent, and the process dies with the receipt recorded, its reply unread.
    killed = outcome(run_agent(journal, provider.url, ledger.url, run, "--approval", crash_at="tool.K4:1"))
    assert killed == {"status": "killed"}
    done = outcome(run_agent(journal, provider.url, ledger.url, run, "--approval"))
    assert done["status"] == "completed" and done["final"] == {"transfers": 5, "total": 150}
    t = truth(journal, run, ledger.db_path, provider.bills())
    assert t.effects == {"transfer": 5, "notify": 1} and t.duplicated == 0
    assert (t.billed, t.rebilled_journaled, t.unkeyed) == (5, 0, 0)  # every answer replayed, none asked again


def test_denied_call_never_runs_and_the_model_is_told(world: dict[str, Any]) -> None:
    d, provider, ledger = world["dir"], world["provider"], world["ledger"]
    journal, run = d / "deny.db", "run-deny"
    assert outcome(run_agent(journal, provider.url, ledger.url, run, "--approval"))["status"] == "suspended"
    denied = cli(journal, "deny", run, STEP, "--reason", "not today")
    assert denied.returncode == 0, denied.stderr
    done = outcome(run_agent(journal, provider.url, ledger.url, run, "--approval"))
    assert done["status"] == "completed"
    assert truth(journal, run, ledger.db_path, provider.bills()).effects == {"transfer": 5}
