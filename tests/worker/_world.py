"""What the worker tests share: a journal on either backend, a fake ledger whose receipts are the
ground truth, and child processes (an application that starts runs, ``cuaderno worker``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cuaderno import approve, open_journal
from cuaderno.testing.ledger import LedgerProcess, read_receipts
from cuaderno.testing.records import read_records

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
sys.path.insert(0, str(HERE.parent / "crash"))  # _pg


@dataclass
class World:
    """One test's journal, ledger and the processes it started."""

    journal: str
    dir: Path
    ledger: LedgerProcess
    backend: str
    children: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def billing(self) -> Path:
        return self.dir / "billing.jsonl"

    @property
    def gate(self) -> Path:
        return self.dir / "gate"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("CUADERNO_CRASH_AT", "WORKER_GATE")}
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE)])
        env.update(WORKER_LEDGER=self.ledger.url, WORKER_BILLING=str(self.billing), **extra)
        return env

    def start_runs(self, kind: str, runs: list[str], **env: str) -> subprocess.Popen[str]:
        child = subprocess.Popen([sys.executable, str(HERE / "start_runs.py"), self.journal, kind, *runs],
                                 env=self.env(**env), cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        self.children.append(child)
        return child

    def worker(self, agent: str = "worker_agent:agent", *args: str, **env: str) -> subprocess.Popen[str]:
        gateway = ["--gateway", "worker_agent:approving_gateway"] if agent.endswith("approving_agent") else []
        child = subprocess.Popen([sys.executable, "-m", "cuaderno", "worker", "--journal", self.journal,
                                  "--agent", agent, *gateway, "--poll-interval", "0.1", *args],
                                 env=self.env(**env), cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        self.children.append(child)
        return child

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cuaderno", "--db", self.journal, *args], env=self.env(),
                              cwd=self.dir, capture_output=True, text=True, timeout=120)

    def approve_all(self, runs: list[str]) -> None:
        """Approve each run's first tool call, as a person would between two workers."""
        store = open_journal(self.journal)
        try:
            for run_id in runs:
                approve(store, run_id, "t0000.tool00", approver="test")
        finally:
            store.close()

    def receipts(self) -> list[dict[str, Any]]:
        return [r for r in read_receipts(self.ledger.db_path) if r["applied"]]

    def applied_per_key(self) -> Counter[str]:
        return Counter(r["key"] for r in self.receipts())

    def billed(self) -> int:
        return len(read_records(self.billing))

    def statuses(self) -> dict[str, str]:
        store = open_journal(self.journal)
        try:
            return {cp.run_id: cp.status for cp in store.list_runs(limit=100_000)}
        finally:
            store.close()

    def wait_until(self, done: Any, timeout: float = 120, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not done():
            for child in self.children:
                if child.poll() is not None and child.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM):
                    raise AssertionError(f"a child failed: {child.args}: {child.communicate()}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)

    def reap(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.communicate()


def _pg_url(schemas: list[str]) -> str:
    from _pg import new_schema, schema_url, server_or_skip

    server_or_skip()
    schemas.append(new_schema())
    return schema_url(schemas[-1])


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    schemas: list[str] = []
    journal = str(tmp_path / "runs.db") if request.param == "sqlite" else _pg_url(schemas)
    ledger = LedgerProcess(tmp_path / "ledger.sqlite3", mode="nodedup").start()
    w = World(journal=journal, dir=tmp_path, ledger=ledger, backend=request.param)
    try:
        yield w
    finally:
        w.reap()
        ledger.stop()
        if schemas:
            from _pg import drop_schemas

            drop_schemas(schemas)
