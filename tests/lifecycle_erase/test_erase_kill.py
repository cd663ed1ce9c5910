"""R26, the erase part: an ``erase`` process SIGKILLed at each of its named points
(``erase.E0`` before its transaction, ``E1`` the summary rewritten, ``E2`` every row erased before
COMMIT, ``E3`` committed before the files are scrubbed, ``E4`` scrubbed), on SQLite and PostgreSQL,
while two other processes drive their own runs through the ledger service.

Proved from records the journal does not keep: the ledger's receipts (every transfer of every
other run exactly once) and the bytes of the journal's files. The erased run is never half
erased: its rows are all erased or none, and its summary says erased exactly when they are; the
next ``erase`` finishes, after which no file holds its secret."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _erase_world import grep_files, run_with_secret, secret
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture

from cuaderno.journal import open_journal
from cuaderno.operations import erase
from cuaderno.testing.ledger import LedgerProcess, read_receipts

WORKLOAD = Path(__file__).resolve().parents[1] / "crash" / "workload.py"
POINTS = ("erase.E0", "erase.E1", "erase.E2", "erase.E3", "erase.E4")
TURNS = 8


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LedgerProcess]:
    with LedgerProcess(tmp_path_factory.mktemp("ledger-r26") / "dedup.db", mode="dedup") as served:
        yield served


def _env() -> dict[str, str]:
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def _workers(url: str, runs: list[str], work: Path, ledger: LedgerProcess) -> list[subprocess.Popen[str]]:
    work.mkdir(exist_ok=True)
    return [subprocess.Popen([sys.executable, str(WORKLOAD), "--db", url, "--run", run, "--kind", "tool_dedup",
                              "--turns", str(TURNS), "--work", str(work), "--ledger", ledger.url],
                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for run in runs]


def _killed_erase(url: str, point: str) -> int:
    code = textwrap.dedent(f"""
        from cuaderno.journal import open_journal
        from cuaderno.operations import erase
        store = open_journal({url!r})
        erase(store, "gone", reason="R26")
        store.close()
    """)
    done = subprocess.run([sys.executable, "-c", code], env={**_env(), "CUADERNO_CRASH_AT": f"{point}:1"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -9, done.stderr[-2000:]
    return done.returncode


def _state_of_gone(url: str) -> tuple[int, int, bool]:
    """(rows erased, rows, summary says erased) of the erased run, read by a new process's store."""
    with open_journal(url) as store:
        cp = store.checkpoint("gone")
        events = store.load("gone")  # the chain checks out, whatever the kill left
    assert cp is not None
    return sum(e.erased for e in events), len(events), bool(cp.outcome and "erased" in cp.outcome)


def _check(url: str, point: str, workers: list[subprocess.Popen[str]], runs: list[str],
           ledger: LedgerProcess) -> dict[str, Any]:
    erased, rows, says = _state_of_gone(url)
    assert erased in (0, rows) and says == (erased == rows)  # never half erased
    assert says == (point in ("erase.E3", "erase.E4"))  # committed exactly from E3 on
    with open_journal(url) as store:
        done = erase(store, "gone")  # finishes (or redoes) what the kill left
        assert done.scrubbed
    workers_finished_each_transfer_once(workers, runs, ledger)
    return {"erased_after_kill": erased, "rows": rows}


def workers_finished_each_transfer_once(workers: list[subprocess.Popen[str]], runs: list[str],
                                        ledger: LedgerProcess) -> None:
    """Every worker exited cleanly with its run completed, and the ledger holds each of the runs'
    TURNS transfers exactly once (one receipt per effect key): the truth from outside cuaderno."""
    for proc in workers:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-2000:]
        assert '"status": "completed"' in out, out[-500:]
    receipts = {run: read_receipts(ledger.db_path, business_id=run) for run in runs}
    assert all(len(r) == TURNS for r in receipts.values()), {k: len(v) for k, v in receipts.items()}
    assert all(len({x["key"] for x in r}) == TURNS for r in receipts.values())


@pytest.mark.parametrize("point", POINTS)
async def test_erase_killed_on_sqlite(tmp_path: Path, point: str, ledger: LedgerProcess) -> None:
    db = tmp_path / "j.db"
    url = str(db)
    token = secret()
    with open_journal(url) as store:
        await run_with_secret(store, "gone", token)
    runs = [f"other-{point}-{i}" for i in range(2)]
    workers = _workers(url, runs, tmp_path / "work", ledger)
    _killed_erase(url, point)
    _check(url, point, workers, runs, ledger)
    files = sorted(db.parent.glob(db.name + "*"))
    assert grep_files(files, token) == dict.fromkeys((f.name for f in files), 0)


@pytest.mark.postgres
@pytest.mark.parametrize("point", POINTS)
async def test_erase_killed_on_postgres(tmp_path: Path, point: str, ledger: LedgerProcess,
                                        pg_schemas: list[str]) -> None:  # noqa: F811
    schema = new_schema()
    pg_schemas.append(schema)
    url = schema_url(schema)
    with open_journal(url) as store:
        await run_with_secret(store, "gone", secret())
    runs = [f"other-{point}-{i}" for i in range(2)]
    workers = _workers(url, runs, tmp_path / "work", ledger)
    _killed_erase(url, point)
    _check(url, point, workers, runs, ledger)
