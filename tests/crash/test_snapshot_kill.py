"""SIGKILL at every point of a snapshot's write, and during a resume that goes on from one.

A snapshot (``cuaderno.loop._snapshots``) commits in the transaction of a model turn's first
send; its points are ``snapshot.K0`` (before that transaction), ``snapshot.K6`` (inside it, every
row written), ``snapshot.K8`` (inside it, the rows written, the summary not) and ``snapshot.K7``
(after its commit). Each is killed at the run's first and second snapshot, for a model workload
(the fake provider's billing log), a deduplicating ledger and a ledger with a lookup (its
receipts); then, killed after the first snapshot's commit, the recovery itself is killed while it
opens the run from the snapshot (``recovery.R0/R2/R3``) and at its first send (``K2``, after the
conversation was rebuilt). Checked by ``_sweep.run_case`` from records cuaderno did not write:
every effect applied once, no journaled answer billed again, the journal only grew, the file's
integrity, the run completed.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from _report import record
from _sweep import Case, Outcome, run_case

from cuaderno import open_journal
from cuaderno.testing.ledger import LedgerProcess

TURNS = 140
"""Two snapshots (about 4 rows a turn, one snapshot every 256 rows)."""
KINDS = ("model", "tool_dedup", "tool_lookup")
POINTS = ("K0", "K6", "K8", "K7")


@dataclass
class SnapCase(Case):
    at: str = ""

    @property
    def crash_at(self) -> str:
        return self.at


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("ledgers")
    with LedgerProcess(d / "dedup.db", mode="dedup") as dedup, LedgerProcess(d / "nodedup.db", mode="nodedup") as nd:
        yield {"dedup": dedup, "nodedup": nd}


def _report(o: Outcome, backend: str = "SQLite") -> None:
    record({"test": f"snapshot kills ({backend})", "kind": o.case.kind, "point": o.case.point, "status": o.status,
            "kills": int(o.crashed) + int(o.second_crashed), "not_reached": int(not o.crashed),
            "duplicated": int(any("I1" in v for v in o.violations)), "rebilled_journaled": o.rebilled_journaled,
            "rebilled_in_flight": o.rebilled_unjournaled, "violations": len(o.violations)})


def _snapshots(db: Path | str, run_id: str) -> int:
    store = open_journal(db)
    try:
        return sum(ev.kind == "snapshot" for ev in store.load(run_id))  # the whole chain checked
    finally:
        store.close()


@pytest.mark.parametrize("hit", [1, 2])
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", KINDS)
def test_kill_at_a_snapshot_write(kind: str, point: str, hit: int, ledgers: dict[str, Any], tmp_path: Path) -> None:
    case = SnapCase(kind=kind, point=f"snap{point}h{hit}", seed=0, turns=TURNS, hit=hit, tag="snap-",
                    at=f"snapshot.{point}:{hit}")
    out = run_case(case, tmp_path, ledgers)
    _report(out)
    assert out.crashed, "the point was not reached"
    assert not out.violations, out.violations
    assert out.status == "completed"
    assert _snapshots(f"sqlite:///{tmp_path / 'runs.db'}", case.run_id) == 2  # the killed one written again, not twice


@pytest.mark.parametrize("second", ["R0", "R2", "R3", "K2"])
@pytest.mark.parametrize("kind", KINDS)
def test_kill_while_resuming_from_a_snapshot(kind: str, second: str, ledgers: dict[str, Any], tmp_path: Path) -> None:
    case = SnapCase(kind=kind, point="snapK7h1", seed=0, turns=TURNS, hit=1, tag="snapr-", second=second,
                    at="snapshot.K7:1")
    out = run_case(case, tmp_path, ledgers)
    _report(out)
    assert out.crashed and out.second_crashed, (out.crashed, out.second_crashed)
    assert not out.violations, out.violations
    assert out.status == "completed"
    # The index a tail read needs was made before the first snapshot committed (the recovery
    # opened on the killed process's -wal, on a connection that could not have made it).
    con = sqlite3.connect(tmp_path / "runs.db")
    try:
        assert con.execute("SELECT 1 FROM sqlite_master WHERE name='cuaderno_events_run_seq'").fetchone()
    finally:
        con.close()


PG_CASES = [("model", "K6", None), ("model", "K7", None), ("tool_lookup", "K8", None), ("tool_lookup", "K7", None),
            ("tool_dedup", "K7", "R2"), ("tool_lookup", "K7", "K2")]


@pytest.mark.postgres
@pytest.mark.parametrize(("kind", "point", "second"), PG_CASES)
def test_snapshot_kills_postgres(kind: str, point: str, second: str | None, ledgers: dict[str, Any], tmp_path: Path,
                                 pg_schemas: list[str]) -> None:  # noqa: F811
    """The same kills on PostgreSQL (a schema per case): at a snapshot's write, and during a
    recovery that goes on from one (the tail read on the (run_id, seq) index)."""
    pg_schemas.append(new_schema())
    url = schema_url(pg_schemas[-1])
    case = SnapCase(kind=kind, point=f"snap{point}h1", seed=0, turns=TURNS, hit=1, tag="snappg-", second=second,
                    at=f"snapshot.{point}:1")
    out = run_case(case, tmp_path, ledgers, journal=url)
    _report(out, "PostgreSQL")
    assert out.crashed and (second is None or out.second_crashed)
    assert not out.violations, out.violations
    assert out.status == "completed"
    assert _snapshots(url, case.run_id) == 2
