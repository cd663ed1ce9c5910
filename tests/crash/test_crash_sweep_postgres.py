"""R1 on PostgreSQL: SIGKILL at the crash points that fall inside and around the backend's own
transactions, for every step kind, then recover, with the same checks from receipts as SQLite's
sweep (``test_crash_sweep.py``): the ledger's receipts, the fake provider's billing log and the
idempotent tool's receipt file, never our journal alone.

Each case's journal is a PostgreSQL schema of its own. Default: K1 (inside the intent
transaction), K6 (inside the result transaction; K7, after it, for an approval and a final
answer, which send nothing) and K8 (between the rows and the summary, in one transaction), seed
0. ``CUADERNO_SOAK=1`` runs every point K0-K8 with 20 seeds (``CUADERNO_SOAK_SEEDS=N``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from _report import record
from _sweep import KINDS_ALL, POINTS, case_for, run_case
from test_crash_sweep import NOT_ON_THE_PATH

from cuaderno.testing.ledger import LedgerProcess

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("crash")]

SOAK = bool(os.environ.get("CUADERNO_SOAK"))
SEEDS = range(int(os.environ.get("CUADERNO_SOAK_SEEDS", "20")) if SOAK else 1)


def _points(kind: str) -> tuple[str, ...]:
    if SOAK:
        return POINTS
    return ("K1", "K7", "K8") if kind in ("approval", "final") else ("K1", "K6", "K8")


CASES = [(k, p, s) for k in KINDS_ALL for p in _points(k) for s in SEEDS]


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("ledgers")
    with LedgerProcess(d / "dedup.db", mode="dedup") as dedup, LedgerProcess(d / "nodedup.db", mode="nodedup") as nd:
        yield {"dedup": dedup, "nodedup": nd}


@pytest.mark.parametrize(("kind", "point", "seed"), CASES)
def test_kill_at_every_point_postgres(kind: str, point: str, seed: int, ledgers: dict[str, Any], tmp_path: Path,
                                      pg_schemas: list[str]) -> None:  # noqa: F811
    pg_schemas.append(new_schema())
    case = case_for(kind, point, seed)
    case.tag = "pg-"  # the ledgers are shared with the SQLite sweep's module: business ids apart
    outcome = run_case(case, tmp_path, ledgers, journal=schema_url(pg_schemas[-1]))
    record({"test": "R1 kill at every point (PostgreSQL)", "kind": kind, "point": point, "status": outcome.status,
            "kills": int(outcome.crashed), "not_reached": int(not outcome.crashed),
            "duplicated": int(any("I1" in v for v in outcome.violations)),
            "rebilled_journaled": outcome.rebilled_journaled, "rebilled_in_flight": outcome.rebilled_unjournaled,
            "violations": len(outcome.violations)})
    assert not outcome.violations, outcome.violations
    assert not (tmp_path / "runs.db").exists()  # the journal was PostgreSQL's, not a file
    if case.hit == 1:
        assert outcome.crashed == ((kind, point) not in NOT_ON_THE_PATH), (kind, point, outcome.crashed)
    if kind != "tool_nodedup":
        assert outcome.status == "completed"
