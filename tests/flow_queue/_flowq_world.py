"""What the queue tests share: a journal on either backend (a PostgreSQL schema per test), a fake
ledger whose receipts are the independent record, and child processes (workers, submitters)."""

from __future__ import annotations

import calendar
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cuaderno import open_journal
from cuaderno.testing.ledger import LedgerProcess, read_receipts

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
sys.path.insert(0, str(HERE.parent / "crash"))  # _pg


def _pg_url(schemas: list[str]) -> str:
    from _pg import new_schema, schema_url, server_or_skip

    server_or_skip()
    schemas.append(new_schema())
    return schema_url(schemas[-1])


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fq_journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new journal's URL: a SQLite file, or a PostgreSQL schema of its own (dropped after)."""
    schemas: list[str] = []
    yield str(tmp_path / "runs.db") if request.param == "sqlite" else _pg_url(schemas)
    if schemas:
        from _pg import drop_schemas

        drop_schemas(schemas)


@pytest.fixture
def store(fq_journal: str) -> Iterator[Any]:
    """The journal ``fq_journal`` names, opened (closed after the test)."""
    s = open_journal(fq_journal)
    yield s
    s.close()


@dataclass
class FlowWorld:
    """One test's journal, ledger and the processes it started."""

    journal: str
    dir: Path
    ledger: LedgerProcess
    children: list[subprocess.Popen[str]] = field(default_factory=list)
    logs: int = 0

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
        env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(HERE)])
        env.update(FLOWQ_LEDGER=self.ledger.url, **extra)
        return env

    def worker(self, *args: str, **env: str) -> subprocess.Popen[str]:
        # Its log goes to a file: a pipe nobody reads would stop a long-lived worker once full.
        self.logs += 1
        with open(self.dir / f"worker-{self.logs}.log", "w") as log:
            child = subprocess.Popen([sys.executable, "-m", "cuaderno", "worker", "--journal", self.journal,
                                      "--agent", "flowq_agent:agent", "--poll-interval", "0.1", *args],
                                     env=self.env(**env), cwd=self.dir, stdout=subprocess.DEVNULL, stderr=log,
                                     text=True)
        self.children.append(child)
        return child

    def python(self, *args: str, **env: str) -> subprocess.Popen[str]:
        child = subprocess.Popen([sys.executable, *args], env=self.env(**env), cwd=self.dir,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.children.append(child)
        return child

    def receipts(self) -> list[dict[str, Any]]:
        return [r for r in read_receipts(self.ledger.db_path) if r["applied"]]

    def statuses(self) -> dict[str, str]:
        store = open_journal(self.journal)
        try:
            return {cp.run_id: cp.status for cp in store.list_runs(limit=100_000)}
        finally:
            store.close()

    def end_schedule(self, name: str, timeout: float) -> tuple[float, float, list[str], list[int]]:
        """Remove schedule ``name``, wait for every run to finish, and return when the schedule was
        created, when it was removed (the journal's clock), its runs' ids and their fire times (from
        the run ids, ``sched:<name>:<UTC time>``), in order."""
        from cuaderno.flow import list_schedules, remove_schedule
        from cuaderno.journal import queue_of

        store = open_journal(self.journal)
        try:
            created_at = next(s.created_at for s in list_schedules(store) if s.name == name)
            remove_schedule(store, name)
            removed_at = queue_of(store).now()
        finally:
            store.close()
        self.wait_until(lambda: all(s == "completed" for s in self.statuses().values()), timeout=timeout,
                        what="every scheduled run to finish")
        prefix = f"sched:{name}:"
        runs = sorted(r for r in self.statuses() if r.startswith(prefix))
        stamps = sorted(calendar.timegm(time.strptime(r.removeprefix(prefix), "%Y-%m-%dT%H:%M:%SZ")) for r in runs)
        return created_at, removed_at, runs, stamps

    def wait_until(self, done: Any, timeout: float = 120, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)

    def reap(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
            child.communicate()


@pytest.fixture
def fq_world(fq_journal: str, tmp_path: Path) -> Iterator[FlowWorld]:
    ledger = LedgerProcess(tmp_path / "ledger.sqlite3", mode="nodedup").start()
    world = FlowWorld(journal=fq_journal, dir=tmp_path, ledger=ledger)
    try:
        yield world
    finally:
        world.reap()
        ledger.stop()
