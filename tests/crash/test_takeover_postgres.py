"""R4 on PostgreSQL: processes racing for one run whose holder died, from receipts.

The same workload and checks as ``test_takeover.py`` (the tool's receipts file is the bank, the
fake provider's billing log the bill), with the journal in a PostgreSQL schema of the test's own:
there a holder's liveness is the server's session advisory lock, dropped when the holder's
connection ends, so a killed holder is taken over at once and a live one never.

Default: 2 processes started together, 10 repetitions, and a live and a killed holder.
``CUADERNO_SOAK=1``: 30 repetitions of 2 and of 10 processes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _pg import new_schema, pg_schemas, schema_url  # noqa: F401 - the fixture
from test_takeover import (
    race_resumers,
    test_a_killed_holder_is_taken_over_at_once,
    test_a_live_holder_is_not_taken_over,
)

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("crash")]

# The SQLite module's tests, run here against this module's ``world`` (a PostgreSQL journal).
test_a_live_holder_is_not_taken_over_postgres = test_a_live_holder_is_not_taken_over
test_a_killed_holder_is_taken_over_at_once_postgres = test_a_killed_holder_is_taken_over_at_once
del test_a_live_holder_is_not_taken_over, test_a_killed_holder_is_taken_over_at_once

SOAK = bool(os.environ.get("CUADERNO_SOAK"))
RACES = [(2, a) for a in range(30 if SOAK else 10)] + [(10, a) for a in range(30 if SOAK else 0)]


@pytest.fixture
def world(tmp_path: Path, pg_schemas: list[str]) -> dict[str, Any]:  # noqa: F811
    from test_takeover import WORKLOAD

    pg_schemas.append(new_schema())
    (tmp_path / "takeover_workload.py").write_text(WORKLOAD)
    return {"dir": tmp_path, "db": schema_url(pg_schemas[-1]), "receipts": tmp_path / "receipts.jsonl",
            "billing": tmp_path / "billing.jsonl", "gate": tmp_path / "gate"}


@pytest.mark.parametrize(("racers", "attempt"), RACES)
def test_resumers_started_together_run_the_effect_once_postgres(world: dict[str, Any], racers: int,
                                                                attempt: int) -> None:
    race_resumers(world, racers, "PostgreSQL")
