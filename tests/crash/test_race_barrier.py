"""R4/R5: 2 and 10 worker processes released at one barrier on one run, SQLite and PostgreSQL.

Two runs of the race: the run's first holder was SIGKILLed inside a non-idempotent tool body
(its intent committed, no result), or the run does not exist yet (every racer starts it). The
racers are forked from one process that imported everything (``_race.py``), open their own
stores, and block on one pipe until all are ready, so their takeovers meet in the same
milliseconds. Truth: the tool's receipts (the bank) and the fake provider's billing log.

Default: a few repetitions per backend. ``CUADERNO_SOAK=1``: 30 of 2 and 30 of 10 racers, per
backend and per start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from _report import record
from test_takeover import WORKLOAD, _killed_in_the_tool_body

from cuaderno.testing.records import read_records

pytestmark = pytest.mark.xdist_group("crash")

SOAK = bool(os.environ.get("CUADERNO_SOAK"))
REPS = {2: 30 if SOAK else 3, 10: 30 if SOAK else 1}
RACE = str(Path(__file__).resolve().parent / "_race.py")
CASES = [(racers, start, rep) for racers, reps in REPS.items() for start in ("dead holder", "new run")
         for rep in range(reps)]


def _world(tmp_path: Path, db: str) -> dict[str, Any]:
    (tmp_path / "takeover_workload.py").write_text(WORKLOAD)
    return {"dir": tmp_path, "db": db, "receipts": tmp_path / "receipts.jsonl", "billing": tmp_path / "billing.jsonl",
            "gate": tmp_path / "gate"}


def race(world: dict[str, Any], racers: int, start: str, backend: str) -> None:
    billed = 0
    if start == "dead holder":
        _killed_in_the_tool_body(world)  # intent committed, body never finished: no receipt
        billed = len(read_records(world["billing"]))
        assert read_records(world["receipts"]) == [] and billed == 1
    env = {k: v for k, v in os.environ.items() if k != "CUADERNO_CRASH_AT"}
    out = subprocess.run([sys.executable, RACE, str(world["db"]), str(racers), str(world["dir"])], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    verdicts = json.loads(out.stdout.strip().splitlines()[-1])
    receipts = read_records(world["receipts"])
    bills = len(read_records(world["billing"])) - billed
    keys = {r["key"] for r in receipts}
    record({"test": f"R4 {racers} workers at a barrier, {start} ({backend})", "kind": "tool_lookup",
            "point": "tool body" if start == "dead holder" else "start", "status": "completed",
            "kills": int(start == "dead holder"), "not_reached": 0, "duplicated": len(receipts) - len(keys),
            "rebilled_journaled": max(bills - (1 if start == "dead holder" else 2), 0), "rebilled_in_flight": 0,
            "violations": int(not set(verdicts) <= {"busy", "done"})})
    assert set(verdicts) <= {"busy", "done"} and "done" in verdicts, verdicts
    assert len(receipts) == 1, f"the transfer ran {len(receipts)} times: {verdicts}"
    # The dead holder's turn 0 was billed before it died: only the last turn is left to bill. A
    # new run bills its two turns, once.
    assert bills == (1 if start == "dead holder" else 2), f"{bills} model calls billed: {verdicts}"


@pytest.mark.parametrize(("racers", "start", "rep"), CASES)
def test_workers_at_a_barrier_sqlite(tmp_path: Path, racers: int, start: str, rep: int) -> None:
    race(_world(tmp_path, str(tmp_path / "runs.db")), racers, start, "SQLite")


@pytest.mark.postgres
@pytest.mark.parametrize(("racers", "start", "rep"), CASES)
def test_workers_at_a_barrier_postgres(tmp_path: Path, racers: int, start: str, rep: int,
                                       pg_schemas: list[str]) -> None:  # noqa: F811
    pg_schemas.append(new_schema())
    race(_world(tmp_path, schema_url(pg_schemas[-1])), racers, start, "PostgreSQL")
