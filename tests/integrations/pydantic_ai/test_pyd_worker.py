"""``cuaderno worker`` resumes wrapped Pydantic AI runs: the run's process is SIGKILLed mid-run,
a ``cuaderno worker --agent module:attr`` process (``attr``: the ``DurableAgent``'s resumable)
finishes it, and the payment service's receipts and the provider's billing prove each transfer
made once and no journaled model request sent again. A decided approval is continued by the
worker too; a run of another agent definition is left alone. Each on both journals: a SQLite
file, and a schema of its own on the machine's PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _pg import fresh_journal_url
from _pyd_runs import Runner, cli
from _servers import Provider, Receipts

from cuaderno.journal import open_journal

HERE = Path(__file__).resolve().parent
PROMPT = 'PAY: [["transfer", "ana", 10], ["transfer", "bob", 20], ["transfer", "cy", 30]]'


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The journal the runs and the worker share: a SQLite file, or a fresh PostgreSQL schema."""
    yield from fresh_journal_url(request.param, tmp_path)


def _worker(db: str, provider: str, receipts: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    env = {**os.environ, "PYD_JOURNAL": str(db), "PYD_PROVIDER": provider, "PYD_RECEIPTS": receipts}
    env.pop("CUADERNO_CRASH_AT", None)
    done = subprocess.run([sys.executable, "-m", "cuaderno", "worker", "--journal", str(db), "--agent",
                           "_pyd_worker_target:resumable", "--until-idle", "--poll-interval", "0.05", *extra],
                          cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "{}"
    stats = json.loads(last) if last.startswith("{") else {}
    return done.returncode, stats, done.stderr


def _status(db: str, run_id: str) -> str:
    store = open_journal(db, create=False)
    try:
        cp = store.checkpoint(run_id)
    finally:
        store.close()
    assert cp is not None
    return cp.status


def test_a_worker_finishes_a_run_whose_process_was_killed(db: str, servers: tuple[Provider, Receipts],
                                                          runner: Runner) -> None:
    provider, receipts = servers
    name = f"worker-kill-{'pg' if '://' in db else 'sqlite'}"
    # Killed with bob's transfer made and its reply unread: the worker must ask the payment
    # service (the lookup) and not pay bob again.
    killed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT, crash_at="tool.K4:2")
    assert killed.killed and _status(db, "pay") == "running"
    billed_before = len(provider.billing(name))

    code, stats, err = _worker(db, provider.base_url(name), receipts.base_url(name))
    assert code == 0, err
    assert stats["claimed"] == 1 and stats["completed"] == 1, err
    assert _status(db, "pay") == "completed"
    paid = receipts.receipts(name)
    assert [r["to"] for r in paid] == ["ana", "bob", "cy"] and len({r["key"] for r in paid}) == 3
    billed = provider.billing(name)
    assert len({b["key"] for b in billed}) == len(billed)  # no model request billed twice
    assert len(billed) > billed_before  # the worker asked the model for what was left

    # The run is done: the application's next call answers from the journal, a second worker has nothing to do.
    closed = runner.run(db, provider.base_url(name), receipts.base_url(name), "pay", PROMPT)
    assert closed.out is not None and closed.out["replayed"] and closed.out["output"]["paid"] == ["ana", "bob", "cy"]
    code, stats, err = _worker(db, provider.base_url(name), receipts.base_url(name))
    assert code == 0 and stats["claimed"] == 0, err
    assert len(provider.billing(name)) == len(billed) and len(receipts.receipts(name)) == 3


def test_a_worker_continues_a_run_once_its_approval_is_decided(db: str, servers: tuple[Provider, Receipts],
                                                               runner: Runner) -> None:
    provider, receipts = servers
    name = f"worker-approve-{'pg' if '://' in db else 'sqlite'}"
    prompt = 'PAY: [["transfer", "ana", 10], ["big_transfer", "bob", 5000]]'
    first = runner.run(db, provider.base_url(name), receipts.base_url(name), "big", prompt)
    assert first.out is not None and first.out["status"] == "suspended"
    [pending] = first.out["pending"]
    code, stats, err = _worker(db, provider.base_url(name), receipts.base_url(name))
    assert code == 0 and stats["claimed"] == 0, err  # waiting for a person: nothing a worker can do
    ok = cli(db, "approve", "big", "t0001.tool00", "--fingerprint", pending["fingerprint"], "--by", "ana")
    assert ok.returncode == 0, ok.stderr
    code, stats, err = _worker(db, provider.base_url(name), receipts.base_url(name))
    assert code == 0 and stats["claimed"] == 1 and stats["completed"] == 1, err
    assert [(r["to"], r["amount"]) for r in receipts.receipts(name)] == [("ana", 10), ("bob", 5000)]
    billed = Counter(b["key"] for b in provider.billing(name))
    assert max(billed.values()) == 1


def test_a_worker_leaves_runs_of_another_definition_alone(db: str, servers: tuple[Provider, Receipts],
                                                          runner: Runner) -> None:
    provider, receipts = servers
    name = f"worker-versions-{'pg' if '://' in db else 'sqlite'}"
    killed = runner.run(db, provider.base_url(name), receipts.base_url(name), "other", PROMPT, crash_at="tool.K4:1",
                        kind="non_idempotent")  # declared otherwise: another definition
    assert killed.killed
    paid = receipts.receipts(name)
    code, stats, err = _worker(db, provider.base_url(name), receipts.base_url(name))
    assert code == 0 and stats["claimed"] == 0 and "left for a worker of those" in err, err
    assert _status(db, "other") == "running" and receipts.receipts(name) == paid
